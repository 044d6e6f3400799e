"""Hostile input straight into a worker's queue: nothing runs, one reason-coded line, no loop.

Each message goes into ``<exchange>_<topic>`` with kombu, as a broken or malicious peer would put
it there. For each one: nothing it asks for executes (a canary file the forbidden call would
create stays absent, and the task ledger shows no execution), the worker logs exactly one line
with a stable ``reason=`` code, the message is gone (no redelivery loop: the queue is empty and
the line is not repeated), and the worker still answers a normal request. Failure payloads are
data: a revert whose failure names importable callables runs the revert, and nothing named is
imported or built. A request delivered twice is applied once by the engine.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fault_support
import fault_tasks as ft
import pytest
from fault_support import WAIT, EngineRuns, Stage, take_one, wait_until
from wbe_harness import (
    Broker,
    ProtocolClient,
    WorkerFleet,
    queued_messages,
    request_body,
    unique_exchange,
)

from flowengine import engines, states
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf
from flowengine.worker_based import protocol as pr

pytestmark = pytest.mark.integration

TOPIC = "hostile"
STEP = f"{ft.__name__}.Step"


class _OpensCanary:
    """Unpickling this creates the canary file."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.canary), "w"))


def _step(**changes: Any) -> dict[str, Any]:
    return {**request_body(STEP, "hostile"), **changes}


def _raw(body: bytes | str, **publish: Any) -> Callable[[Path], dict[str, Any]]:
    return lambda _canary: {"body": body, **publish}


def _shell(task_cls: str) -> Callable[[Path], dict[str, Any]]:
    """A request for a callable the worker was not started with, arguments that would create
    the canary if it ever ran (``os.system(command)``, ``Popen(args)``)."""
    return lambda canary: {"body": request_body(task_cls, "pwn", {
        "command": f"touch {canary}", "args": ["touch", str(canary)]})}


def _failure(canary: Path, names: list[str]) -> dict[str, Any]:
    return {"exception_str": "boom", "traceback_str": "", "exc_type_names": names,
            "version": 1, "exc_args": [f"touch {canary}"], "causes": []}


#: Names a failure payload must never import or build (the canary module and class, callables).
IMPORTABLE = [f"{fault_support.__name__}.CanaryError", "os.system", "subprocess.Popen",
              "builtins.eval", "Exception"]


@dataclasses.dataclass(frozen=True)
class Hostile:
    build: Callable[[Path], dict[str, Any]]  # canary path -> ProtocolClient.publish kwargs
    reason: str  # regex for the code in the one "reason=" line


CASES: dict[str, Hostile] = {
    "pickle": Hostile(lambda canary: {"body": pickle.dumps(_OpensCanary(canary)),
                                      "content_type": "application/x-python-serialize",
                                      "content_encoding": "binary"}, "content-type"),
    "yaml": Hostile(lambda canary: {
        "body": f"!!python/object/apply:os.system ['touch {canary}']\n",
        "content_type": "application/x-yaml"}, "content-type"),
    # msgpack for {"task_cls": "fault_tasks.Step"} (a one-entry fixmap of two fixstrs).
    "msgpack": Hostile(_raw(b"\x81\xa8task_cls\xb0" + STEP.encode(),
                            content_type="application/x-msgpack", content_encoding="binary"),
                       "content-type"),
    "unknown-content-type": Hostile(_raw(json.dumps(_step()),
                                         content_type="application/x-evil"), "content-type"),
    "invalid-json": Hostile(_raw(json.dumps(_step())[:-7]), "decode-error"),
    "invalid-utf8": Hostile(_raw(json.dumps(_step()).encode().replace(b"hostile", b"\xff\xfe")),
                            "decode-error"),
    "nested-100": Hostile(_raw(json.dumps(_step(arguments={"x": json.loads("[" * 100 +
                                                                             "]" * 100)}))),
                          "too-deep"),
    "nested-200000": Hostile(_raw('{"x": ' + "[" * 200_000 + "]" * 200_000 + "}"),
                             "decode-error|too-deep"),
    "oversized-9MiB": Hostile(_raw(json.dumps(_step(arguments={"x": "a" * (9 << 20)}))),
                              "too-large"),
    "not-an-object": Hostile(_raw(json.dumps([STEP, "hostile"])), "invalid-format"),
    "missing-task-cls": Hostile(_raw(json.dumps({"task_name": "hostile", "action": "execute",
                                                 "task_version": [1, 0]})), "invalid-format"),
    "bad-action": Hostile(_raw(json.dumps(_step(action="explode"))), "invalid-format"),
    "arguments-not-an-object": Hostile(_raw(json.dumps(_step(arguments=["touch"]))),
                                       "invalid-format"),
    "failure-missing-fields": Hostile(_raw(json.dumps(_step(
        action="revert", result=["failure", {"exc_type_names": ["os.system"]}]))),
        "invalid-format"),
    "failure-rooted-in-a-callable": Hostile(lambda canary: {"body": _step(
        action="revert", result=["failure", _failure(canary, ["os.system"])])},
        "invalid-format"),
    "unknown-message-type": Hostile(_raw(json.dumps(_step()), type="BOGUS"), "unknown-type"),
    "response-to-a-worker": Hostile(_raw(json.dumps({"state": "SUCCESS", "data": {"result": 1}}),
                                         type=pr.RESPONSE), "unknown-type"),
    "missing-message-type": Hostile(_raw(json.dumps(_step()), type=None), "missing-type"),
}

