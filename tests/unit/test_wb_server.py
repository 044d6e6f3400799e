"""A real worker (Worker -> Server -> Proxy) driven by a hand-written requester.

Every test runs over kombu's ``memory`` transport and over flowengine's filesystem transport. The
requester plays the engine: it owns a reply queue (also bound to the discovery key), publishes
REQUEST/NOTIFY messages and waits on queues with timeouts; nothing sleeps to synchronise.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import json
import logging
import queue
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import futurist
import kombu
import pytest
import taskflow.engines
from taskflow import task as tf_task
from taskflow.engines.worker_based import protocol as tf_protocol
from taskflow.patterns import linear_flow as tf_linear_flow
from wb_requester import TOPIC, WAIT, Requester, run_in_thread  # tests/unit is on sys.path

from flowengine import task
from flowengine.types.failure import Failure
from flowengine.worker_based import backoff as bo
from flowengine.worker_based import endpoint as ep
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import server as sv
from flowengine.worker_based import worker as wk
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.wire import versions as vs


class VolumeError(RuntimeError):
    pass


class Add(task.Task):
    def execute(self, x: int, y: int) -> int:
        self.update_progress(0.5)
        return x + y


class Explode(task.Task):
    def execute(self) -> None:
        raise VolumeError("no space left", 42)


class ReturnsObject(task.Task):
    def execute(self) -> Any:
        return object()


class Undo(task.Task):
    def execute(self) -> None:
        pass

    def revert(self, result: Any, flow_failures: dict[str, Failure], **kwargs: Any) -> Any:
        return {"result": str(result), "failures": sorted(flow_failures), "kwargs": kwargs}


GATE = threading.Event()
RUNS: list[str] = []


class Gated(task.Task):
    def execute(self) -> str:
        RUNS.append(self.name)
        assert GATE.wait(WAIT), "test never opened the gate"
        return "through"


REVERTS: list[tuple[Any, list[str]]] = []


class Multiply(task.Task):
    def execute(self, a: int, b: int) -> int:
        return a * b

    def revert(self, result: Any, flow_failures: dict[str, Failure], **kwargs: Any) -> None:
        REVERTS.append((result, sorted(flow_failures)))


class Fail(task.Task):
    def execute(self) -> None:
        raise RuntimeError("remote boom")


class TaskFlowMultiply(tf_task.Task):
    """What a TaskFlow program defines; it only ever runs on the flowengine worker."""

    default_provides = "product"

    def execute(self, a: int, b: int) -> int:
        raise AssertionError("a TaskFlow engine must run this remotely")


class TaskFlowFail(tf_task.Task):
    def execute(self) -> None:
        raise AssertionError("a TaskFlow engine must run this remotely")


# Both sides must use the same wire name, module.Class, as two programs sharing a module would.
TaskFlowMultiply.__name__ = TaskFlowMultiply.__qualname__ = "Multiply"
TaskFlowFail.__name__ = TaskFlowFail.__qualname__ = "Fail"


class NotServed(task.Task):
    def execute(self) -> None:
        pass


SERVED = [Add, Explode, ReturnsObject, Undo, Gated]


def start_worker(
    exchange: str, transport: dict[str, Any], **kwargs: Any
) -> tuple[wk.Worker, threading.Thread]:
    kwargs.setdefault("threads_count", 2)
    worker = wk.Worker(exchange, TOPIC, SERVED, **transport, **kwargs)
    thread = run_in_thread(functools.partial(worker.run, display_banner=False))
    assert worker.wait(WAIT)
    return worker, thread


@pytest.fixture
def worker(exchange: str, transport: dict[str, Any], requester: Requester) -> Iterator[wk.Worker]:
    GATE.clear()
    RUNS.clear()
    worker, thread = start_worker(exchange, transport)
    yield worker
    GATE.set()
    worker.stop(grace=WAIT)
    thread.join(WAIT)
    assert not thread.is_alive(), "run() should return once stop() has"


def test_execute_replies_running_progress_then_success(
    worker: wk.Worker, requester: Requester
) -> None:
    request = requester.send(Add(name="add"), arguments={"x": 1, "y": 2}, attempt=3)
    replies = requester.outcome(request)
    assert replies == [
        {"state": pr.RUNNING, "data": {}},
        {
            "state": pr.EVENT,
            "data": {"event_type": "update_progress", "details": {"progress": 0.5}},
        },
        {"state": pr.SUCCESS, "data": {"result": 3}},
    ]


def test_replies_carry_worker_identity_and_echo_the_attempt(
    worker: wk.Worker, requester: Requester
) -> None:
    request = requester.send(Add(name="add"), arguments={"x": 1, "y": 2})
    headers = {pr.HEADER_REQUEST_ID: request.request_id, pr.HEADER_ATTEMPT: 2}
    request.uuid = uuid.uuid4().hex  # a second attempt, with its own correlation id
    requester.proxy.publish(request, TOPIC, reply_to=requester.reply_key,
                            correlation_id=request.uuid, headers=headers)  # fmt: skip
    _, reply_headers = requester.next(request.uuid)
    assert reply_headers[pr.HEADER_WORKER] == worker.worker_id
    assert reply_headers[pr.HEADER_PROTOCOL] == pr.PROTOCOL_VERSION
    assert reply_headers[pr.HEADER_REQUEST_ID] == request.request_id
    assert reply_headers[pr.HEADER_ATTEMPT] == 2
    assert 0 <= reply_headers[pr.HEADER_CAPACITY] <= 2


def test_failing_task_replies_a_v1_failure(worker: wk.Worker, requester: Requester) -> None:
    replies = requester.outcome(requester.send(Explode(name="explode")))
    assert [r["state"] for r in replies] == [pr.RUNNING, pr.FAILURE]
    failure = replies[-1]["data"]["result"]
    Failure.validate(failure)
    assert failure["version"] == 1
    assert failure["exc_type_names"][0] == f"{__name__}.VolumeError"
    assert failure["exc_type_names"][-1] == "Exception"
    assert failure["exc_args"] == ["no space left", 42]
    assert "no space left" in failure["exception_str"]
    assert "raise VolumeError" in failure["traceback_str"]


def test_revert_gets_result_and_flow_failures(worker: wk.Worker, requester: Requester) -> None:
    cause = Failure.from_exception(VolumeError("disk"))
    request = requester.send(
        Undo(name="undo"), pr.REVERT, {"extra": 1}, result=cause, failures={"undo": cause}
    )
    result = requester.outcome(request)[-1]["data"]["result"]
    assert result["failures"] == ["undo"] and result["kwargs"] == {"extra": 1}
    # The Failure travelled as data and was handed to revert() as a Failure.
    assert "disk" in str(result["result"])


def test_unknown_task_fails_without_importing_anything(
    worker: wk.Worker, requester: Requester
) -> None:
    request = requester.send(NotServed(name="nope"))
    replies = requester.outcome(request)
    assert [r["state"] for r in replies] == [pr.FAILURE]
    failure = replies[0]["data"]["result"]
    assert failure["exc_type_names"][0] == "flowengine.exceptions.NotFound"
    assert f"{__name__}.NotServed" in failure["exception_str"]
    body = dict(request.to_dict(), task_cls="wb_never_imported_module.Evil")

    class RawRequest(pr.Message):
        TYPE = pr.REQUEST

        def to_dict(self) -> dict[str, Any]:
            return body

    requester.proxy.publish(RawRequest(), TOPIC, reply_to=requester.reply_key,
                            correlation_id="evil")  # fmt: skip
    body_reply, _ = requester.next("evil")
    assert body_reply["state"] == pr.FAILURE
    assert "wb_never_imported_module" not in sys.modules


def test_unserializable_result_becomes_a_failure(worker: wk.Worker, requester: Requester) -> None:
    replies = requester.outcome(requester.send(ReturnsObject(name="obj")))
    assert [r["state"] for r in replies] == [pr.RUNNING, pr.FAILURE]
    failure = replies[-1]["data"]["result"]
    assert failure["exc_type_names"][0] == "flowengine.worker_based.broker.codec.MessageEncodeError"
    assert "not JSON-serializable" in failure["exception_str"] and "obj" in failure["exception_str"]


def test_version_mismatch_is_refused(worker: wk.Worker, requester: Requester) -> None:
    newer = Add(name="add")
    newer.version = (2, 0)
    replies = requester.outcome(requester.send(newer, arguments={"x": 1, "y": 1}))
    assert replies[0]["data"]["result"]["exc_type_names"][0].endswith("IncompatibleVersion")


def test_a_flowengine_request_for_another_major_version_is_handed_back_unrun(
        worker: wk.Worker, requester: Requester) -> None:
    # A rolling upgrade: a worker of another version shares the topic's queue and runs it.
    newer = Add(name="add")
    newer.version = (2, 0)
    request = requester.send(newer, arguments={"x": 1, "y": 1},
                             headers={pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION})
    body, _ = requester.next(request.uuid)
    assert body == {"state": pr.EVENT, "data": {"event_type": ext.EVENT_NOT_SERVED, "details": {
        "worker": worker.worker_id, "version": "1.0"}}}


def test_announcements_and_notify_replies_name_the_versions_served(
        worker: wk.Worker, requester: Requester) -> None:
    expected = {pr.task_class_name(c): "1.0" for c in SERVED}
    _, online = requester.notify_reply(pr.WORKER_ONLINE)
    assert json.loads(online[vs.HEADER_TASK_VERSIONS]) == expected
    requester.proxy.publish(pr.Notify(), TOPIC, reply_to=requester.reply_key)
    body, headers = requester.notify_reply(None)
    assert set(body) == {"topic", "tasks"}  # the body stays TaskFlow's
    assert json.loads(headers[vs.HEADER_TASK_VERSIONS]) == expected


def test_request_past_its_deadline_is_not_run(worker: wk.Worker, requester: Requester) -> None:
    request = requester.send(Gated(name="late"), headers={pr.HEADER_DEADLINE: time.time() - 1})
    replies = requester.outcome(request)
    assert replies[0]["data"]["result"]["exc_type_names"][0].endswith("RequestTimeout")
    assert RUNS == []


def test_notify_is_answered_while_every_task_thread_is_busy(
    exchange: str, transport: dict[str, Any], requester: Requester
) -> None:
    GATE.clear()
    one_thread = futurist.ThreadPoolExecutor(max_workers=1)
    worker, _ = start_worker(exchange, transport, executor=one_thread, threads_count=2)
    try:
        online, _ = requester.notify_reply(pr.WORKER_ONLINE)
        assert online == {"topic": TOPIC, "tasks": sorted(pr.task_class_name(c) for c in SERVED)}
        busy = requester.send(Gated(name="busy"))
        assert requester.next(busy.uuid)[0]["state"] == pr.RUNNING
        requester.proxy.publish(pr.Notify(), TOPIC, reply_to=requester.reply_key)
        body, headers = requester.notify_reply(None)
        assert body["topic"] == TOPIC and headers[pr.HEADER_CAPACITY] == 1
        GATE.set()
        assert requester.outcome(busy)[-1]["data"] == {"result": "through"}
    finally:
        GATE.set()
        worker.stop(grace=WAIT)
        one_thread.shutdown(wait=False)
    _, headers = requester.notify_reply(pr.WORKER_OFFLINE)
    assert headers[pr.HEADER_WORKER] == worker.worker_id


def test_a_worker_prefetches_no_more_than_it_can_run(tmp_path: Path, exchange: str) -> None:
    transport = {"transport_options": {"data_folder": str(tmp_path / "fs")}}
    GATE.clear()
    requester = Requester(exchange, transport)
    worker, _ = start_worker(exchange, transport, threads_count=1)
    try:
        first = requester.send(Gated(name="first"))
        assert requester.next(first.uuid)[0]["state"] == pr.RUNNING
        second = requester.send(Add(name="second"), arguments={"x": 1, "y": 1})
        # With its one slot taken, the worker leaves the second request in the shared queue.
        queued = tmp_path / "fs" / "queues" / f"{exchange}_{TOPIC}"
        assert len(list(queued.iterdir())) == 1
        GATE.set()
        assert requester.outcome(first)[-1]["state"] == pr.SUCCESS
        assert requester.outcome(second)[-1]["data"] == {"result": 2}
    finally:
        GATE.set()
        worker.stop(grace=WAIT)
        requester.close()


def test_running_requests_send_heartbeats_when_asked(
    worker: wk.Worker, requester: Requester
) -> None:
    request = requester.send(Gated(name="beating"), headers={ext.HEADER_HEARTBEAT: 0.01})
    assert requester.next(request.uuid)[0]["state"] == pr.RUNNING
    beat, headers = requester.next(request.uuid)
    assert beat == {"state": pr.EVENT, "data": {"event_type": ext.EVENT_HEARTBEAT, "details": {}}}
    tf_protocol.Response.validate(beat)
    assert headers[pr.HEADER_WORKER] == worker.worker_id
    GATE.set()
    assert requester.outcome(request)[-1]["data"] == {"result": "through"}


def test_no_heartbeats_unless_asked(worker: wk.Worker, requester: Requester) -> None:
    GATE.set()
    replies = requester.outcome(requester.send(Gated(name="quiet")))
    assert [r["state"] for r in replies] == [pr.RUNNING, pr.SUCCESS]


def test_offline_is_announced_after_in_flight_work_is_done(
    exchange: str, transport: dict[str, Any], requester: Requester
) -> None:
    GATE.clear()
    worker, thread = start_worker(exchange, transport)
    request = requester.send(Gated(name="last"))
    assert requester.next(request.uuid)[0]["state"] == pr.RUNNING
    stopping = run_in_thread(functools.partial(worker.stop, grace=WAIT))
    GATE.set()
    assert requester.outcome(request)[-1]["state"] == pr.SUCCESS
    requester.notify_reply(pr.WORKER_OFFLINE)
    stopping.join(WAIT)
    thread.join(WAIT)
    assert requester.arrivals.index(pr.SUCCESS) < requester.arrivals.index(pr.WORKER_OFFLINE)


def test_malformed_messages_do_not_stop_the_worker(
    worker: wk.Worker, requester: Requester, exchange: str, transport: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    url = "memory://localhost" if "transport" in transport else "flowengine-fs://localhost"
    options = transport.get("transport_options", {})
    target = kombu.Exchange(exchange, type="direct", durable=True)
    reply = {"reply_to": requester.reply_key, "correlation_id": "bad"}
    with caplog.at_level(logging.WARNING), kombu.Connection(url, transport_options=options) as conn:
        producer = conn.Producer()
        for body, content_type, props in [
            (b"{}", "application/json", {}),  # no type
            (b"{}", "application/json", {"type": "GOSSIP"}),
            (b'{"task_cls": ', "application/json", {"type": pr.REQUEST}),
            (b"\x80\x04K\x01.", "application/x-python-serialize", {"type": pr.REQUEST}),
            (b'{"task_cls": 1}', "application/json", {"type": pr.REQUEST}),
            (json.dumps(Add(name="a").version).encode(), "application/json", {"type": pr.NOTIFY}),
        ]:
            producer.publish(body, exchange=target, routing_key=TOPIC, content_type=content_type,
                             content_encoding="utf-8", **reply, **props)  # fmt: skip
        request = requester.send(Add(name="add"), arguments={"x": 2, "y": 2})
        assert requester.outcome(request)[-1]["data"] == {"result": 4}
    reasons = [r.getMessage().split("reason=")[1].split()[0] for r in caplog.records
               if "reason=" in r.getMessage()]  # fmt: skip
    expected = ["missing-type", "unknown-type", "decode-error", "content-type", "invalid-format"]
    assert reasons == [*expected, "invalid-format"]
    # Each refused message that names where to reply (all but the NOTIFY) is answered with a
    # FAILURE saying why.
    refusals = [requester.replies["bad"].get(timeout=WAIT)[0] for _ in range(5)]
    assert [r["state"] for r in refusals] == [pr.FAILURE] * 5
    why = [r["data"]["result"]["exception_str"] for r in refusals]
    assert [f"reason={reason}" in text for reason, text in zip(expected, why)] == [True] * 5
    assert requester.replies["bad"].empty()


def test_request_without_reply_to_is_dropped(
    worker: wk.Worker, requester: Requester, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        requester.proxy.publish(pr.Request(Add(name="a"), "c", pr.EXECUTE, {}), TOPIC)
        request = requester.send(Add(name="add"), arguments={"x": 1, "y": 1})
        assert requester.outcome(request)[-1]["data"] == {"result": 2}
    assert "lacks reply_to" in caplog.text


def test_request_is_acked_only_after_its_outcome(tmp_path: Path, exchange: str) -> None:
    # Unacknowledged deliveries are visible as claimed files on the fs transport.
    transport = {"transport_options": {"data_folder": str(tmp_path / "fs")}}
    claimed = tmp_path / "fs" / "claimed"
    GATE.clear()
    requester = Requester(exchange, transport)
    worker, _ = start_worker(exchange, transport)
    try:
        request = requester.send(Gated(name="slow"))
        assert requester.next(request.uuid)[0]["state"] == pr.RUNNING
        assert len(list(claimed.rglob("*.msg"))) == 1
        GATE.set()
        assert requester.outcome(request)[-1]["state"] == pr.SUCCESS
    finally:
        GATE.set()
        worker.stop(grace=WAIT)  # returns once every outcome is settled
        requester.close()
    assert list(claimed.rglob("*.msg")) == []


def test_replies_never_recreate_the_queue_of_a_vanished_engine(
    tmp_path: Path, exchange: str
) -> None:
    transport = {"transport_options": {"data_folder": str(tmp_path / "fs")}}
    requester = Requester(exchange, transport)
    worker, _ = start_worker(exchange, transport)
    try:
        # The control thread answers NOTIFYs in order: once ours is answered, so is the ghost's.
        requester.proxy.publish(pr.Notify(), TOPIC, reply_to="ghost-engine")
        requester.proxy.publish(pr.Notify(), TOPIC, reply_to=requester.reply_key)
        requester.notify_reply(None)
        queues = {path.name for path in (tmp_path / "fs" / "queues").iterdir()}
        assert f"{exchange}_ghost-engine" not in queues
        assert f"{exchange}_{requester.reply_key}" in queues
    finally:
        worker.stop(grace=WAIT)
        requester.close()


def test_unsettled_deliveries_are_redelivered_after_stop(tmp_path: Path, exchange: str) -> None:
    options = {"data_folder": str(tmp_path / "fs")}
    received: queue.Queue[Any] = queue.Queue()
    first = px.Proxy(TOPIC, exchange, {pr.NOTIFY: dp.Handler(
        lambda data, message: received.put(("first", message)), manual_ack=True)},
        transport_options=options)  # fmt: skip
    thread = run_in_thread(first.start)
    assert first.wait(WAIT)
    first.publish(pr.Notify(), TOPIC, reply_to="nobody")
    assert received.get(timeout=WAIT)[0] == "first"
    assert first.unsettled == 1
    first.stop(grace=0)
    assert first.wait_stopped(WAIT)
    thread.join(WAIT)
    second = px.Proxy(
        TOPIC,
        exchange,
        {pr.NOTIFY: dp.Handler(lambda data, message: received.put(("second", message)))},
        transport_options=options,
    )
    thread = run_in_thread(second.start)
    try:
        assert received.get(timeout=WAIT)[0] == "second"
    finally:
        second.stop()
        thread.join(WAIT)


def test_consumer_reconnects_after_a_connection_error(
    exchange: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    connected: list[float] = []
    received: queue.Queue[Any] = queue.Queue()
    proxy = px.Proxy(TOPIC, exchange, {pr.NOTIFY: dp.Handler(lambda d, m: received.put(d))},
                     transport="memory", on_connected=lambda: connected.append(time.monotonic()),
                     retry_options={"interval_start": 0.001, "jitter": 0})  # fmt: skip
    real_drain = kombu.Connection.drain_events
    failures = [ConnectionError("broker went away")]
    thread = threading.Thread(target=proxy.start, daemon=True)

    def flaky_drain(self: kombu.Connection, **kwargs: Any) -> Any:
        # Only this proxy's consumer fails: the patch is class-wide, and a consumer thread another
        # test left winding down must not take the one failure.
        if failures and threading.current_thread() is thread:
            raise proxy.connection_errors[0](str(failures.pop()))
        return real_drain(self, **kwargs)

    monkeypatch.setattr(kombu.Connection, "drain_events", flaky_drain)
    thread.start()
    try:
        proxy.publish(pr.Notify(), TOPIC, reply_to="r")
        assert received.get(timeout=WAIT) == {}
        assert len(connected) == 2
    finally:
        proxy.stop()
        thread.join(WAIT)


@pytest.mark.parametrize("transport", [{"transport": "memory"}, {}])
def test_auto_ack_is_for_redis_only(transport: dict[str, Any], tmp_path: Path) -> None:
    # On flowengine-fs an ack is what frees a message's file; on AMQP, unacknowledged deliveries
    # in flight come back after a lost connection (tests/integration covers Redis).
    options = {"transport_options": {"data_folder": str(tmp_path)}} if not transport else {}
    proxy = px.Proxy(TOPIC, "auto", auto_ack=True, **transport, **options)
    assert proxy.acks_on_receipt is False
    amqp = px.Proxy(TOPIC, "auto", url="amqp://guest:guest@127.0.0.1:1//", auto_ack=True)
    assert amqp.acks_on_receipt is False  # never connects: the decision is made up front


def test_taskflow_compat_uses_taskflows_declarations() -> None:
    compat = px.Proxy(TOPIC, "tf", transport="memory", taskflow_compat=True)
    queue_ = compat.queue_for(TOPIC)
    assert queue_.name == f"tf_{TOPIC}" and queue_.routing_key == TOPIC
    assert (queue_.durable, queue_.auto_delete) == (False, True)
    assert (queue_.exchange.type, queue_.exchange.durable, queue_.exchange.auto_delete) == (
        "direct", False, True,
    )  # fmt: skip
    durable = px.Proxy(TOPIC, "fe", transport="memory").queue_for(TOPIC)
    assert (durable.durable, durable.auto_delete, durable.exchange.durable) == (True, False, True)
    expiring = px.Proxy(TOPIC, "fe", transport="memory").queue_for(TOPIC, expires=60)
    assert expiring.expires == 60  # kombu sends it as x-expires
    with pytest.raises(ValueError, match="queue_expires"):
        px.Proxy(TOPIC, "tf", transport="memory", taskflow_compat=True, queue_expires=60)


def test_retry_delays_grow_capped_and_jittered() -> None:
    options = bo.RetryOptions(interval_start=1, interval_max=10, multiplier=2, jitter=0.5)
    assert [options.delay(n, rand=lambda: 0.0) for n in range(6)] == [1, 2, 4, 8, 10, 10]
    assert options.delay(3, rand=lambda: 1.0) == 4
    assert options.delay(10**6, rand=lambda: 0.0) == 10
    taskflow_style = bo.RetryOptions.from_options(
        {"interval_start": 1, "interval_step": 1, "interval_max": 1, "max_retries": 3}
    )
    assert (taskflow_style.max_retries, taskflow_style.interval_max) == (3, 1.0)
    with pytest.raises(ValueError, match="interval_start"):
        bo.RetryOptions.from_options({"interval_start": -1})
    with pytest.raises(ValueError, match="Unknown"):
        bo.RetryOptions.from_options({"interval_strat": 1})


def test_retry_log_lines_are_bounded_and_stop_ends_retrying(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = threading.Event()
    backoff = bo.Backoff(bo.RetryOptions(interval_start=0), "Consuming", "memory://", stop)
    with caplog.at_level(logging.WARNING):
        for _ in range(25):
            backoff(ConnectionError("down"))
    assert len(caplog.records) == 5  # attempts 1-3, 10 and 20
    stop.set()
    with pytest.raises(bo.RetryAbandoned):
        backoff(ConnectionError("down"))


def test_urls_are_masked_in_banner_and_details() -> None:
    worker = wk.Worker("ex", TOPIC, [Add], url="amqp://guest:s3cret@broker:5672//")
    assert "s3cret" not in worker.banner and "guest:***@broker" in worker.banner
    assert px.mask_url("redis://:pw@h:6379/0;redis://u:pw2@h2") == (
        "redis://:***@h:6379/0;redis://u:***@h2"
    )
    assert px.mask_url("memory://") == "memory://"


def test_message_too_large_is_refused_before_sending() -> None:
    big = pr.Response(pr.SUCCESS, result="x" * (pr.MAX_BODY_BYTES + 1))
    with pytest.raises(px.MessageEncodeError, match="bound"):
        px.encode(big)


def test_message_too_deep_is_refused_before_sending_naming_the_bound() -> None:
    deep: Any = []
    for _ in range(pr.MAX_NESTING_DEPTH - 2):  # the reply's own two levels make one too many
        deep = [deep]
    with pytest.raises(px.MessageEncodeError, match=f"deeper than {pr.MAX_NESTING_DEPTH}"):
        px.encode(pr.Response(pr.SUCCESS, result=deep))
    px.encode(pr.Response(pr.SUCCESS, result=deep[0]))  # one level less travels


def test_a_worker_refuses_a_process_pool_in_one_line() -> None:
    with cf.ProcessPoolExecutor(2) as pool:
        with pytest.raises(ValueError) as raised:
            wk.Worker("ex", TOPIC, [Add], executor=pool, transport="memory")
    message = str(raised.value)
    assert "\n" not in message, message
    assert f"Worker on topic '{TOPIC}': executor=ProcessPoolExecutor is not supported" in message
    assert "threads_count=N" in message and "more worker processes" in message


def test_a_request_its_executor_cannot_run_is_rejected_saying_why(
    exchange: str, transport: dict[str, Any], requester: Requester,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """What a worker on a process pool did, unseen: the call cannot be handed to a child."""
    caplog.set_level(logging.ERROR, logger="flowengine.worker_based.server")
    rejected = _RecordSeen("reason=executor-failed")
    logger = logging.getLogger("flowengine.worker_based.server")
    logger.addHandler(rejected)
    with cf.ProcessPoolExecutor(1) as pool:
        server = sv.Server(TOPIC, exchange, pool, [ep.Endpoint(Add)], capacity=1,
                           **transport)
        thread = run_in_thread(server.start)
        try:
            assert server.wait(WAIT)
            requester.send(Add(name="add"), arguments={"x": 1, "y": 2})
            assert rejected.seen.wait(WAIT), caplog.text  # dropped unanswered: the log says so
            assert "its executor ProcessPoolExecutor" in rejected.message, rejected.message
            assert server.in_flight == 0  # the slot is free again
        finally:
            logger.removeHandler(rejected)
            server.stop()
            thread.join(WAIT)
            server.close()


class _RecordSeen(logging.Handler):
    """Sets ``seen`` once a record whose message holds ``text`` is logged (its ``message``)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text, self.message = text, ""
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.text in message:
            self.message = message
            self.seen.set()


