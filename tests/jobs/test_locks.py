"""Locks and concurrency limits on Redis, ZooKeeper and etcd: the queues, their leases, and the
engine options and task declarations that use them.

Waits are on futures and events (``ticket.future.result``), never on sleeps; a lease lapse is
awaited on the real service, which is what it promises.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conductor_procs import ROOT
from coordination_stage import Coordinators, coordination_conf, coordinators
from manual_clock import ManualClock
from servers import require_module

from flowengine import coordination, engines, exceptions, states, task
from flowengine.engines.admission import META_COORDINATION, META_WAITING
from flowengine.flows import linear_flow, unordered_flow
from flowengine.persistence.backends import impl_memory

pytestmark = [pytest.mark.integration]
__all__ = ["coordination_conf", "coordinators"]

HERE = Path(__file__).resolve().parent


def _held(ticket: coordination.Ticket, timeout: float = 30.0) -> coordination.Ticket:
    return ticket.future.result(timeout=timeout)


def test_waiters_are_served_in_the_order_they_asked(coordinators: Coordinators) -> None:
    holder = coordinators(owner="holder").acquire("lb:1")
    waiters = [coordinators(owner=f"w{i}").request("lb:1", details={"job": f"job-{i}"})
               for i in range(3)]
    for waiter in waiters:
        assert not waiter.future.done()
    holder.release()
    for index, waiter in enumerate(waiters):
        _held(waiter)
        assert all(not later.future.done() for later in waiters[index + 1:])
        waiter.release()


def test_a_limit_lets_that_many_hold_at_once(coordinators: Coordinators) -> None:
    coordinator = coordinators()
    tickets = [coordinator.request("RebootHost", limit=3) for _ in range(5)]
    assert [t.future.done() for t in tickets] == [True, True, True, False, False]
    listed = [e for e in coordinators().listing() if e.key == "RebootHost"]
    assert [(e.position, e.holding, e.limit) for e in listed] == [
        (0, True, 3), (1, True, 3), (2, True, 3), (3, False, 3), (4, False, 3)]
    tickets[1].release()
    _held(tickets[3])
    assert not tickets[4].future.done()
    for ticket in tickets:
        ticket.release()
    assert [e for e in coordinator.listing() if e.key == "RebootHost"] == []


def test_asking_without_waiting_is_refused_naming_the_holder(coordinators: Coordinators) -> None:
    coordinators(owner="conductor-a").acquire(
        "lb:1", details={"job": "4f1c", "flow_name": "delete-lb"})
    with pytest.raises(coordination.LockHeld) as caught:
        coordinators().acquire("lb:1", wait=False)
    assert str(caught.value) == ("The lock 'lb:1' is held by job 4f1c flow delete-lb of "
                                 "conductor-a")
    # The refused ask left no entry behind.
    assert len([e for e in coordinators().listing() if e.key == "lb:1"]) == 1


def test_a_killed_holder_loses_the_lock_within_its_lease(coordination_conf: str,
                                                         coordinators: Coordinators) -> None:
    ttl = 3.0
    child = subprocess.Popen(
        [sys.executable, str(HERE / "lock_holder.py"), coordination_conf, "lb:1", str(ttl)],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        waiter = coordinators(ttl=ttl).request("lb:1")
        assert not waiter.future.done()
        assert waiter.waiting_for()["holders"] == ["job held-by-a-child of lock-holder"]
        child.kill()
        killed = time.monotonic()
        _held(waiter, timeout=ttl + 30)
        # The promise of doc/coordination.rst: free within the lease plus 2 s.
        assert time.monotonic() - killed < ttl + 2.0
    finally:
        child.kill()
        child.wait(10)


def test_a_waiter_whose_place_ended_joins_again(coordinators: Coordinators) -> None:
    holder = coordinators().acquire("lb:1")
    coordinator = coordinators()
    waiter = coordinator.request("lb:1")
    # Its entry ends behind its back (as when its lease lapses while it is frozen).
    coordinator.service.leave("lb:1", waiter.entry)
    old_entry = waiter.entry
    coordinator.renew_now()  # the renewal finds the entry gone, and the ticket joins again
    holder.release()
    _held(waiter)
    assert waiter.entry != old_entry


def test_closing_a_coordinator_releases_what_it_holds(coordinators: Coordinators) -> None:
    closing = coordinators(ttl=30.0)
    closing.acquire("lb:1")
    waiter = coordinators().request("lb:1")
    closing.close()
    _held(waiter, timeout=15.0)  # at once, not when the 30 s lease would have ended


def test_keys_and_limits_are_checked(coordinators: Coordinators) -> None:
    coordinator = coordinators()
    with pytest.raises(ValueError, match="non-empty string"):
        coordinator.request("")
    with pytest.raises(ValueError, match="control characters"):
        coordinator.request("lb:\n1")
    with pytest.raises(ValueError, match=r"limit of 'x' must be a whole number >= 1, not 0"):
        coordinator.request("x", limit=0)


# ---- engines -----------------------------------------------------------------------------------

#: The gates and run lists of the tests' flows, by name (stores hold JSON: the names).
GATES: dict[str, threading.Event] = {}
RAN: dict[str, list[str]] = {}


class Gated(task.Task):
    """Runs until its gate (``GATES[gate]``) is set; records that it ran in ``RAN[ran]``."""

    def execute(self, gate: str, ran: str) -> str:
        RAN[ran].append(self.name)
        assert GATES[gate].wait(30), "the test never opened the gate"
        return self.name


class RebootHost(Gated):
    """A task class with a concurrency limit in the tests."""


class UpdateBalancer(task.Task):
    """Holds the lock of the balancer it updates while it runs."""

    locks = ("lb:{lb_id}",)

    def execute(self, lb_id: int, seen: list[Any], coordinator: Any) -> None:
        seen.extend((e.key, e.holding, e.info.get("task")) for e in coordinator.listing())


class Migrate(task.Task):
    """Counts under its hypervisor's name (a named key), whatever its class."""

    concurrency_keys = ("hypervisor:{host}",)

    def execute(self, host: str, seen: list[Any], coordinator: Any) -> None:
        seen.extend((e.key, e.limit, e.info.get("kind")) for e in coordinator.listing())


def _engine(conf: str, flow: Any, **options: Any) -> Any:
    return engines.load(flow, coordination=conf, **options)


def _run_in_thread(engine: Any) -> cf.Future[None]:
    future: cf.Future[None] = cf.Future()

    def run() -> None:
        try:
            engine.run()
            future.set_result(None)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            future.set_exception(err)

    threading.Thread(target=run, daemon=True).start()
    return future


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """A gate the test opens (``GATES["gate"]``); opened at the end whatever happened."""
    event = GATES["gate"] = threading.Event()
    yield event
    event.set()


@pytest.fixture
def ran() -> list[str]:
    """What the tasks ran (``RAN["ran"]``), in order."""
    found: list[str] = []
    RAN["ran"] = found
    return found


#: The store of a flow of :class:`Gated` tasks.
GATED = {"gate": "gate", "ran": "ran"}


def _waiting_meta(engine: Any, name: str) -> Any:
    storage = engine.storage
    try:
        detail = storage.flow_detail.find(storage.get_atom_uuid(name))
    except exceptions.NotFound:
        return None  # not prepared yet
    return (detail.meta or {}).get(META_WAITING) if detail is not None else None


def _wait_until(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # another thread's engine: its storage has nothing to wait on
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout}s"
        time.sleep(0.01)


def test_a_task_waiting_for_a_limit_stays_pending_saying_what_it_waits_for(
        coordination_conf: str, gate: threading.Event, ran: list[str]) -> None:
    prometheus = require_module("prometheus_client")
    waiting = {"kind": "limit", "name": "RebootHost"}
    before = prometheus.REGISTRY.get_sample_value("flowengine_coordination_waiting",
                                                  waiting) or 0.0
    first = _engine(coordination_conf, linear_flow.Flow("first").add(RebootHost("reboot-a")),
                    store=GATED, concurrency={"RebootHost": 1})
    second = _engine(coordination_conf, linear_flow.Flow("second").add(RebootHost("reboot-b")),
                     store=GATED, concurrency={"RebootHost": 1})
    running = _run_in_thread(first)
    _wait_until(lambda: ran == ["reboot-a"], "the first task running")
    waited = _run_in_thread(second)
    _wait_until(lambda: _waiting_meta(second, "reboot-b"), "the second task waiting")
    storage = second.storage
    assert storage.get_atom_state("reboot-b") == states.PENDING
    shown = storage.flow_detail.find(storage.get_atom_uuid("reboot-b")).meta[META_WAITING]
    assert shown["key"] == "RebootHost" and shown["kind"] == "limit" and shown["limit"] == 1
    assert shown["holders"] == [f"flow first {first.storage.flow_uuid} task reboot-a of "
                                f"{shown['holders'][0].rpartition(' of ')[2]}"]
    assert prometheus.REGISTRY.get_sample_value("flowengine_coordination_waiting",
                                                waiting) == before + 1
    gate.set()
    running.result(30)
    waited.result(30)
    assert ran == ["reboot-a", "reboot-b"]
    assert storage.flow_detail.find(storage.get_atom_uuid("reboot-b")).meta[META_WAITING] is None
    assert prometheus.REGISTRY.get_sample_value("flowengine_coordination_waiting",
                                                waiting) == before


def test_a_flow_holds_its_locks_for_its_whole_run_and_releases_them(
        coordination_conf: str, coordinators: Coordinators, gate: threading.Event,
        ran: list[str]) -> None:
    flow = linear_flow.Flow("update-lb").add(Gated("step"))
    engine = _engine(coordination_conf, flow, store=GATED, locks=["lb:2", "lb:1"])
    running = _run_in_thread(engine)
    _wait_until(lambda: ran == ["step"], "the flow running")
    watcher = coordinators()
    assert sorted((e.key, e.holding, e.info["flow"]) for e in watcher.listing()) == [
        ("lb:1", True, engine.storage.flow_uuid), ("lb:2", True, engine.storage.flow_uuid)]
    assert engine.storage.flow_meta[META_COORDINATION] == {"locks": ["lb:1", "lb:2"]}
    gate.set()
    running.result(30)
    assert watcher.listing() == []
    assert engine.storage.flow_meta[META_COORDINATION] is None


def test_a_flow_rejecting_a_held_lock_runs_nothing(coordination_conf: str,
                                                   coordinators: Coordinators,
                                                   gate: threading.Event,
                                                   ran: list[str]) -> None:
    coordinators(owner="other").acquire("lb:1", details={"job": "j-1"})
    engine = _engine(coordination_conf, linear_flow.Flow("f").add(Gated("step")),
                     store=GATED, locks=["lb:1"], on_conflict="reject")
    with pytest.raises(coordination.LockHeld, match="The lock 'lb:1' is held by job j-1 of other"):
        engine.run()
    assert ran == []
    assert engine.storage.get_atom_state("step") == states.PENDING


def test_suspending_a_flow_that_waits_for_its_lock_ends_the_wait(
        coordination_conf: str, coordinators: Coordinators, gate: threading.Event,
        ran: list[str]) -> None:
    watcher = coordinators(owner="other")
    watcher.acquire("lb:1")
    engine = _engine(coordination_conf, linear_flow.Flow("f").add(Gated("step")),
                     store=GATED, locks=["lb:1"])
    running = _run_in_thread(engine)
    _wait_until(lambda: (engine.storage.flow_meta.get(META_COORDINATION) or {}).get("waiting"),
                "the flow waiting for its lock")
    waiting = engine.storage.flow_meta[META_COORDINATION]["waiting"]
    assert waiting["key"] == "lb:1" and waiting["holders"] == ["other"]
    engine.suspend()
    running.result(30)
    # Recorded as a run suspended before its first atom (a conductor hands its job back).
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert ran == []
    assert [e.info["owner"] for e in watcher.listing()] == ["other"]


def test_a_flow_halted_while_it_waits_for_its_lock_raises_run_halted(
        coordination_conf: str, coordinators: Coordinators, gate: threading.Event,
        ran: list[str]) -> None:
    # A conductor whose claim lapsed while its job waited for the lock.
    coordinators(owner="other").acquire("lb:1")
    engine = _engine(coordination_conf, linear_flow.Flow("f").add(Gated("step")),
                     store=GATED, locks=["lb:1"])
    running = _run_in_thread(engine)
    _wait_until(lambda: (engine.storage.flow_meta.get(META_COORDINATION) or {}).get("waiting"),
                "the flow waiting for its lock")
    engine.halt(exceptions.StorageFailure("its claim was lost"))
    with pytest.raises(exceptions.RunHalted, match="its claim was lost"):
        running.result(30)
    assert ran == []


def test_a_task_lock_is_named_by_its_arguments_and_held_while_it_runs(
        coordination_conf: str, coordinators: Coordinators) -> None:
    watcher = coordinators()
    seen: list[Any] = []
    engine = _engine(coordination_conf, linear_flow.Flow("f").add(UpdateBalancer("update")),
                     store={"lb_id": 7, "seen": seen, "coordinator": watcher})
    engine.run()
    assert seen == [("lb:7", True, "update")]
    assert watcher.listing() == []


def test_a_task_counts_under_its_named_keys(coordination_conf: str,
                                            coordinators: Coordinators) -> None:
    watcher = coordinators()
    seen: list[Any] = []
    engine = _engine(coordination_conf, linear_flow.Flow("f").add(Migrate("migrate")),
                     store={"host": "h1", "seen": seen, "coordinator": watcher},
                     concurrency={"hypervisor:h1": 2, "hypervisor:h2": 1})
    engine.run()
    assert seen == [("hypervisor:h1", 2, "limit")]


def test_a_task_limit_across_parallel_tasks_of_one_flow(coordination_conf: str,
                                                         gate: threading.Event,
                                                         ran: list[str]) -> None:
    flow = unordered_flow.Flow("many").add(*(RebootHost(f"reboot-{i}") for i in range(4)))
    engine = _engine(coordination_conf, flow, engine="parallel", max_workers=4,
                     store=GATED, concurrency={"RebootHost": 2})
    running = _run_in_thread(engine)
    _wait_until(lambda: len(ran) == 2, "two tasks running")
    pending = [n for n in (f"reboot-{i}" for i in range(4))
               if engine.storage.get_atom_state(n) == states.PENDING]
    assert len(pending) == 2 and len(ran) == 2
    gate.set()
    running.result(30)
    assert sorted(ran) == [f"reboot-{i}" for i in range(4)]


def test_a_lock_lost_while_held_halts_the_run(coordinators: Coordinators,
                                              gate: threading.Event, ran: list[str]) -> None:
    backend = impl_memory.MemoryBackend()
    engine = engines.load(linear_flow.Flow("f").add(Gated("a"), Gated("b")), backend=backend,
                          store=GATED, locks=["lb:1"],
                          coordination=coordinators(ttl=3.0))
    running = _run_in_thread(engine)
    _wait_until(lambda: ran == ["a"], "the first step running")
    # Its entry ends behind its back (its lease lapsed, as the service saw it): the keeper's
    # next renewal finds it gone and the run halts.
    [entry] = coordinators().listing()
    coordinators().service.leave("lb:1", entry.entry)
    _wait_until(lambda: engine.storage.unsaved is not None, "the run halting")
    gate.set()
    with pytest.raises(exceptions.RunHalted, match=r"the lease was lost"):
        running.result(60)
    assert ran == ["a"]
    assert _stored_states(backend, engine) == {"a": states.RUNNING, "b": states.PENDING}


def _stored_states(backend: Any, engine: Any) -> dict[str, str]:
    with contextlib.closing(backend.get_connection()) as conn:
        detail = conn.get_flow_details(engine.storage.flow_uuid)
    return {ad.name: ad.state for ad in detail if not ad.name.startswith("_")}


