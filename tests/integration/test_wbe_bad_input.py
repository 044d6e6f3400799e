"""Whatever lands in a worker's queue, the worker runs nothing it should not and keeps serving.

Messages are published straight into ``<exchange>_<topic>`` with kombu, as a broken or hostile
peer would. For each one: no task runs (the ledger stays empty; payloads that would create a
marker file if they were ever decoded or imported leave none), the worker process is still
alive, and a normal request sent right after it succeeds. When the message carries a
``reply_to``, the sender must also get a FAILURE that says why, rather than silence.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from behaviour import tasks
from fault_support import EngineRun
from wbe_harness import (
    Broker,
    ProtocolClient,
    Received,
    WorkerFleet,
    request_body,
    require_broker,
    unique_exchange,
)

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.flows import linear_flow as lf
from flowengine.worker_based import protocol as pr

pytestmark = pytest.mark.integration

TOPIC = "guarded"
STEP = f"{tasks.__name__}.Step"
#: Seconds to wait for a reply that should come.
REPLY_TIMEOUT = 15.0


class _CreatesMarker:
    """Unpickling this opens (creates) the marker file: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


@dataclasses.dataclass(frozen=True)
class Bad:
    """A message no worker should act on, and what its FAILURE reply should say."""

    build: Callable[[Path], dict[str, Any]]  # marker path -> ProtocolClient.publish kwargs
    why: str  # regex the FAILURE's exception_str must match
    answerable: bool = True  # it names a reply_to and a correlation_id


def _raw(body: bytes | str, **kwargs: Any) -> Callable[[Path], dict[str, Any]]:
    return lambda _marker: {"body": body, **kwargs}


def _step_json(**changes: Any) -> bytes:
    return json.dumps({**request_body(STEP, "step"), **changes}).encode()


def _shell(task_cls: str) -> Callable[[Path], dict[str, Any]]:
    return lambda marker: {"body": request_body(task_cls, "pwn", {
        "command": f"touch {marker}", "args": ["touch", str(marker)], "file": str(marker)})}


BAD = {
    "malformed-json": Bad(_raw(_step_json()[:-9]), "reason=decode-error"),
    "invalid-utf8": Bad(_raw(_step_json(task_name="step").replace(b'"step"', b'"\xff\xfe"')),
                        "reason=decode-error .*utf-8"),
    "pickle": Bad(lambda marker: {"body": pickle.dumps(_CreatesMarker(marker)),
                                  "content_type": "application/x-python-serialize",
                                  "content_encoding": "binary"},
                  "reason=content-type 'application/x-python-serialize'"),
    "yaml": Bad(lambda marker: {
        "body": f"!!python/object/apply:builtins.open ['{marker}', 'w']\n",
        "content_type": "application/x-yaml"}, "reason=content-type 'application/x-yaml'"),
    "schema-bad-action": Bad(_raw(_step_json(action="explode")),
                             "reason=invalid-format .*'explode'"),
    "schema-missing-fields": Bad(_raw(json.dumps({"task_name": "step"})),
                                 "reason=invalid-format .*'task_cls'"),
    "schema-bad-failure": Bad(_raw(_step_json(action="revert", result=["failure", {"x": 1}])),
                              "reason=invalid-format .*'exception_str'"),
    "too-deep": Bad(_raw(_step_json(arguments={"x": json.loads("[" * 100 + "]" * 100)})),
                    "reason=too-deep"),
    "unknown-type": Bad(_raw(_step_json(), type="BOGUS"), "BOGUS"),
    "missing-type": Bad(_raw(_step_json(), type=None), "type"),
    "class-os.system": Bad(_shell("os.system"), "os.system.*not one of"),
    "class-os:system": Bad(_shell("os:system"), "os:system.*not one of"),
    "class-subprocess.Popen": Bad(_shell("subprocess.Popen"), "subprocess.Popen.*not one of"),
    "class-subprocess:Popen": Bad(_shell("subprocess:Popen"), "subprocess:Popen.*not one of"),
    # Without both there is nobody to answer: a reply without a correlation id matches no
    # request of any engine (TaskFlow's or ours), so these are only dropped.
    "missing-reply-to": Bad(_raw(_step_json(), reply_to=None), "", answerable=False),
    "missing-correlation-id": Bad(_raw(_step_json(), correlation_id=None), "",
                                  answerable=False),
}
#: Refusals the worker does not answer although they name a reply_to and a correlation_id.