def test_task_specs_resolve_to_classes_defined_where_named() -> None:
    module = sys.modules[__name__]
    names = [c.__name__ for c in wk.find_task_classes([module])]
    assert names == [
        "Add", "Explode", "Fail", "Gated", "Multiply", "NotServed", "ReturnsObject", "Undo",
    ]  # fmt: skip
    assert wk.find_task_classes([f"{__name__}:Add", Add]) == [Add]
    assert wk.find_task_classes([__name__]) == wk.find_task_classes(module)
    assert wk.find_task_classes(f"{__name__}:Add") == [Add]
    with pytest.raises(TypeError, match="not a concrete Task"):
        wk.find_task_classes([f"{__name__}:VolumeError"])
    with pytest.raises(ImportError):
        wk.find_task_classes([f"{__name__}:Missing"])
    with pytest.raises(TypeError):
        wk.find_task_classes([42])  # type: ignore[list-item]


def test_a_taskflow_engine_runs_its_tasks_on_a_flowengine_worker(
    exchange: str, transport: dict[str, Any]
) -> None:
    REVERTS.clear()
    worker = wk.Worker(exchange, TOPIC, [Multiply, Fail], threads_count=2, taskflow_compat=True,
                       **transport)  # fmt: skip
    thread = run_in_thread(functools.partial(worker.run, display_banner=False))
    assert worker.wait(WAIT)
    options = dict(transport, exchange=exchange, topics=[TOPIC])
    if "transport_options" in options:
        options["transport"] = "flowengine-fs"
    else:
        options["transport_options"] = {"polling_interval": 0.01}
    try:
        flow = tf_linear_flow.Flow("ok").add(TaskFlowMultiply("mul"))
        engine = taskflow.engines.load(
            flow, store={"a": 6, "b": 7}, engine="worker-based", **options
        )
        engine.run()
        assert engine.storage.fetch("product") == 42
        flow = tf_linear_flow.Flow("reverts").add(TaskFlowMultiply("mul"), TaskFlowFail("fail"))
        engine = taskflow.engines.load(
            flow, store={"a": 2, "b": 3}, engine="worker-based", **options
        )
        with pytest.raises(Exception, match="remote boom"):
            engine.run()
        assert REVERTS == [(6, ["fail"])]
    finally:
        worker.stop(grace=WAIT)
        thread.join(WAIT)