#: Refused by the server after validation: nothing runs, but the log line has no reason code
#: (any code would do: the doc's list has none for these yet).
UNCODED: dict[str, Hostile] = {
    "class-os:system": Hostile(_shell("os:system"), r"\S+"),
    "class-os.system": Hostile(_shell("os.system"), r"\S+"),
    "class-subprocess:Popen": Hostile(_shell("subprocess:Popen"), r"\S+"),
    "class-subprocess.Popen": Hostile(_shell("subprocess.Popen"), r"\S+"),
    "missing-reply-to": Hostile(_raw(json.dumps(_step()), reply_to=None), r"\S+"),
    "missing-correlation-id": Hostile(_raw(json.dumps(_step()), correlation_id=None), r"\S+"),
}

#: Bytes of log one refused message may cost.
LOG_LINE_BOUND = 4096


class Target:
    """One worker process (one task thread) on one broker, and a client to poke it."""

    def __init__(self, broker: Broker, root: Path) -> None:
        self.stage = Stage.make(root)
        self.fleet = WorkerFleet(broker, unique_exchange("hostile"), root,
                                 env=self.stage.env)
        # One task thread and prefetch, so it settles each message before it takes the next:
        # once the probe after a message is answered, that message was dealt with.
        [self.worker] = self.fleet.start(TOPIC, [ft.__name__], threads=1)
        self.client = ProtocolClient(broker.url, self.fleet.exchange)
        self.queue = f"{self.fleet.exchange}_{TOPIC}"
        #: Ledger lines written before the current case (the ledger is shared by the module).
        self.seen = 0

    def log_size(self) -> int:
        return self.worker.log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        with open(self.worker.log_path, "rb") as log:
            log.seek(offset)
            return log.read().decode("utf-8", errors="replace")

    def still_serves(self) -> str:
        """A normal request sent now succeeds; its task's name."""
        assert self.worker.alive, self.worker.failure("died")
        probe = f"probe-{uuid.uuid4().hex[:8]}"
        sent = self.client.publish(TOPIC, request_body(STEP, probe))
        outcome = self.client.outcome(sent, WAIT)
        assert (outcome.state, outcome.body["data"]["result"]) == (pr.SUCCESS, probe), outcome
        return probe

    def close(self) -> None:
        self.client.close()
        self.fleet.stop_all()


