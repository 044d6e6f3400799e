"""The test kit: a worker-based engine in the test's own process, on a clock that skips waits.

:class:`TestKit` runs a user's flow the way production runs it, on real workers over a broker,
but everything lives in the test process: the workers are threads serving the in-process memory
transport, and one :class:`~flowengine.testing.clock.ManualClock` stands for every clock the
engine reads. Nothing waits in real time:

- a retry's ``delay`` or a task's ``start_delay`` is skipped as soon as nothing else is running
  (no task call in progress, no request held by a worker, no outcome on its way to the engine),
  as Temporal's time-skipping test environment skips timers;
- losing a worker (:meth:`TestKit.lose_worker`) severs its connections as a killed process's
  are; its request goes back to the broker, another worker hands it back to the engine, and the
  kit moves the clock past the few seconds the engine then gives the lost worker to prove it
  lives, so the engine re-dispatches at once;
- a test moves the clock itself with :meth:`TestKit.advance` (past a time limit, say).

Every task call and side effect lands in :attr:`TestKit.ledger`, whose assertions say what ran,
what was undone and in which order. Faults are declared before a run (:meth:`fail_execute`,
:meth:`fail_revert`, :meth:`revert_twice`, :meth:`lose_worker`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from flowengine import engines, states
from flowengine import task as task_mod
from flowengine.engines import interception
from flowengine.testing import effects, faults
from flowengine.testing import ledger as lg
from flowengine.testing.clock import ManualClock
from flowengine.testing.skipping import WaitSkipper
from flowengine.testing.workers import Fleet, KitWorker
from flowengine.types.notifier import Notifier
from flowengine.worker_based.engine_side import lifecycle as wb_lifecycle

#: Engines the kit runs: the worker-based one (the default), or a local one.
ENGINES = ("worker-based", "serial", "parallel")
#: Seconds between a worker's lease heartbeats (real time, on the worker).
HEARTBEAT_INTERVAL = 1.0
#: The engine's lease on a running request, by the kit's clock: long enough that no skip of a
#: wait ever makes a live worker's lease lapse; a lost worker's lapses after the engine's
#: proof-of-life window instead (see the module docstring).
LEASE_TIMEOUT = 30 * 24 * 3600.0
#: How far the kit moves its clock at each step while the engine notices a lost worker.
LOSS_STEP = wb_lifecycle.PROOF_OF_LIFE * HEARTBEAT_INTERVAL + 0.5
#: Real seconds between two steps (the engine's consumer looks at leases ten times a second).
LOSS_STEP_EVERY = 0.02
#: Real seconds a run may take before the kit gives up on it (the default of ``run``).
RUN_TIMEOUT = 30.0
#: Real seconds the engine gets to react to a move of the clock (see Running.advance_until).
_REACT = 0.05
#: Atom states after which a task call's outcome has reached the engine.
_SETTLED = frozenset({states.SUCCESS, states.FAILURE, states.REVERTED, states.REVERT_FAILURE,
                      states.PENDING, states.RETRYING})

_active_lock = threading.Lock()
_active: TestKit | None = None


@dataclasses.dataclass
class Outcome:
    """How one :meth:`TestKit.run` ended.

    Attributes:
        run: The run's name in the ledger.
        engine: The engine that ran it (its ``storage`` holds the results).
        error: What ``engine.run()`` raised (None: nothing).
    """

    run: str
    engine: Any
    error: BaseException | None

    @property
    def state(self) -> str:
        """The flow's final state (SUCCESS, REVERTED, FAILURE...)."""
        return str(self.engine.storage.get_flow_state())

    @property
    def results(self) -> dict[str, Any]:
        """Every result the flow stored, by name."""
        return dict(self.engine.storage.fetch_all())

    def atom_state(self, name: str) -> str:
        """The final state of atom ``name``."""
        return str(self.engine.storage.get_atom_state(name))

    def failed_with(self, exc_type: type[BaseException]) -> bool:
        """Whether the run raised ``exc_type``, itself or as a remote task's failure (which
        arrives as data, wrapped, as in TaskFlow)."""
        error = self.error
        if error is None:
            return False
        if isinstance(error, exc_type):
            return True
        carried = list(error) if hasattr(error, "__iter__") else []  # WrappedFailure
        return any(getattr(f, "check", lambda *_: False)(exc_type) for f in carried)