class Guarded:
    """One worker process on one broker, the ledger it writes, and a client to poke it."""

    def __init__(self, broker: Broker, state_dir: Path) -> None:
        self.ledger = tasks.FileLedger(state_dir / "ledger.jsonl")
        self.fleet = WorkerFleet(broker, unique_exchange("guarded"), state_dir,
                                 env={tasks.LEDGER_ENV: str(self.ledger.path)})
        # One task thread, so one message at a time: whatever the worker does with a message
        # (answer included) is done before it takes the next one, the probe.
        [self.worker] = self.fleet.start(TOPIC, [tasks.__name__], threads=1)
        self.client = ProtocolClient(broker.url, self.fleet.exchange)

    def still_serves(self) -> None:
        """A normal request sent after the bad one succeeds."""
        assert self.worker.alive, self.worker.failure("died")
        sent = self.client.publish(TOPIC, request_body(f"{tasks.__name__}.Add", "probe",
                                                       {"x": 2, "y": 3}))
        outcome = self.client.outcome(sent, REPLY_TIMEOUT)
        assert (outcome.state, outcome.body["data"]["result"]) == (pr.SUCCESS, 5), outcome

    def close(self) -> None:
        self.client.close()
        self.fleet.stop_all()


@pytest.fixture(scope="module")
def guarded(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    state = Guarded(broker, tmp_path_factory.mktemp(f"guarded-{broker.name}"))
    try:
        yield state
    finally:
        state.close()


@pytest.fixture
def worker(guarded: Guarded) -> Guarded:
    guarded.ledger.clear()
    guarded.client.received.clear()
    return guarded


def _failure_of(reply: Received) -> dict[str, Any]:
    assert reply.type == pr.RESPONSE and reply.state == pr.FAILURE, reply
    return reply.body["data"]["result"]


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_message_runs_nothing_and_the_worker_keeps_serving(
    worker: Guarded, case: str, tmp_path: Path,
) -> None:  # fmt: skip
    marker = tmp_path / f"marker-{uuid.uuid4().hex}"
    sent = worker.client.publish(TOPIC, **BAD[case].build(marker))
    worker.still_serves()
    assert [line["atom"] for line in worker.ledger.lines()] == ["probe"]
    assert not marker.exists(), f"{case}: the payload was acted on"
    # Nothing but (at most) a FAILURE ever answers it.
    replies = worker.client.replies_to(sent) if sent else []
    assert {r.state for r in replies} <= {pr.FAILURE}, replies


@pytest.mark.parametrize("case", [
    pytest.param(case) for case in sorted(BAD) if BAD[case].answerable])
def test_bad_message_with_reply_to_gets_a_failure_saying_why(
    worker: Guarded, case: str, tmp_path: Path,
) -> None:  # fmt: skip
    marker = tmp_path / f"marker-{uuid.uuid4().hex}"
    sent = worker.client.publish(TOPIC, **BAD[case].build(marker))
    worker.still_serves()  # one message at a time: any answer to the bad one is in by now
    replies = worker.client.replies_to(sent)
    assert replies, f"{case}: no reply at all"
    failure = _failure_of(replies[-1])
    assert re.search(BAD[case].why, failure["exception_str"], re.IGNORECASE), failure


@pytest.mark.parametrize(("task", "why"), [
    ("Unsendable", r"Unsendable\) SUCCESS reply cannot be sent: .*not JSON"),
    ("UnsendableError", r"unsendable failed"),
])
def test_an_outcome_the_wire_cannot_carry_becomes_a_failure(worker: Guarded, task: str,
                                                             why: str) -> None:
    sent = worker.client.publish(TOPIC, request_body(f"{tasks.__name__}.{task}", "unsendable"))
    failure = _failure_of(worker.client.outcome(sent, REPLY_TIMEOUT))
    assert re.search(why, failure["exception_str"]), failure
    assert failure["exc_type_names"], failure
    worker.still_serves()
    assert [line["atom"] for line in worker.ledger.lines()] == ["unsendable", "probe"]


def test_an_engine_gets_the_failure_and_reverts(worker: Guarded) -> None:
    flow = lf.Flow("f").add(tasks.Step("before"), tasks.Unsendable("unsendable"))
    previous = tasks.use_ledger(worker.ledger)
    try:
        engine = engines.load(flow, engine="worker-based", **worker.fleet.engine_options(
            TOPIC, transition_timeout=REPLY_TIMEOUT))
        with pytest.raises(exc.WrappedFailure, match="reply cannot be sent") as caught:
            engine.run()
        assert [f.exception_str for f in caught.value][0].startswith("Task 'unsendable'")
        assert tasks.names("revert") == ["unsendable", "before"]
        assert engine.storage.get_flow_state() == states.REVERTED
    finally:
        tasks.use_ledger(previous)
    worker.still_serves()


# ---- raw garbage under kombu's framing (a Redis list holds bare strings anyone can push) --------


def _push_raw(redis_url: str, queue: str, payload: bytes) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        client.lpush(queue, payload)
    finally:
        client.close()


@pytest.mark.parametrize("payload", [b"garbage", b'{"truncated": ', b"\xff\xfe\x00"])
def test_garbage_in_a_redis_topic_queue_does_not_kill_the_worker(
    tmp_path: Path, payload: bytes,
) -> None:  # fmt: skip
    state = Guarded(require_broker("redis"), tmp_path)
    try:
        _push_raw(state.fleet.broker.url, f"{state.fleet.exchange}_{TOPIC}", payload)
        state.still_serves()
        state.still_serves()  # and again: the consumer was not restarted into a bad state
        assert [line["atom"] for line in state.ledger.lines()] == ["probe", "probe"]
    finally:
        state.close()


def test_garbage_in_a_redis_reply_queue_does_not_stop_the_engine(tmp_path: Path) -> None:
    state = Guarded(require_broker("redis"), tmp_path)
    previous = tasks.use_ledger(state.ledger)
    try:
        flow = lf.Flow("f").add(tasks.Step("a"), tasks.Step("b"))
        engine = engines.load(flow, engine="worker-based", **state.fleet.engine_options(
            TOPIC, transition_timeout=REPLY_TIMEOUT))
        # The engine's reply queue is <exchange>_<flow detail uuid>; the garbage is the first
        # thing its consumer reads.
        _push_raw(state.fleet.broker.url, f"{state.fleet.exchange}_{engine.storage.flow_uuid}",
                  b"garbage")
        run = EngineRun(engine)
        assert run.join(REPLY_TIMEOUT) is None
        assert engine.storage.get_flow_state() == states.SUCCESS
        assert tasks.names("execute") == ["a", "b"]
    finally:
        tasks.use_ledger(previous)
        state.close()


# ---- credentials the broker refuses ----------------------------------------------------------


@pytest.mark.parametrize("broker_name", ["redis", "rabbitmq"])
def test_an_engine_whose_login_is_refused_fails_at_once_saying_so(broker_name: str) -> None:
    url = require_broker(broker_name).url
    host = url.split("@")[-1] if "@" in url else url.split("//", 1)[1]
    scheme = url.split("://", 1)[0]
    wrong = f"{scheme}://nobody:not-the-password@{host}"
    flow = lf.Flow("f").add(tasks.Step("a"))
    engine = engines.load(flow, engine="worker-based", url=wrong, exchange=unique_exchange("x"),
                          topics=[TOPIC], transition_timeout=REPLY_TIMEOUT)
    with pytest.raises(exc.ExecutionFailure, match="refused by the broker") as raised:
        engine.run()
    assert "not-the-password" not in str(raised.value)
