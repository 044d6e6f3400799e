"""Suspend requests through the stored flow detail (engines.suspend_requests), in one process.

The request is written through its own backend object, as another process would write it; the
real cross-process runs are in tests/dashboard/test_dashboard_remote_suspend.py.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from manual_clock import ManualClock

from flowengine import engines, states, task
from flowengine.engines import suspend_requests as sr
from flowengine.flows import linear_flow
from flowengine.persistence import backends, base, models


def _url(kind: str, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'flows.db'}" if kind == "sqlite" else f"dir://{tmp_path}/d"


@pytest.fixture(params=["sqlite", "dir"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    found = _url(request.param, tmp_path)
    with backends.backend(found):
        pass  # creates (upgrades) the store once
    return found


@contextlib.contextmanager
def opened(url: str) -> Iterator[base.Backend]:
    backend = backends.fetch(url)
    try:
        yield backend
    finally:
        backend.close()


class Ask(task.Task):
    """Asks, as an operator elsewhere would, for its own flow to be suspended."""

    def execute(self, url: str, flow_uuid: str) -> str:
        with opened(url) as other:
            return sr.request_suspend(other, flow_uuid, by="test").text


class Step(task.Task):
    def execute(self) -> None:
        pass


def _engine(url: str, backend: base.Backend, **options: Any) -> Any:
    fd = models.FlowDetail("asked", "flow-1")
    book = models.LogBook("book")
    book.add(fd)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.save_logbook(book)
    flow = linear_flow.Flow("asked").add(Ask("ask", provides="said"), Step("after"))
    return engines.load(flow, flow_detail=fd, book=book, backend=backend,
                        store={"url": url, "flow_uuid": "flow-1"}, **options)


def test_a_stored_request_suspends_the_running_engine(url: str) -> None:
    with opened(url) as backend:
        engine = _engine(url, backend, suspend_check_interval=0)
        engine.run()
        assert engine.storage.get_flow_state() == states.SUSPENDED
        assert engine.storage.get_atom_state("after") == states.PENDING
        said = engine.storage.fetch("said")
        assert "suspend requested for flow 'asked'" in said
        assert f"pid {os.getpid()} on {socket.gethostname()}" in said
        with contextlib.closing(backend.get_connection()) as conn:
            stored = conn.get_flow_details("flow-1", lazy=True)
        # Answered: the mark and the record of where it ran are gone with the run.
        assert stored.state == states.SUSPENDED
        assert sr.META_REQUEST not in stored.meta and sr.META_RUNNING_ON not in stored.meta
        engine.run()  # resumed: nothing asks again
        assert engine.storage.get_flow_state() == states.SUCCESS


def test_the_mark_is_read_once_per_interval(url: str) -> None:
    clock = ManualClock()
    reads = []
    with opened(url) as backend:
        _engine(url, backend)  # stores flow-1
        real = backend.get_connection

        def counted() -> Any:
            reads.append(1)
            return real()

        backend.get_connection = counted  # type: ignore[method-assign]
        watch = sr.SuspendWatch(backend, "flow-1", 0.5, clock=clock)
        assert not watch.requested() and reads == []  # not before the first interval
        clock.advance(0.5)
        assert not watch.requested() and len(reads) == 1
        assert not watch.requested() and len(reads) == 1
        with contextlib.closing(real()) as conn:
            conn.change_flow_meta("flow-1", lambda fd: fd.meta.update(
                {sr.META_REQUEST: {"by": "test"}}))
        clock.advance(0.5)
        assert watch.requested() and len(reads) == 2
        clock.advance(5)
        # Seen, and said once; read on (at the interval) only for a cancel request.
        assert not watch.requested() and len(reads) == 3 and watch.cancel is None
        with contextlib.closing(real()) as conn:
            conn.change_flow_meta("flow-1", lambda fd: fd.meta.update(
                {sr.META_CANCEL_REQUEST: {"by": "op", "at": "now", "reason": "gone"}}))
        clock.advance(0.5)
        assert not watch.requested() and len(reads) == 4
        assert watch.cancel is not None and watch.cancel.reason == "gone"
        clock.advance(5)
        assert not watch.requested() and len(reads) == 4  # both seen: never read again


def test_requests_for_flows_not_running_are_refused_by_name(url: str) -> None:
    with opened(url) as backend:
        engine = _engine(url, backend)
        with pytest.raises(sr.SuspendRefused, match=r"'asked' \(flow-1\) is PENDING, not "
                                                    r"running anywhere"):
            sr.request_suspend(backend, "flow-1", by="test")
        with pytest.raises(sr.SuspendRefused, match="no flow 'nope'"):
            sr.request_suspend(backend, "nope", by="test")
        # RUNNING in the store, but the process that ran it is gone (killed, say).
        with contextlib.closing(backend.get_connection()) as conn:
            def crashed(fd: models.FlowDetail) -> None:
                fd.state = states.RUNNING
                fd.meta[sr.META_RUNNING_ON] = {**sr.running_on("serial"), "pid": _dead_pid()}
            conn.change_flow_meta("flow-1", crashed)
        with pytest.raises(sr.SuspendRefused, match=r"its engine process \(pid \d+ on .*\) is "
                                                    r"gone: it is not running anywhere; resume"):
            sr.request_suspend(backend, "flow-1", by="test")
        del engine


def test_a_request_is_acknowledged_once(url: str) -> None:
    with opened(url) as backend:
        _engine(url, backend)
        with contextlib.closing(backend.get_connection()) as conn:
            conn.change_flow_meta("flow-1", lambda fd: setattr(fd, "state", states.RUNNING))
        first = sr.request_suspend(backend, "flow-1", by="test")
        assert first.first and first.running_on is None
        assert "suspend requested" in first.text
        assert "no engine recorded where it runs" in first.text
        again = sr.request_suspend(backend, "flow-1", by="test")
        assert not again.first and "was already requested at" in again.text


def test_memory_backends_and_bad_intervals() -> None:
    assert not sr.shared(backends.fetch("memory://")) and not sr.shared(None)
    with pytest.raises(ValueError, match="'suspend_check_interval' must be seconds >= 0"):
        sr.interval_of(-1)
    assert sr.interval_of(None) == sr.DEFAULT_INTERVAL


def _dead_pid() -> int:
    """A pid no process has (one that just exited)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid
