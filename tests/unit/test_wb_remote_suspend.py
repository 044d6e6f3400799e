"""A SUSPEND pushed to a worker-based engine through its process's broker client.

A real Worker and a worker-based engine over kombu's memory transport, the flow stored in SQLite.
The pushed message must suspend the engine while its only running task is still blocked, so
the stored mark (read only between atom transitions) cannot be what stopped it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wb_requester import TOPIC, WAIT, run_in_thread

from flowengine import engines, states, task
from flowengine.engines import suspend_requests as sr
from flowengine.flows import linear_flow
from flowengine.persistence import backends, base, models
from flowengine.worker_based import client as bc
from flowengine.worker_based import remote_control as rc
from flowengine.worker_based import signing as sg
from flowengine.worker_based import worker as wk

KEY = "correct horse battery staple"
GATE = threading.Event()
STARTED = threading.Event()
RAN: list[str] = []


class Held(task.Task):
    """Runs until the test opens the gate."""

    def execute(self) -> str:
        RAN.append(self.name)
        STARTED.set()
        assert GATE.wait(WAIT), "the test never opened the gate"
        return self.name


@pytest.fixture(autouse=True)
def _no_key_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sg.ENV_KEY, raising=False)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[base.Backend]:
    with backends.backend(f"sqlite:///{tmp_path / 'flows.db'}") as backend:
        yield backend
    bc.close_all()


@contextlib.contextmanager
def running(exchange: str, store: base.Backend, key: str | None) -> Iterator[Any]:
    """A worker, and an engine running ``first`` then ``second`` on it, ``first`` held."""
    GATE.clear()
    STARTED.clear()
    RAN.clear()
    worker = wk.Worker(exchange, TOPIC, [Held], threads_count=1, transport="memory",
                       signing_key=key)
    thread = run_in_thread(functools.partial(worker.run, display_banner=False))
    assert worker.wait(WAIT)
    flow = linear_flow.Flow("held").add(Held("first"), Held("second"))
    engine = engines.load(flow, engine="worker-based", exchange=exchange, topics=[TOPIC],
                          transport="memory", backend=store, book=models.LogBook("b"),
                          signing_key=key, transition_timeout=WAIT)
    done = threading.Event()
    runner = run_in_thread(lambda: (engine.run(), done.set()))
    try:
        assert STARTED.wait(WAIT)
        yield engine
        GATE.set()
        runner.join(WAIT)
        assert done.is_set(), "run() returns once suspended"
    finally:
        GATE.set()
        worker.stop(grace=WAIT)
        thread.join(WAIT)


def _running_on(store: base.Backend, flow: str) -> dict[str, Any]:
    with contextlib.closing(store.get_connection()) as conn:
        return dict(conn.get_flow_details(flow, lazy=True).meta[sr.META_RUNNING_ON])


def _eventually(condition: Any) -> bool:
    pause = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if condition():
            return True
        pause.wait(0.01)
    return bool(condition())


def test_a_pushed_suspend_stops_the_engine_while_its_task_runs(exchange: str,
                                                                store: base.Backend) -> None:
    with running(exchange, store, None) as engine:
        flow = engine.storage.flow_uuid
        where = _running_on(store, flow)
        assert where["broker"]["exchange"] == exchange and where["broker"]["reply_to"]
        assert where["broker"]["transport"] == "memory"
        elsewhere = rc.push_suspend(where, flow, {"exchange": "other", "transport": "memory"})
        assert elsewhere is not None and "not on this broker" in elsewhere
        told = rc.push_suspend(where, flow, {"exchange": exchange, "transport": "memory"})
        assert told == "its engine was told through the broker, and is suspending"
        assert _eventually(lambda: engine.storage.get_flow_state() == states.SUSPENDING), \
            "the engine should suspend while 'first' still runs"
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert RAN == ["first"]
    assert rc.push_suspend({"host": "h", "pid": 1}, flow, None) is None  # store-only engines


def test_with_signing_an_unsigned_push_is_refused_and_a_signed_one_taken(
        exchange: str, store: base.Backend, caplog: pytest.LogCaptureFixture) -> None:
    broker = {"exchange": exchange, "transport": "memory"}
    with caplog.at_level(logging.WARNING), running(exchange, store, KEY) as engine:
        flow = engine.storage.flow_uuid
        where = _running_on(store, flow)
        rc.push_suspend(where, flow, broker, signing=sg.Signing())  # no key
        assert _eventually(lambda: any(
            "Refused SUSPEND message" in r.getMessage() for r in caplog.records))
        assert engine.storage.get_flow_state() == states.RUNNING
        rc.push_suspend(where, flow, broker, signing=sg.Signing(KEY.encode()))
        assert _eventually(lambda: engine.storage.get_flow_state() == states.SUSPENDING)
    assert engine.storage.get_flow_state() == states.SUSPENDED and RAN == ["first"]


def test_a_suspend_body_is_validated() -> None:
    rc.Suspend.validate(rc.Suspend("f1").to_dict())
    for bad in ({}, {"flow_uuid": ""}, {"flow_uuid": 1}, {"flow_uuid": "f", "x": 1}):
        with pytest.raises(Exception, match="Suspend message data"):
            rc.Suspend.validate(bad)