class _AccessRefused(Exception):
    """Shaped as py-amqp's: a reply code is all the rule reads."""

    reply_code = 403


class AuthenticationError(Exception):
    """Named as redis-py's."""


@pytest.mark.parametrize("refused", [_AccessRefused("ACCESS_REFUSED"),
                                     AuthenticationError("invalid username-password pair")])
def test_a_refused_login_is_never_retried(refused: Exception) -> None:
    # On a reconnect as on the first connection: a rotated password must not loop forever.
    stop = threading.Event()
    backoff = bo.Backoff(bo.RetryOptions(interval_start=60), "Consuming", "amqp://u:***@h//", stop)
    wrapped = ConnectionError("connection lost")
    wrapped.__cause__ = refused
    for err in (refused, wrapped):
        with pytest.raises(bo.BrokerRefused, match=r"amqp://u:\*\*\*@h// was refused"):
            backoff(err)
    assert backoff.attempt == 0
    stop.set()  # anything else is retried (here: abandoned at once, as the owner stops)
    with pytest.raises(bo.RetryAbandoned):
        backoff(ConnectionError("connection refused"))


def test_redis_consumers_hand_back_unsettled_messages_in_seconds_not_an_hour() -> None:
    # Nothing connects until a proxy is used, so no server is needed here.
    default = px.Proxy(TOPIC, "fe", url="redis://127.0.0.1:6379/0").connection_details.options
    assert default["visibility_timeout"] == px.REDIS_VISIBILITY_TIMEOUT
    # ... and a consumer killed during a hand-out does not stall the others for minutes.
    assert default["unacked_mutex_expire"] == px.REDIS_RESTORE_LOCK_EXPIRE
    chosen = px.Proxy(TOPIC, "fe", url="redis://127.0.0.1:6379/0",
                      transport_options={"visibility_timeout": 5})
    assert chosen.connection_details.options["visibility_timeout"] == 5
    memory = px.Proxy(TOPIC, "fe", transport="memory").connection_details.options
    assert "visibility_timeout" not in memory