@pytest.fixture(scope="module")
def target(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    made = Target(broker, tmp_path_factory.mktemp(f"hostile-{broker.name}"))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def fresh(target: Target) -> Target:
    target.seen = len(target.stage.ledger.lines())
    target.client.received.clear()
    return target


def _inject(target: Target, case: Hostile, canary: Path) -> tuple[str | None, str]:
    """Publish the case, wait for the probe after it; its correlation id and the new log."""
    offset = target.log_size()
    sent = target.client.publish(TOPIC, **case.build(canary))
    probe = target.still_serves()
    ran = [e["atom"] for e in target.stage.ledger.lines()[target.seen:]]
    assert ran == [probe, probe], f"something else ran: {ran}"
    return sent, target.log_since(offset)


def _refused_by_broker(target: Target, err: Exception) -> bool:
    """beanstalkd refuses a job over its ``max-job-size`` (64 KiB unless started with ``-z``)
    as it is published: such a message never reaches the worker, which must still serve."""
    if target.fleet.broker.name != "beanstalk" or "max-job-size" not in str(err):
        return False
    target.still_serves()
    return True


def _check_refused(target: Target, name: str, case: Hostile, canary: Path) -> str:
    try:
        sent, logged = _inject(target, case, canary)
    except Exception as err:
        if _refused_by_broker(target, err) and not canary.exists():
            return ""
        raise
    assert not canary.exists() and target.stage.canaries() == [], f"{name}: acted on"
    queued = queued_messages(target.fleet.broker.url, target.queue)
    assert queued in (0, None), f"{name}: {queued} still queued"
    # Nothing but (at most) a FAILURE ever answered it.
    replies = target.client.replies_to(sent) if sent else []
    assert {r.state for r in replies} <= {pr.FAILURE}, replies
    assert len(logged) < LOG_LINE_BOUND, f"{name}: {len(logged)} bytes of log"
    coded = re.findall(r"reason=(\S+)", logged)
    assert len(coded) == 1 and re.fullmatch(case.reason, coded[0]), f"{name}:\n{logged}"
    return logged


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_message_is_refused_once_with_a_reason_and_runs_nothing(
    fresh: Target, name: str, tmp_path: Path,
) -> None:  # fmt: skip
    _check_refused(fresh, name, CASES[name], tmp_path / "canary")


@pytest.mark.parametrize("name", [
    pytest.param(name) for name in sorted(UNCODED)])
def test_refused_request_is_logged_with_a_reason_and_runs_nothing(
    fresh: Target, name: str, tmp_path: Path,
) -> None:  # fmt: skip
    _check_refused(fresh, name, UNCODED[name], tmp_path / "canary")


def test_a_huge_unknown_task_class_name_costs_a_bounded_log_line(
    fresh: Target, tmp_path: Path,
) -> None:  # fmt: skip
    name = "os.system" + "x" * (1 << 20)
    try:
        _sent, logged = _inject(fresh, Hostile(_shell(name), r"\S+"), tmp_path / "canary")
    except Exception as err:
        if _refused_by_broker(fresh, err):
            return
        raise
    assert queued_messages(fresh.fleet.broker.url, fresh.queue) in (0, None)
    assert len(logged) < LOG_LINE_BOUND, f"{len(logged)} bytes of log for one refusal"


def test_a_failure_payload_naming_importable_types_stays_data(
    fresh: Target, tmp_path: Path,
) -> None:  # fmt: skip
    canary = fresh.stage.canary  # the name the workers' import canary watches
    failure = _failure(canary, IMPORTABLE)
    offset = fresh.log_size()
    sent = fresh.client.publish(TOPIC, _step(
        task_name="reverted", action="revert", result=["failure", failure],
        failures={"reverted": failure, "other": _failure(canary, IMPORTABLE[:1] + ["Exception"])}))
    outcome = fresh.client.outcome(sent, WAIT)
    assert outcome.state == pr.SUCCESS, outcome
    assert [e["event"] for e in fresh.stage.ledger.events("reverted")] == \
        [ft.REVERT_START, ft.REVERT_END]
    assert fresh.stage.canaries() == [], "a type named in a failure was imported or built"
    assert "reason=" not in fresh.log_since(offset)
    fresh.still_serves()


# ---- the same request twice ----------------------------------------------------------------------


def test_a_request_delivered_twice_is_applied_once(
    broker: Broker, exchange: str, fleet_factory: Any, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.INFO, logger="flowengine.worker_based")
    stage = Stage.make(tmp_path / "stage")
    fleet: WorkerFleet = fleet_factory(broker, exchange, env=stage.env)
    fleet.start(TOPIC, [ft.__name__], threads=1)
    flow = lf.Flow("twice").add(
        uf.Flow("pair").add(ft.Gate("g1", provides="r1"), ft.Gate("g2", provides="r2")),
        ft.Use("u1", rebind={"value": "r1"}),
        ft.Use("u2", rebind={"value": "r2"}),
    )
    # No topics: discovery by broadcast, so the topic queue holds requests only.
    engine = engines.load(flow, engine="worker-based", **fleet.engine_options(
        TOPIC, topics=[], transition_timeout=WAIT))
    runs = EngineRuns()
    try:
        run = runs.start(engine)
        first = wait_until(lambda: stage.ledger.lines(), WAIT, "a gate starting")[0]["atom"]
        # The other request waits behind it (one task thread): deliver it twice instead.
        taken = take_one(broker.url, f"{exchange}_{TOPIC}")
        body = json.loads(taken.body)
        other = body["task_name"]
        assert {first, other} == {"g1", "g2"}
        client = ProtocolClient(broker.url, exchange)
        try:
            for _ in range(2):
                client.publish(TOPIC, taken.body, reply_to=taken.properties["reply_to"],
                               correlation_id=taken.properties["correlation_id"],
                               headers=taken.headers)
        finally:
            client.close()
        stage.gates.open(first)
        stage.gates.open(other)
        assert run.join(WAIT) is None
    finally:
        runs.close()
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert len(stage.ledger.ends(other)) == 2, stage.ledger.dump()  # it did run twice
    for gate, use in (("g1", "u1"), ("g2", "u2")):
        assert [e["value"] for e in stage.ledger.ends(use)] == [engine.storage.fetch(f"r{gate[1]}")]
    ignored = [r.getMessage() for r in caplog.records
               if re.search(r"Ignoring SUCCESS reply .*" + taken.properties["correlation_id"],
                            r.getMessage())]
    assert len(ignored) == 1, ignored
