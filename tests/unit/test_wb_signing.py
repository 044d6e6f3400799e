"""Message authentication: signatures, the replay window, key loading, and refusals on the wire.

Unit checks on :mod:`flowengine.worker_based.signing`, then over kombu's memory transport: an
executor (the engine's side) against a scripted worker and a forger publishing on the same
broker, and a real Worker against hand-made requests.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wb_lease_tasks import Slow  # tests/unit is on sys.path
from wb_requester import TOPIC, WAIT, run_in_thread

from flowengine import task
from flowengine.engines.executor import EXECUTED
from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import client as bc
from flowengine.worker_based import dead_letters
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import signing as sg
from flowengine.worker_based import worker as wk
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.broker.delivery import Delivery
from flowengine.worker_based.dead_letters import DeadLetters
from flowengine.worker_based.executor import WorkerTaskExecutor
from flowengine.worker_based.options import WorkerEngineOptions

KEY = "correct horse battery staple"
OTHER_KEY = "another key, just as long"


@pytest.fixture(autouse=True)
def _no_key_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sg.ENV_KEY, raising=False)


def signing(key: str | None = KEY, **kwargs: Any) -> sg.Signing:
    return sg.Signing(key.encode() if key else None, **kwargs)


def message(body: bytes = b'{"a": 1}', headers: dict[str, Any] | None = None,
            **properties: Any) -> Any:
    props = {"type": pr.RESPONSE, "correlation_id": "c1", **properties}
    return Delivery(raw_body=body, headers=dict(headers or {}), properties=props)


def signed(signer: sg.Signing, body: bytes = b'{"a": 1}', **headers: Any) -> Any:
    props = {"type": pr.RESPONSE, "correlation_id": "c1"}
    return message(body, signer.sign(body, props, {pr.HEADER_WORKER: "w1", **headers}))


# ---- signatures ----------------------------------------------------------------------------------
def test_a_signed_message_passes_and_any_change_breaks_it() -> None:
    signer = signing()
    assert signer.check(signed(signer)) is None
    tampered = [signed(signer), signed(signer), signed(signer), signed(signer)]
    tampered[0] = dataclasses.replace(tampered[0], raw_body=b'{"a": 2}')
    tampered[1].headers[pr.HEADER_WORKER] = "w2"
    tampered[2].properties["correlation_id"] = "c2"
    tampered[3].properties["reply_to"] = "elsewhere"
    for forged in tampered:
        assert signer.check(forged)[0] == sg.REASON_BAD_SIGNATURE  # type: ignore[index]
    assert signing(OTHER_KEY).check(signed(signer))[0] == sg.REASON_BAD_SIGNATURE  # type: ignore[index]


def test_unsigned_stale_and_unexpected_signatures_are_refused() -> None:
    now = [1000.0]
    signer = signing(clock=lambda: now[0], window=60.0)
    assert signer.check(message())[0] == sg.REASON_UNSIGNED  # type: ignore[index]
    old = signed(signer)
    now[0] += 61.0
    assert signer.check(old)[0] == sg.REASON_STALE  # type: ignore[index]
    future = signed(signer)
    now[0] -= 61.0
    assert signer.check(future)[0] == sg.REASON_STALE  # type: ignore[index]
    bad_time = signed(signer)
    bad_time.headers[sg.HEADER_SIGNED_AT] = "yesterday"
    assert signer.check(bad_time)[0] == sg.REASON_BAD_SIGNATURE  # type: ignore[index]
    # A peer without a key refuses signed messages: a half-keyed fleet fails loudly.
    refusal = signing(None).check(signed(signer))
    assert refusal is not None and refusal[0] == sg.REASON_UNEXPECTED and sg.ENV_KEY in refusal[1]
    assert signing(None).check(message()) is None


def test_refusals_are_logged_once_per_sender_and_minute_without_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    signer = signing(monotonic=lambda: now[0])
    forger = signing(OTHER_KEY)
    with caplog.at_level(logging.WARNING, logger=sg.__name__):
        for _ in range(5):
            signer.check(signed(forger))
        signer.check(signed(forger, **{pr.HEADER_WORKER: "w9"}))
        now[0] += sg.LOG_PERIOD
        signer.check(signed(forger))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "from w1: reason=bad-signature" in lines[0] and "from w9" in lines[1]
    assert "4 more refused" in lines[2]
    assert not any(KEY in line or OTHER_KEY in line or "v1:" in line for line in lines)


def test_capacity_claims_are_capped() -> None:
    headers: dict[str, Any] = {pr.HEADER_CAPACITY: 10_000}
    sg.clamp_capacity(headers)
    assert headers[pr.HEADER_CAPACITY] == sg.MAX_PLAUSIBLE_CAPACITY
    for bad in (-1, "many", 2.5):
        headers = {pr.HEADER_CAPACITY: bad}
        sg.clamp_capacity(headers)
        assert pr.HEADER_CAPACITY not in headers
    headers = {pr.HEADER_CAPACITY: 4}
    sg.clamp_capacity(headers)
    assert headers[pr.HEADER_CAPACITY] == 4


# ---- keys ----------------------------------------------------------------------------------------
def test_keys_come_from_the_option_a_file_or_the_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    assert sg.load_key(KEY) == KEY.encode()
    assert sg.load_key(signing_key_file=str(key_file)) == KEY.encode()
    assert sg.load_key(environ={sg.ENV_KEY: KEY}) == KEY.encode()
    assert sg.load_key(environ={}) is None


@pytest.mark.parametrize("kwargs, error", [
    ({"signing_key": KEY, "signing_key_file": "f"}, "not both"),
    ({"signing_key": "short"}, "too short"),
    ({"signing_key_file": "/nonexistent/key"}, "Cannot read signing key file '/nonexistent/key'"),
])
def test_bad_keys_are_named_never_shown(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error) as raised:
        sg.load_key(**kwargs)
    assert "short" not in str(raised.value).replace("too short", "")


def test_the_key_never_shows_in_reprs_or_option_errors() -> None:
    assert KEY not in repr(signing()) and KEY not in repr(WorkerEngineOptions(signing_key=KEY))
    with pytest.raises(ValueError, match="'signing_key' must be a non-empty string"):
        WorkerEngineOptions.from_mapping({"signing_key": 12345})
    options = WorkerEngineOptions.from_mapping({"signing_key": KEY})
    assert options.signing_key == KEY  # handed to the executor as it is


def test_a_key_with_taskflow_compat_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="taskflow_compat"):
        WorkerTaskExecutor("x", "x", ["t"], transport="memory", taskflow_compat=True,
                           signing_key=KEY)


# ---- replies from the attempt's holder only ------------------------------------------------------
def test_a_reply_is_taken_only_from_the_worker_that_said_running() -> None:
    success = {"state": pr.SUCCESS, "data": {"result": 1}}
    assert sg.foreign_sender(None, "c1", {pr.HEADER_WORKER: "w2"}, success) is None
    assert sg.foreign_sender(("c1", "w1"), "c1", {pr.HEADER_WORKER: "w1"}, success) is None
    assert sg.foreign_sender(("c0", "w1"), "c1", {pr.HEADER_WORKER: "w2"}, success) is None
    assert sg.foreign_sender(("c1", None), "c1", {}, success) is None  # a TaskFlow holder
    why = sg.foreign_sender(("c1", "w1"), "c1", {pr.HEADER_WORKER: "w2"}, success)
    assert why is not None and "w1" in why and "w2" in why
    assert sg.foreign_sender(("c1", "w1"), "c1", {}, success) is not None
    handed_back = {"state": pr.EVENT, "data": {"event_type": ext.EVENT_REDELIVERED,
                                              "details": {"worker": "w2"}}}
    assert sg.foreign_sender(("c1", "w1"), "c1", {pr.HEADER_WORKER: "w2"}, handed_back) is None


# ---- on the wire: the engine's side --------------------------------------------------------------
class Scripted:
    """A worker of topic ``scripted`` (identity w1) that replies only when told to."""

    def __init__(self, exchange: str, signer: sg.Signing | None, transport: dict[str, Any]
                 ) -> None:
        self.requests: queue.Queue[Any] = queue.Queue()
        self.proxy = px.Proxy("scripted", exchange, {
            pr.REQUEST: dp.Handler(lambda _data, msg: self.requests.put(msg)),
            pr.NOTIFY: dp.Handler(self._on_notify)}, signing=signer, **transport)
        self.thread = run_in_thread(self.proxy.start)
        assert self.proxy.wait(WAIT)

    headers = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION, pr.HEADER_WORKER: "w1",
               pr.HEADER_CAPACITY: 1}

    def _on_notify(self, _data: Any, msg: Any) -> None:
        self.proxy.publish(pr.Notify(topic="scripted", tasks=[pr.task_class_name(Slow())]),
                           msg.properties["reply_to"], headers=self.headers)

    def reply(self, request: Any, state: str, via: px.Proxy | None = None,
              worker: str = "w1", **data: Any) -> None:
        (via or self.proxy).publish(
            pr.Response(state, **data), request.properties["reply_to"],
            correlation_id=request.properties["correlation_id"],
            headers={**self.headers, pr.HEADER_WORKER: worker})

    def close(self) -> None:
        self.proxy.stop()
        self.thread.join(WAIT)


def make_executor(exchange: str, transport: dict[str, Any], **kwargs: Any
                  ) -> WorkerTaskExecutor:
    executor = WorkerTaskExecutor(uuid.uuid4().hex, exchange, ["scripted"],
                                  transition_timeout=30.0, **transport, **kwargs)
    executor.start()
    return executor


MEMORY = {"transport": "memory"}


@pytest.fixture
def wire(exchange: str) -> Iterator[Any]:
    """Makes (scripted worker, executor, forger) on one broker; closes them after the test."""
    made: list[Any] = []

    def make(worker_key: str | None, engine_key: str | None, forger_key: str | None = None,
             transport: dict[str, Any] = MEMORY
             ) -> tuple[Scripted, WorkerTaskExecutor, px.Proxy]:
        worker = Scripted(exchange, signing(worker_key), transport)
        executor = make_executor(exchange, transport, signing_key=engine_key)
        forger = px.Proxy("forger", exchange, signing=signing(forger_key) if forger_key else None,
                          **transport)
        made.extend([worker, executor, forger])
        return worker, executor, forger

    yield make
    for thing in reversed(made):
        thing.stop() if isinstance(thing, WorkerTaskExecutor) else thing.close()
    # Process-wide clients linger after their last engine; later tests want a quiet broker.
    bc.close_all()


def announce(via: px.Proxy, worker: str, capacity: int) -> None:
    via.publish(pr.Notify(topic="scripted", tasks=[pr.task_class_name(Slow())]),
                pr.DISCOVERY_ROUTING_KEY, declare_queue=False,
                headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION, pr.HEADER_WORKER: worker,
                         pr.HEADER_CAPACITY: capacity})


def eventually(condition: Any) -> bool:
    pause = threading.Event()
    for _ in range(500):
        if condition():
            return True
        pause.wait(0.01)
    return bool(condition())


def refusal_logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return eventually(lambda: any(text in r.getMessage() for r in caplog.records))


def run_forged(worker: Scripted, executor: WorkerTaskExecutor, forger: px.Proxy,
               forged_by: str = "w1") -> Any:
    """Start an attempt, forge its outcome, then send the real one; return what was applied."""
    future = executor.execute_task(Slow(name="victim"), "atom-1", {})
    request = worker.requests.get(timeout=WAIT)
    worker.reply(request, pr.RUNNING)
    worker.reply(request, pr.SUCCESS, via=forger, worker=forged_by, result="forged")
    worker.reply(request, pr.SUCCESS, result="real")
    return future.result(timeout=WAIT)


@pytest.mark.parametrize("forger_key, reason", [(None, "reason=unsigned"),
                                                (OTHER_KEY, "reason=bad-signature")])
def test_with_a_key_forged_replies_are_refused(
    wire: Any, caplog: pytest.LogCaptureFixture, forger_key: str | None, reason: str
) -> None:
    worker, executor, forger = wire(KEY, KEY, forger_key)
    with caplog.at_level(logging.WARNING):
        assert run_forged(worker, executor, forger) == (EXECUTED, "real")
    assert refusal_logged(caplog, f"Refused RESPONSE message from w1: {reason}")


def test_with_a_key_forged_replies_are_refused_on_a_real_broker(
    wire: Any, caplog: pytest.LogCaptureFixture, redis_url: str
) -> None:
    worker, executor, forger = wire(KEY, KEY, OTHER_KEY, transport={"url": redis_url})
    with caplog.at_level(logging.WARNING):
        assert run_forged(worker, executor, forger) == (EXECUTED, "real")
    assert refusal_logged(caplog, "Refused RESPONSE message from w1: reason=bad-signature")


def test_with_a_key_forged_announcements_are_refused(
    wire: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _worker, executor, forger = wire(KEY, KEY)
    with caplog.at_level(logging.WARNING):
        announce(forger, "evil", 10_000)
        assert refusal_logged(caplog, "Refused NOTIFY message from evil: reason=unsigned")
    assert executor.finder.get("evil") is None


def test_without_a_key_a_reply_from_another_worker_is_ignored(
    wire: Any, caplog: pytest.LogCaptureFixture
) -> None:
    worker, executor, forger = wire(None, None)
    with caplog.at_level(logging.WARNING):
        assert run_forged(worker, executor, forger, forged_by="w2") == (EXECUTED, "real")
    assert refusal_logged(caplog, "reason=wrong-sender the attempt runs on worker w1; "
                                  "the reply claims w2")


def test_without_a_key_announced_capacity_is_capped(wire: Any) -> None:
    _worker, executor, forger = wire(None, None)
    announce(forger, "greedy", 10_000)
    assert eventually(lambda: executor.finder.get("greedy") is not None)
    greedy = executor.finder.get("greedy")
    assert greedy is not None and greedy.capacity == sg.MAX_PLAUSIBLE_CAPACITY


def test_a_fleet_with_and_without_keys_fails_loudly(
    wire: Any, caplog: pytest.LogCaptureFixture
) -> None:
    worker, executor, _forger = wire(None, KEY)
    with caplog.at_level(logging.WARNING):
        # The keyless worker refuses the keyed engine's (signed) discovery...
        executor.execute_task(Slow(name="never-sent"), "atom-1", {})
        assert refusal_logged(caplog, f"Refused NOTIFY message from {pr.origin()}: "
                                      "reason=unexpected-signature its sender signs messages "
                                      "but this peer has no signing key")
        # ...and the keyed engine refuses the keyless worker's announcements.
        announce(worker.proxy, "w1", 1)
        assert refusal_logged(caplog, "Refused NOTIFY message from w1: reason=unsigned this "
                                      "peer has a signing key")
    assert executor.finder.get("w1") is None and worker.requests.empty()


# ---- on the wire: the worker's side --------------------------------------------------------------
RUNS: list[str] = []


class Counted(task.Task):
    def execute(self) -> str:
        RUNS.append(self.name)
        return "ran"


@pytest.fixture
def keyed_worker(exchange: str) -> Iterator[wk.Worker]:
    RUNS.clear()
    worker = wk.Worker(exchange, TOPIC, [Counted], threads_count=1, transport="memory",
                       events=False, signing_key=KEY)
    thread = run_in_thread(functools.partial(worker.run, display_banner=False))
    assert worker.wait(WAIT)
    yield worker
    worker.stop(grace=WAIT)
    thread.join(WAIT)


def test_a_keyed_worker_runs_only_signed_requests(
    exchange: str, keyed_worker: wk.Worker, caplog: pytest.LogCaptureFixture
) -> None:
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    reply_key = uuid.uuid4().hex
    inbox = px.Proxy(reply_key, exchange, {
        pr.RESPONSE: dp.Handler(lambda data, msg: replies.put((data, msg)))},
        transport="memory", signing=signing())
    thread = run_in_thread(inbox.start)
    assert inbox.wait(WAIT)
    senders = {None: px.Proxy("s0", exchange, transport="memory"),
               OTHER_KEY: px.Proxy("s1", exchange, transport="memory",
                                   signing=signing(OTHER_KEY)),
               KEY: px.Proxy("s2", exchange, transport="memory", signing=signing())}
    try:
        with caplog.at_level(logging.WARNING):
            for key, sender in senders.items():
                request = pr.Request(Counted(name=f"from-{key}"), uuid.uuid4().hex, pr.EXECUTE,
                                     {})
                sender.publish(request, TOPIC, reply_to=reply_key,
                               correlation_id=request.uuid,
                               headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION})
            states = []
            while not states or states[-1] != pr.SUCCESS:
                data, msg = replies.get(timeout=WAIT)
                states.append(data["state"])
                assert msg.headers[sg.HEADER_SIGNATURE].startswith("v1:")
        assert RUNS == [f"from-{KEY}"], "forged requests never run"
        assert refusal_logged(caplog, "Refused REQUEST message from ")
        text = caplog.text
        assert "reason=unsigned" in text and "reason=bad-signature" in text
    finally:
        for sender in senders.values():
            sender.close()
        inbox.stop()
        thread.join(WAIT)


def test_a_requeued_dead_letter_is_signed_afresh(exchange: str, keyed_worker: wk.Worker) -> None:
    parker = px.Proxy("parker", exchange, transport="memory", signing=signing())
    letters = DeadLetters(exchange, transport="memory", signing=signing())
    try:
        request = pr.Request(Counted(name="parked"), uuid.uuid4().hex, pr.EXECUTE, {})
        dead_letters.park(parker, request, {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION,
                                            pr.HEADER_REQUEST_ID: request.request_id},
                          "lost", TOPIC, ["w0"], "nobody")
        letters.requeue(request.request_id)
        assert eventually(lambda: RUNS == ["parked"]), "the worker ran the requeued request"
    finally:
        letters.close()
        parker.close()


def test_a_keyed_worker_ignores_forged_cancellations(
    exchange: str, keyed_worker: wk.Worker, caplog: pytest.LogCaptureFixture
) -> None:
    request = pr.Request(Counted(name="wanted"), uuid.uuid4().hex, pr.EXECUTE, {})
    protocol = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION}
    forger = px.Proxy("forger", exchange, transport="memory")
    sender = px.Proxy("sender", exchange, transport="memory", signing=signing())
    try:
        with caplog.at_level(logging.WARNING):
            forger.publish(cn.Cancel([request.request_id]), ext.DISCOVER_ROUTING_KEY,
                           declare_queue=False, headers=protocol)
            assert refusal_logged(caplog, f"Refused {cn.CANCEL} message from unknown sender: "
                                          "reason=unsigned")
        sender.publish(request, TOPIC, reply_to="nobody", correlation_id=request.request_id,
                       headers={**protocol, pr.HEADER_REQUEST_ID: request.request_id})
        assert eventually(lambda: RUNS == ["wanted"]), "a forged CANCEL revokes nothing"
    finally:
        forger.close()
        sender.close()
