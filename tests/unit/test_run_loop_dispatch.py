"""The run loop dispatches a wide flow in slices without re-sorting what it carries over."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable
from typing import Any

import pytest

from flowengine import engines, states, task
from flowengine.engines import machine
from flowengine.flows import unordered_flow as uf

WIDTH = 2000


class Noop(task.Task):
    def execute(self) -> None:
        return None


class LaggingExecutor(cf.Executor):
    """Runs each task when the next one is submitted, so finished atoms are always waiting
    while the loop dispatches (it then cuts every batch short, after ``YIELD_AFTER``). The last
    one is run by a sweeper thread once submissions stop."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._last: tuple[cf.Future[Any], Callable[[], Any]] | None = None
        self._closed = False
        self._sweeper = threading.Thread(target=self._sweep, daemon=True)
        self._sweeper.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()
        with self._lock:
            previous, self._last = self._last, (future, lambda: fn(*args, **kwargs))
            self._lock.notify()
        if previous is not None:
            _run(*previous)
        return future

    def _sweep(self) -> None:
        with self._lock:
            while not self._closed:
                last = self._last
                # Quiet for a while (nothing submitted): nobody else will run the last one.
                if not self._lock.wait(timeout=0.02) and last is not None and last is self._last:
                    self._last = None
                    _run(*last)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._sweeper.join()


def _run(future: cf.Future[Any], call: Callable[[], Any]) -> None:
    if future.set_running_or_notify_cancel():
        future.set_result(call())


def test_a_wide_flow_is_sorted_once_not_once_per_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def counting_order(atom: Any) -> int:
        calls.append(atom.name)
        return -getattr(atom, "priority", 0)

    monkeypatch.setattr(machine, "_dispatch_order", counting_order)
    flow = uf.Flow("wide").add(*[Noop(f"t{i}") for i in range(WIDTH)])
    pool = LaggingExecutor()
    try:
        engine = engines.load(flow, engine="parallel", executor=pool)
        engine.run()
    finally:
        pool.shutdown()
    assert {engine.storage.get_atom_state(f"t{i}") for i in range(WIDTH)} == {states.SUCCESS}
    # Sorted once: every atom's key is computed once. Re-sorting the remainder at every slice
    # of YIELD_AFTER atoms computed about WIDTH**2 / (2 * YIELD_AFTER) keys (62,500 here).
    assert len(calls) == WIDTH
