"""Secrets on the worker side and in dead letters, and dead-letter expiry (kombu's memory broker).

A request names its secret arguments in a header; a worker masks them in what it reports, and
a parked request keeps none of them and expires. Time is an injected wall clock.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from flowengine import engines, task
from flowengine import exceptions as exc
from flowengine.flows import linear_flow
from flowengine.secrets import Secret
from flowengine.types.failure import Failure
from flowengine.worker_based import dead_letters
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import secret_arguments as sa
from flowengine.worker_based import worker as wk
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.dead_letter_keeping import HEADER_DEAD_EXPIRES, RequeueRefused
from flowengine.worker_based.dead_letters import DeadLetters

WAIT = 20.0
#: Cores every encoding of the secrets keeps.
PASSWORD, TOKEN = "pw-c0re-'\"\\x", "tok-c0re"
CORES = ("pw-c0re", "tok-c0re")


class Login(task.Task):
    """Marks only ``token`` secret itself; ``password`` is secret because the store says so."""

    secret_args = ("token",)

    def execute(self, password: str, token: str) -> None:
        logging.getLogger("flowengine.test").info("logging in")
        raise PermissionError(f"login with {password!r} and {token} refused", password)

    def revert(self, password: str, token: str, **kwargs: Any) -> None:
        pass


class Recorded(ext.EventSink):
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, object]]] = []

    def emit(self, event_type: str, **fields: object) -> None:
        self.seen.append((event_type, fields))


def assert_no_secret(where: str, text: str) -> None:
    for core in CORES:
        assert core not in text, f"a secret is in clear in {where}: {text}"


@pytest.fixture
def exchange() -> str:
    return f"keeping-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def worker_events(exchange: str) -> Iterator[Recorded]:
    events = Recorded()
    worker = wk.Worker(exchange, "secrets", [Login], transport="memory", threads_count=2,
                       events=events)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    assert worker.wait(WAIT)
    try:
        yield events
    finally:
        worker.stop(grace=5.0)
        thread.join(WAIT)


def test_a_worker_masks_the_arguments_its_engine_names_secret(
        exchange: str, worker_events: Recorded, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    engine = engines.load(linear_flow.Flow("login").add(Login(name="login")), engine="worker-based",
                          exchange=exchange, transport="memory", topics=["secrets"],
                          transition_timeout=WAIT, events=False,
                          store={"password": Secret(PASSWORD), "token": TOKEN})
    with pytest.raises(exc.WrappedFailure, match="PermissionError"):
        engine.run()
    failed = [f for t, f in worker_events.seen if t == "task-failed"]
    assert failed and "***" in str(failed[0]["exception"])
    assert_no_secret("the worker's events", repr(worker_events.seen))
    assert_no_secret("the log", "\n".join(f"{r.getMessage()} {r.exc_text or ''}"
                                          for r in caplog.records))
    stored = engine.storage.get_execute_failures()["login"]
    assert_no_secret("the stored failure", json.dumps(stored.to_dict()))


def test_an_argument_injected_as_a_secret_is_named_secret_too(
        exchange: str, worker_events: Recorded) -> None:
    def failed_with(login: Login) -> str:
        engine = engines.load(linear_flow.Flow(login.name).add(login), engine="worker-based",
                              exchange=exchange, transport="memory", topics=["secrets"],
                              transition_timeout=WAIT, events=False, store={"token": TOKEN})
        with pytest.raises(exc.WrappedFailure, match="PermissionError"):
            engine.run()
        failed = [f for t, f in worker_events.seen if t == "task-failed"
                  and f.get("task_name") == login.name]
        assert failed, f"no task-failed event for {login.name}"
        return repr(failed)

    assert_no_secret("the worker's events", failed_with(
        Login(name="login", inject={"password": Secret(PASSWORD)})))
    # Only what is secret is masked: the same argument injected in clear is shown.
    shown = failed_with(Login(name="other", inject={"password": "pw-in-clear"}))
    assert "pw-in-clear" in shown and "tok-c0re" not in shown


def test_requests_name_their_secret_arguments_in_a_header() -> None:
    assert sa.for_request(["token", "password", "absent"], {"password": 1, "token": 2,
                                                            "user": 3}) == ["password", "token"]
    assert sa.names({sa.HEADER_SECRET_ARGS: ["a", 3, "b"]}) == ("a", "b")
    assert sa.names({sa.HEADER_SECRET_ARGS: "a"}) == ()  # malformed: ignored
    masker = sa.masker({"password": PASSWORD, "user": "ada"}, ["password"], Login())
    assert masker.text(f"{PASSWORD!r} ada") == "'***' ada"


def _park(parker: px.Proxy, request: pr.Request, now: float, ttl: float = 100.0,
          secret: list[str] | None = None) -> None:
    headers: dict[str, Any] = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION,
                               pr.HEADER_REQUEST_ID: request.request_id,
                               pr.HEADER_FLOW_UUID: "flow-1"}
    if secret:
        headers[sa.HEADER_SECRET_ARGS] = secret
    dead_letters.park(parker, request, headers, "lost", "secrets", ["w1"], reply_to="gone",
                      ttl=ttl, clock=lambda: now)


def test_a_dead_letter_keeps_no_secret_and_is_not_sent_again_without_them(exchange: str) -> None:
    parker = px.Proxy("parker", exchange, transport="memory")
    letters = DeadLetters(exchange, transport="memory", clock=lambda: 1000.0)
    try:
        failure = Failure.from_exception(RuntimeError(f"saw {PASSWORD!r}"))
        request = pr.Request(Login(), "atom-1", pr.REVERT,
                             {"password": PASSWORD, "token": TOKEN, "user": "ada"},
                             result=f"session of {TOKEN}", failures={"Login": failure})
        _park(parker, request, now=1000.0, secret=["password", "token"])
        [raw] = parker.browse(ext.DEAD_LETTER_ROUTING_KEY)
        assert_no_secret("the parked letter", raw.body.decode() + json.dumps(raw.headers))
        assert raw.json()["arguments"] == {"user": "ada"}
        assert raw.json()["result"] == ["success", "session of ***"]
        [letter] = letters.list()
        assert letter.removed_arguments == ("password", "token")
        assert letter.flow_uuid == "flow-1"
        with pytest.raises(RequeueRefused) as refused:
            letters.requeue(letter.id)
        assert "'password', 'token' were removed" in str(refused.value)
        assert f"requeue {letter.id} --resume --backend URI" in str(refused.value)
        assert "--store password=VALUE --store token=VALUE" in str(refused.value)
        assert [kept.id for kept in letters.list()] == [letter.id], "refused, yet kept"
        assert parker.browse("secrets") == [], "nothing was sent to the topic"
    finally:
        letters.close()
        parker.close()


def test_dead_letters_expire_after_their_ttl(exchange: str) -> None:
    now = [1000.0]
    parker = px.Proxy("parker", exchange, transport="memory")
    letters = DeadLetters(exchange, transport="memory", clock=lambda: now[0])
    try:
        old = pr.Request(Login(name="old"), "atom-1", pr.EXECUTE, {})
        _park(parker, old, now=1000.0, ttl=100.0)
        [listed] = letters.list()
        assert listed.expires_at == 1100.0 and listed.to_dict()["expires_at_iso"]
        [raw] = parker.browse(ext.DEAD_LETTER_ROUTING_KEY)
        assert raw.headers[HEADER_DEAD_EXPIRES] == 1100.0
        assert raw.properties.get("expiration") == "100000"  # the broker's TTL, where it has one
        now[0] = 1099.9
        assert [letter.id for letter in letters.list()] == [old.request_id]
        now[0] = 1100.0
        assert letters.list() == []
        assert parker.browse(ext.DEAD_LETTER_ROUTING_KEY) == [], "swept out of the queue"
        with pytest.raises(exc.NotFound):
            letters.requeue(old.request_id)
    finally:
        letters.close()
        parker.close()


def test_parking_sweeps_expired_letters_from_the_head_of_the_queue(exchange: str) -> None:
    parker = px.Proxy("parker", exchange, transport="memory")
    try:
        first = pr.Request(Login(name="first"), "atom-1", pr.EXECUTE, {})
        second = pr.Request(Login(name="second"), "atom-2", pr.EXECUTE, {})
        third = pr.Request(Login(name="third"), "atom-3", pr.EXECUTE, {})
        _park(parker, first, now=0.0, ttl=10.0)
        _park(parker, second, now=5.0, ttl=1000.0)
        _park(parker, third, now=20.0, ttl=10.0)  # the first has expired by now
        kept = [m.headers[pr.HEADER_REQUEST_ID]
                for m in parker.browse(ext.DEAD_LETTER_ROUTING_KEY)]
        assert kept == [second.request_id, third.request_id]
    finally:
        parker.close()


def test_letters_parked_before_expiries_expire_from_their_parking_time(exchange: str) -> None:
    parker = px.Proxy("parker", exchange, transport="memory")
    try:
        request = pr.Request(Login(name="legacy"), "atom-1", pr.EXECUTE, {})
        parker.publish(request, ext.DEAD_LETTER_ROUTING_KEY, reply_to="gone",
                       correlation_id=request.request_id,
                       headers={ext.HEADER_DEAD_AT: 50.0, ext.HEADER_DEAD_TOPIC: "secrets",
                                pr.HEADER_REQUEST_ID: request.request_id})
        [letter] = DeadLetters(exchange, transport="memory", clock=lambda: 60.0).list()
        assert letter.expires_at == 50.0 + dead_letters.DEFAULT_TTL
        assert letter.flow_uuid is None and letter.removed_arguments == ()
    finally:
        parker.close()


class _Keep(logging.Handler):
    """Keeps the formatted records it is given."""

    def __init__(self, records: list[str]) -> None:
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))


def _recording_logger() -> tuple[logging.Logger, logging.Handler, list[str]]:
    """A fresh logger of its own (not propagating), the handler keeping its records, and them."""
    records: list[str] = []
    logger = logging.getLogger(f"keeping-{uuid.uuid4().hex[:6]}")
    logger.propagate = False
    handler = _Keep(records)
    logger.addHandler(handler)
    return logger, handler, records


def test_the_masking_filter_masks_what_is_logged_while_a_request_runs() -> None:
    logger, handler, records = _recording_logger()
    sa.install_filter(logger)
    sa.install_filter(logger)  # once is enough
    assert len(handler.filters) == 1
    secrets = sa.masker({"password": PASSWORD}, ["password"])
    with sa.masking(secrets):
        logger.warning("with %r", PASSWORD)
        try:
            raise ValueError(PASSWORD)
        except ValueError:
            logger.exception("failed")
    logger.warning("after: %s", "pw-c0re")  # no request runs: left alone
    assert records[0] == "with '***'"
    assert records[1].startswith("failed\nTraceback") and "ValueError: ***" in records[1]
    assert_no_secret("the masked records", "\n".join(records[:2]))
    assert records[2] == "after: pw-c0re"


def test_awaited_calls_mask_their_own_secrets_only() -> None:
    # Async tasks share the worker's loop thread: each call's masking lives in its own context.
    import asyncio

    logger, _handler, records = _recording_logger()
    sa.install_filter(logger)

    async def call(own: str, other: str, ready: asyncio.Event, go: asyncio.Event) -> None:
        ready.set()
        await go.wait()  # both are inside their masking before either logs
        logger.warning("own %s, other %s", own, other)

    async def both() -> None:
        first_ready, second_ready, go = asyncio.Event(), asyncio.Event(), asyncio.Event()
        first = asyncio.ensure_future(sa.masked(
            sa.masker({"password": "alpha-s3cret"}, ["password"]),
            call("alpha-s3cret", "beta-s3cret", first_ready, go)))
        second = asyncio.ensure_future(sa.masked(
            sa.masker({"password": "beta-s3cret"}, ["password"]),
            call("beta-s3cret", "alpha-s3cret", second_ready, go)))
        await first_ready.wait()
        await second_ready.wait()
        go.set()
        await asyncio.gather(first, second)

    asyncio.run(both())
    assert sorted(records) == ["own ***, other alpha-s3cret", "own ***, other beta-s3cret"]