def test_a_lease_not_renewed_in_time_refuses_the_next_write(coordination_conf: str) -> None:
    # A process frozen past its lease: on waking, its lease clock says the lease may have
    # ended, so the write of the step's end is refused before the keeper renews anything.
    clock = ManualClock()
    coordinator = coordination.connect(coordination_conf, ttl=30.0, clock=clock)

    class Frozen(task.Task):
        def execute(self) -> None:
            clock.advance(60.0)

    backend = impl_memory.MemoryBackend()
    try:
        engine = engines.load(linear_flow.Flow("f").add(Frozen("frozen"), Frozen("after")),
                              backend=backend, coordination=coordinator, locks=["lb:1"])
        with pytest.raises(exceptions.RunHalted, match="its lease was not renewed in time"):
            engine.run()
        assert _stored_states(backend, engine) == {"frozen": states.RUNNING,
                                                   "after": states.PENDING}
    finally:
        coordinator.close()


def test_locks_without_a_coordination_service_are_refused_before_running() -> None:
    engine = engines.load(linear_flow.Flow("f").add(UpdateBalancer("update")),
                          store={"lb_id": 1, "seen": [], "coordinator": None})
    with pytest.raises(ValueError, match="needs a coordination service"):
        engine.run()


@pytest.mark.parametrize(("options", "message"), [
    ({"concurrency": {"RebootHost": 0}}, "'RebootHost' must map to a whole number >= 1"),
    ({"on_conflict": "queue"}, "'on_conflict' must be 'wait' or 'reject'"),
    ({"locks": [1]}, "'locks' must be a list of names"),
])
def test_bad_lock_options_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engines.load(linear_flow.Flow("f").add(Gated("a")), coordination="redis://x", **options)


def test_a_lock_naming_something_that_is_not_an_argument_is_named(coordination_conf: str) -> None:
    class Wrong(task.Task):
        locks = ("lb:{lb}",)

        def execute(self, lb_id: int) -> None:
            pass

    engine = _engine(coordination_conf, linear_flow.Flow("f").add(Wrong("wrong")),
                     store={"lb_id": 1})
    with pytest.raises(ValueError, match=r"Task 'wrong': lock or key 'lb:\{lb\}' names 'lb', "
                                         r"which is not one of its arguments \(lb_id\)"):
        engine.run()


def test_show_tells_which_locks_a_flow_holds_and_what_waits(
        coordination_conf: str, gate: threading.Event, ran: list[str], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from flowengine.cli.main import cli
    from flowengine.persistence import backends

    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    backend = backends.fetch(uri)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
    options = {"backend": backend, "store": GATED, "concurrency": {"RebootHost": 1}}
    holder = _engine(coordination_conf, linear_flow.Flow("holder").add(RebootHost("reboot-a")),
                     locks=["lb:1"], **options)
    limited = _engine(coordination_conf, linear_flow.Flow("limited").add(RebootHost("reboot-b")),
                      **options)
    locked = _engine(coordination_conf, linear_flow.Flow("locked").add(Gated("step")),
                     locks=["lb:1"], **options)
    try:
        runs = [_run_in_thread(holder)]
        _wait_until(lambda: ran == ["reboot-a"], "the holder running")
        runs += [_run_in_thread(limited), _run_in_thread(locked)]
        _wait_until(lambda: _waiting_meta(limited, "reboot-b") and (
            locked.storage.flow_meta.get(META_COORDINATION) or {}).get("waiting"),
            "both others waiting")

        def show(engine: Any) -> str:
            result = CliRunner().invoke(cli, ["show", engine.storage.flow_uuid, "--backend", uri])
            assert result.exit_code == 0, result.output
            return result.output

        assert "locks held: lb:1" in show(holder)
        shown = show(limited)
        [row] = [line for line in shown.splitlines() if line.startswith("reboot-b")]
        assert row.split()[2] == "WAITING", shown
        assert (f"limit 'RebootHost' 1 at once (held by flow holder "
                f"{holder.storage.flow_uuid} task reboot-a of ") in row
        assert f"waiting for lock 'lb:1' (held by flow holder {holder.storage.flow_uuid}" \
            in show(locked)
        gate.set()
        for run in runs:
            run.result(30)
        assert "WAITING" not in show(limited) and "locks held" not in show(holder)
    finally:
        gate.set()
        backend.close()