class Running:
    """A flow the kit is running on a thread (see :meth:`TestKit.launch`)."""

    def __init__(self, kit: TestKit, run: str, engine: Any) -> None:
        self.kit, self.run, self.engine = kit, run, engine
        self._raised: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name=f"{kit.id}-run-{run}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.engine.run()
        except BaseException as err:  # handed to the test in the outcome
            self._raised.append(err)

    @property
    def done(self) -> bool:
        """Whether the flow ended."""
        return not self._thread.is_alive()

    def advance_until(self, seconds: float, until: Callable[[], bool] | None = None,
                      timeout: float | None = None) -> None:
        """Move the kit's clock ``seconds`` forward again and again, each time after the
        engine had a moment to react, until ``until()`` holds (default: the flow ended).

        One move may not be enough: the engine counts a remote task's time limit from when
        it heard the task start, which may come just after a move (the worker says so on
        its way into the task).

        Raises:
            AssertionError: It did not happen within ``timeout`` real seconds.
        """
        check = until or (lambda: self.done)
        limit = self.kit.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not check():
            if time.monotonic() >= deadline:
                raise AssertionError(f"moving the clock by {seconds}s at a time for {limit}s "
                                     f"of real time changed nothing; atom states: "
                                     f"{_atom_states(self.engine)}")
            self.kit.advance(seconds)
            self._thread.join(_REACT)

    def outcome(self, timeout: float | None = None) -> Outcome:
        """How the flow ended, once it did.

        Raises:
            AssertionError: It did not end within ``timeout`` real seconds (default the
                kit's); it is suspended, and the message names each atom's state.
        """
        limit = self.kit.timeout if timeout is None else timeout
        self._thread.join(limit)
        if self._thread.is_alive():
            self.engine.suspend()  # the atoms still running go on until they end
            self._thread.join(1.0)
            raise AssertionError(
                f"flow {self.engine.storage.flow_name!r} did not end within {limit}s of real "
                f"time (the kit's clock reads {self.kit.clock():.1f}); atom states: "
                f"{_atom_states(self.engine)}\n{self.kit.ledger.dump(self.run)}")
        return Outcome(self.run, self.engine, self._raised[0] if self._raised else None)


def task_classes(engine: Any) -> list[type[task_mod.Task]]:
    """The classes of the tasks an engine's flow runs."""
    return sorted({type(a) for a in engine.compilation.iter_atoms()
                   if isinstance(a, task_mod.Task)}, key=lambda c: c.__qualname__)


def dependencies(engine: Any) -> list[tuple[str, str]]:
    """``(earlier, later)`` task names of an engine's flow where ``later`` runs after
    ``earlier`` finished (so it is reverted first)."""
    compilation = engine.compilation
    tasks = [a for a in compilation.iter_atoms() if isinstance(a, task_mod.Task)]
    names = {a.name for a in tasks}
    return [(a.name, b.name) for a in tasks for b in compilation.successors_of(a)
            if b.name in names and b.name != a.name]


class _Hooks(faults.Hooks):
    """The kit's side of the recorder: which worker a call runs on, losing it, holding it."""

    def __init__(self, kit: TestKit) -> None:
        self._kit = kit

    def worker(self) -> str | None:
        fleet = self._kit._fleet
        found = fleet.of_thread(threading.current_thread().name) if fleet else None
        return found.name if found is not None else None

    def lose(self, worker: str | None, atom: str) -> None:
        self._kit._lose(worker, atom)

    def lost(self, worker: str | None) -> bool:
        fleet = self._kit._fleet
        found = fleet.named(worker) if fleet is not None and worker else None
        return found is not None and found.lost

    def hold(self) -> None:
        self._kit._closing.wait()

    def ended(self, atom: str) -> None:
        self._kit._call_ended(atom)


class TestKit:
    """Runs flows in this process on a skipping clock, with faults, into a ledger.

    Use it as a context manager (or call :meth:`close`); the pytest plugin
    (``flowengine.testing.pytest_plugin``) gives one per test as the ``flow_kit`` fixture.
    One kit is open at a time in a process: its clock and interceptor are process-wide.

    Args:
        engine: ``"worker-based"`` (the default), ``"serial"`` or ``"parallel"``.
        workers: Worker threads' count for the worker-based engine (each a worker).
        threads: Task threads of each worker.
        max_attempts: Attempts of a remote task whose workers are lost before it fails with
            ``WorkerLost``.
        timeout: Real seconds :meth:`run` lets a flow take before it fails the test.
        clock: The clock to use (default: a new :class:`ManualClock`).

    Attributes:
        clock: The clock every engine of the kit reads.
        ledger: Every task call and side effect of the kit's runs.

    Raises:
        ValueError: an engine the kit does not run.
        RuntimeError: another kit is open in this process.
    """

    # Not a test class, whatever pytest's name-based collection thinks.
    __test__ = False

    def __init__(self, engine: str = "worker-based", workers: int = 2, threads: int = 4,
                 max_attempts: int = 3, timeout: float = RUN_TIMEOUT,
                 clock: ManualClock | None = None) -> None:
        if engine not in ENGINES:
            raise ValueError(f"TestKit engine {engine!r} is not one of {', '.join(ENGINES)}")
        if workers < 1 or threads < 1:
            raise ValueError(f"TestKit needs at least one worker and one thread, not "
                             f"workers={workers}, threads={threads}")
        self.engine = engine
        self.clock = clock or ManualClock()
        self.ledger: lg.MemoryLedger = lg.MemoryLedger()
        self.max_attempts, self.timeout = max_attempts, timeout
        self.id = f"testkit-{uuid.uuid4().hex[:8]}"
        self._changed = threading.Condition()
        self._fleet = (Fleet(self.id, self.id, "testkit", workers, threads, self._poke)
                       if engine == "worker-based" else None)
        self._faults: list[faults.Fault] = []
        self._runs = 0
        self._run: str | None = None
        self._pending: set[str] = set()  # atoms whose call ended, outcome not yet heard
        self._engines: list[Any] = []
        self._closing = threading.Event()
        self._recorder = faults.Recorder(self.ledger, self._plan, _Hooks(self))
        self._skipper = WaitSkipper(self.clock, self._idle, self._changed)
        self._started = False
        self._in_force = contextlib.ExitStack()  # what start() put in force, undone by close()

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> TestKit:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self) -> None:
        """Put the kit's clock, interceptor and ledger in force in this process."""
        global _active
        with _active_lock:
            if _active is not None:
                raise RuntimeError(f"another TestKit ({_active.id}) is open in this process; "
                                   f"close it first")
            _active = self
        self._in_force.enter_context(interception.installed(self._recorder))
        self._in_force.callback(effects.use, effects.use(self.ledger))
        self._skipper.start()
        self._in_force.callback(self._skipper.stop)
        self._started = True

    def close(self) -> None:
        """Stop the workers and take the kit's clock, interceptor and ledger out of force."""
        global _active
        if self._closing.is_set():
            return
        self._closing.set()  # lost workers' threads end
        if self._fleet is not None:
            self._fleet.stop()
        self._in_force.close()
        with _active_lock:
            if _active is self:
                _active = None

    # -- faults -------------------------------------------------------------------------------

    def inject(self, fault: faults.Fault) -> faults.Fault:
        """Put ``fault`` in force for the runs to come; return it."""
        if fault.kind == faults.LOSE and self._fleet is None:
            raise ValueError(f"{fault}: losing a worker needs the worker-based engine, not "
                             f"{self.engine!r}")
        self._faults.append(fault)
        return fault

    def fail_execute(self, atom: str, attempt: int | None = None) -> faults.Fault:
        """``atom``'s execute raises :class:`~flowengine.testing.InjectedFault` instead of
        running, on ``attempt`` (the Nth call of it in the run) or every attempt."""
        return self.inject(faults.fail_execute(atom, attempt))

    def fail_revert(self, atom: str, attempt: int | None = None) -> faults.Fault:
        """``atom``'s revert raises :class:`~flowengine.testing.InjectedFault` instead."""
        return self.inject(faults.fail_revert(atom, attempt))

    def revert_twice(self, atom: str | None = None) -> faults.Fault:
        """``atom``'s revert (every atom's if None) runs twice in a row."""
        return self.inject(faults.revert_twice(atom))

    def lose_worker(self, atom: str, attempt: int | None = 1,
                    after_effects: bool = False) -> faults.Fault:
        """The worker running ``atom``'s execute (on ``attempt``) is lost: before the task's
        code runs, or after it ran (``after_effects``: its effects happened, its outcome never
        reaches the engine, which runs it again)."""
        return self.inject(faults.lose_worker(atom, attempt, after_effects))

    def clear_faults(self) -> None:
        """No fault is in force any more."""
        self._faults.clear()

    def _plan(self) -> faults.Plan:
        return faults.Plan(self._run, tuple(self._faults))

    # -- running ------------------------------------------------------------------------------

    def load(self, flow: Any, store: Mapping[str, Any] | None = None, **options: Any) -> Any:
        """Load ``flow`` into the kit's engine (options as ``engines.load`` takes them).

        Raises:
            ValueError: A task of the flow cannot run on a worker (a worker builds a task
                from its class and name alone).
        """
        if self._closing.is_set() or not self._started:
            raise RuntimeError(f"TestKit {self.id} is not open (use it in a with block)")
        defaults: dict[str, Any] = {"retry_clock": self.clock}
        if self._fleet is not None:
            defaults.update(
                exchange=self._fleet.exchange, topics=[self._fleet.topic], transport="memory",
                clock=self.clock, lease_timeout=LEASE_TIMEOUT,
                heartbeat_interval=HEARTBEAT_INTERVAL, max_attempts=self.max_attempts,
                # Waits are skipped: nothing may time out for the time a skip passes over.
                worker_expiry=None, transition_timeout=None, unserved_timeout=None,
                events=False)
        engine = engines.load(flow, store=store, engine=self.engine, **{**defaults, **options})
        if self._fleet is not None:
            classes = task_classes(engine)
            _check_remote(engine)
            self._fleet.serve(classes)
        self._skipper.watch(engine)
        engine.atom_notifier.register(Notifier.ANY, self._atom_changed)
        self._engines.append(engine)
        return engine

    def run(self, flow: Any, store: Mapping[str, Any] | None = None,
            timeout: float | None = None, **options: Any) -> Outcome:
        """Run ``flow`` to its end (a new run in the ledger) and say how it ended.

        What ``engine.run()`` raises is kept in the outcome, not raised.

        Raises:
            AssertionError: The flow did not end within ``timeout`` real seconds (default
                the kit's); the message names each atom's state.
        """
        return self.launch(flow, store, **options).outcome(timeout)

    def launch(self, flow: Any, store: Mapping[str, Any] | None = None,
               **options: Any) -> Running:
        """Start running ``flow`` (a new run in the ledger) on a thread; the test goes on
        (to move the clock, say) and takes its outcome from the :class:`Running` handle."""
        self._runs += 1
        self._run = str(self._runs)
        return Running(self, self._run, self.load(flow, store=store, **options))

    def advance(self, seconds: float) -> None:
        """Move the kit's clock ``seconds`` forward now (past a time limit, say); retry waits
        due by then end."""
        self.clock.advance(seconds)
        self._skipper.check_timers()

    def dependencies(self, outcome: Outcome) -> list[tuple[str, str]]:
        """The ``(earlier, later)`` pairs of ``outcome``'s flow, for ``assert_compensated``."""
        return dependencies(outcome.engine)

    def assert_compensated(self, outcome: Outcome) -> None:
        """The compensation of ``outcome``'s run holds (see
        :meth:`~flowengine.testing.ledger.Ledger.assert_compensated`)."""
        self.ledger.assert_compensated(outcome.run, dependencies(outcome.engine),
                                       tolerant=tolerant_atoms(outcome.engine))

    # -- skipping waits -----------------------------------------------------------------------

    def _poke(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _call_ended(self, atom: str) -> None:
        with self._changed:
            self._pending.add(atom)
            self._changed.notify_all()

    def _atom_changed(self, state: str, details: dict[str, Any]) -> None:
        name = details.get("task_name")
        if state in _SETTLED and name is not None:
            with self._changed:
                self._pending.discard(str(name))
                self._changed.notify_all()

    def _idle(self) -> bool:
        return (self._recorder.active == 0 and not self._pending
                and not (self._fleet is not None and self._fleet.busy))

    # -- losing workers -----------------------------------------------------------------------

    def _lose(self, name: str | None, atom: str) -> None:
        fleet = self._fleet
        worker = fleet.named(name) if fleet is not None and name else None
        if fleet is None or worker is None:
            faults.Hooks().lose(name, atom)  # raises, saying why it cannot be done
            return
        fleet.lose(worker)
        threading.Thread(target=self._skip_lease, args=(worker, atom),
                         name=f"{self.id}-lease-{worker.name}", daemon=True).start()

    def _skip_lease(self, worker: KitWorker, atom: str) -> None:
        """Move the clock past the lost worker's proof-of-life window, a step at a time, until
        the engine gave the call to another worker or gave up on it (or a run's timeout of
        real time passed: the run fails then, saying where it stood)."""
        seen = len(self.ledger.entries())
        deadline = time.monotonic() + self.timeout

        def moved_on() -> bool:
            return any(e.atom == atom and e.kind in (lg.CALL, lg.FAULT) and e.worker != worker.name
                       for e in self.ledger.entries()[seen:]) or atom not in self._running()

        while time.monotonic() < deadline:
            if self._closing.is_set() or moved_on():
                return
            self.clock.advance(LOSS_STEP)
            self._closing.wait(LOSS_STEP_EVERY)

    def _running(self) -> set[str]:
        names: set[str] = set()
        for engine in self._engines:
            storage = engine.storage
            names.update(a.name for a in engine.compilation.iter_atoms()
                         if storage.get_atom_state(a.name) in (states.RUNNING, states.REVERTING))
        return names


def _atom_states(engine: Any) -> dict[str, str]:
    storage = engine.storage
    return {a.name: str(storage.get_atom_state(a.name)) for a in engine.compilation.iter_atoms()}


def tolerant_atoms(engine: Any) -> frozenset[str]:
    """The tasks of an engine's flow marked :func:`reverts_without_execute`."""
    return frozenset(a.name for a in engine.compilation.iter_atoms()
                     if getattr(a, "reverts_without_execute", False))


def _check_remote(engine: Any) -> None:
    """Refuse a task a worker cannot build from its class and name alone."""
    for atom in engine.compilation.iter_atoms():
        if not isinstance(atom, task_mod.Task):
            continue
        try:
            type(atom)(name=atom.name)
        except Exception as err:
            raise ValueError(
                f"task {atom.name!r} ({type(atom).__qualname__}) cannot run on a worker: a "
                f"worker builds it from its class and name alone, and "
                f"{type(atom).__name__}(name={atom.name!r}) raised {type(err).__name__}: "
                f"{err}; run it with TestKit(engine='serial'), or give it its behaviour "
                f"through arguments") from err


def reverts_without_execute(cls: type[task_mod.Task]) -> type[task_mod.Task]:
    """Mark a task class whose revert may run, and change things, though its execute never
    completed (the rehearsal and ``assert_compensated`` then do not flag it)."""
    cls.reverts_without_execute = True  # type: ignore[attr-defined]
    return cls
