"""Action engines: compile a flow, keep its state in storage, and run it to an end state."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine import flow as flow_base
from flowengine import hooks as hk
from flowengine import states
from flowengine.atom import Atom
from flowengine.engines import executor as ex
from flowengine.engines import repair as repairing
from flowengine.engines import setup_slots, shapes, stopping
from flowengine.engines import suspend_requests as sr
from flowengine.engines.admission import META_COORDINATION, Admission, FlowLocks, TaskGate
from flowengine.engines.compiler import Compilation, PatternCompiler
from flowengine.engines.delays import RetryWaits
from flowengine.engines.machine import META_STATES, RunLoop
from flowengine.engines.options import EngineOptions, as_optional_int
from flowengine.engines.runtime import Runtime
from flowengine.persistence.base import Backend
from flowengine.persistence.models import FlowDetail
from flowengine.secrets import secret_sources
from flowengine.storage import Storage
from flowengine.types.failure import Failure
from flowengine.types.notifier import Notifier

LOG = logging.getLogger(__name__)


class ActionEngine:
    """Runs a flow by acting on its atoms: execute, revert, retry.

    Args:
        flow: the flow (or single atom) to run.
        flow_detail: where the run's state lives.
        backend: persistence backend the state is written through to (or None).
        options: engine options (see :class:`~flowengine.engines.options.EngineOptions`).
    """

    #: States the loop passes through that are not flow states.
    IGNORABLE_STATES = frozenset((states.SCHEDULING, states.WAITING, states.RESUMING,
                                  states.ANALYZING))
    #: End states after which no failure is re-raised.
    NO_RERAISING_STATES = frozenset((states.SUSPENDED, states.SUCCESS))
    #: The engine's name in messages about its options.
    KIND = "action"
    #: The options it reads beyond :class:`EngineOptions`' fields (the local executors'
    #: ``max_async_tasks``); any other that TaskFlow does not know either is refused, with the
    #: nearest known name.
    EXTRA_OPTIONS = frozenset({"max_async_tasks"})

    def __init__(self, flow: flow_base.Flow | Atom, flow_detail: FlowDetail,
                 backend: Backend | None, options: Mapping[str, Any] | None) -> None:
        self._flow = flow
        self._flow_detail = flow_detail
        self._backend = backend
        self._options = EngineOptions.from_mapping(options, self.KIND, self.EXTRA_OPTIONS)
        self._given_options = dict(options or {})
        #: What attaches to this engine (see :mod:`flowengine.hooks`): option ``hooks``, else
        #: the process's defaults as they are now.
        self.hooks = hk.Hooks(hk.defaults if self._options.hooks is None else self._options.hooks)
        self._notifier = Notifier()
        self._atom_notifier = Notifier()
        self._interventions = Notifier()
        self._repairs: list[repairing.Repair] = []  # asked for, made as the next run starts
        self._retry_waits = RetryWaits(self._options.retry_clock or time.monotonic)
        self._storage: Storage | None = None
        self._compilation: Compilation | None = None
        self._runtime: Runtime | None = None
        self._storage_ensured = False
        self._validated = False
        self._lock = threading.RLock()
        self._cancel_lock = threading.Lock()
        self._statistics: dict[str, Any] = {}
        self._loop: RunLoop | None = None  # the run loop while run_iter runs
        #: The cancel asked of this engine (see cancel), applied by the run it reaches.
        self._cancel: stopping.CancelRequest | None = None
        self._watch: sr.SuspendWatch | None = None  # reads requests stored while it runs
        # The clock deadlines are stored by (epoch seconds): the retry clock tests inject.
        self._epoch_clock = self._options.retry_clock or time.time
        # Locks and concurrency limits (options locks, concurrency, coordination).
        self._admission = Admission(self._options.admission)
        self._flow_locks: FlowLocks | None = None  # while a run holds or waits for its locks

    # -- public properties ------------------------------------------------------------------

    @property
    def notifier(self) -> Notifier:
        """Flow state changes are announced here (details: flow_name, flow_uuid, old_state)."""
        return self._notifier

    @property
    def atom_notifier(self) -> Notifier:
        """Atom state changes are announced here.

        Details: ``task_name`` or ``retry_name``, its uuid, ``old_state`` and the result.
        """
        return self._atom_notifier

    @property
    def interventions(self) -> Notifier:
        """An operator's interventions are announced here (flowengine addition): ``cancelled``
        (details: flow_name, flow_uuid, reason, by, at) as a cancel is applied, and
        ``repaired`` (the same, with action, atom and atoms) as a repair is made."""
        return self._interventions

    @property
    def retry_waits(self) -> RetryWaits:
        """Retry waits (delay/backoff) are announced here as they start, resume and end."""
        return self._retry_waits

    @property
    def options(self) -> dict[str, Any]:
        """The engine's options, as given (TaskFlow's engines return them unresolved)."""
        return self._given_options

    @property
    def storage(self) -> Storage:
        """The run's :class:`~flowengine.storage.Storage`."""
        if self._storage is None:
            self._storage = Storage(self._flow_detail, backend=self._backend)
            self._storage.declare_secret_sources(secret_sources(self._flow))
        return self._storage

    @property
    def statistics(self) -> dict[str, Any]:
        """Counters and timings of the last run."""
        return self._statistics

    def atoms_in_flight(self) -> int | None:
        """How many atoms the running engine has started and not yet recorded the outcome of
        (running, waiting for a thread or a worker, or just finished), now, from any thread.

        Atoms a suspension or a cancel took back before they started are not counted.

        Returns:
            The count, or None when the engine is not running.
        """
        loop = self._loop  # read once: the run ends (and drops it) on its own thread
        return None if loop is None else loop.in_flight()

    @property
    def compilation(self) -> Compilation:
        """The compiled flow (compiles on first use)."""
        self.compile()
        assert self._compilation is not None
        return self._compilation

    # -- lifecycle --------------------------------------------------------------------------

    def _task_executor(self) -> ex.TaskExecutor:
        return ex.SerialTaskExecutor(**self._local_options())

    def _local_options(self) -> dict[str, Any]:
        """The options of the local executors: ``time_limits`` and ``max_async_tasks``."""
        return {"time_limits": self._options.time_limits, "hooks": self.hooks,
                "max_async_tasks": as_optional_int(
                    "max_async_tasks", self._options.extra.get("max_async_tasks"))}

    def compile(self) -> None:
        """Compile the flow into its execution graph (once)."""
        if self._compilation is not None:  # set once, never undone: no lock, no set-up slot
            return
        with self._lock, self._admitted():
            if self._compilation is not None:
                return
            compilation = PatternCompiler(self._flow).compile()
            self._admission.check(compilation.iter_atoms())
            executor = self._task_executor()
            if not executor.runs_coroutines:
                self._refuse_coroutines(compilation)
            self._runtime = Runtime(compilation, self.storage, self._atom_notifier,
                                    executor, self._options, self._retry_waits,
                                    self._interventions, self.hooks)
            self._compilation = compilation

    def _refuse_coroutines(self, compilation: Compilation) -> None:
        """Refuse ``async def`` tasks before anything runs, on an engine that cannot await them."""
        for atom in compilation.iter_atoms():
            methods = ex.async_methods(atom)
            if methods:
                raise exc.NotImplementedError(
                    f"Task {atom.name!r} has async def {' and '.join(methods)}, which the "
                    f"{type(self).__name__}'s task executor cannot await; run it on an engine "
                    f"that can, or make it a plain def")

    def _change_state(self, state: str) -> None:
        moved, old_state = self.storage.change_flow_state(state)
        if moved:
            self._notifier.notify(state, {
                "engine": self,
                "flow_name": self.storage.flow_name,
                "flow_uuid": self.storage.flow_uuid,
                "old_state": old_state,
            })

    def prepare(self) -> None:
        """Make sure every atom has a stored record; reset a flow that ended REVERTED."""
        # The engine's lock before a set-up slot, here as in run(): one order, no deadlock.
        with self._lock, self._admitted():
            self.compile()
            if not self._storage_ensured:
                # Before anything is written: a flow stored by code of another shape is
                # refused unless a migration says how to go on (see shapes).
                change, shape = shapes.check(self.storage.flow_detail, self.compilation)
                self._change_state(states.RESUMING)
                storage = self.storage
                atoms = self.compilation.declared
                storage.ensure_atoms(atoms)
                for atom in atoms:
                    if atom.inject:
                        storage.inject_atom_args(atom.name, atom.inject,
                                                 transient=self._options.inject_transient)
                if change is not None:
                    migrate = shapes.migration_for(storage.flow_detail)
                    assert migrate is not None
                    migrate(change, storage)
                    storage.update_flow_metadata({shapes.META_SHAPE: shape})
                elif shape is not None and storage.flow_meta.get(shapes.META_SHAPE) != shape:
                    # Stored with the flow's next write (its state, as the run starts).
                    storage.flow_meta[shapes.META_SHAPE] = shape
                self._change_state(states.SUSPENDED)
                self._storage_ensured = True
            assert self._runtime is not None
            # A repair asked for runs on from what is stored (a retry-from on a reverted flow).
            if self.storage.get_flow_state() == states.REVERTED and not self._repairs:
                self.reset()

    def validate(self) -> None:
        """Check that every atom's arguments can be satisfied, before anything runs.

        Raises:
            MissingDependencies: naming the atom (or the flow, when several atoms miss
                something) and the missing names.
        """
        with self._lock, self._admitted():
            self._validate()

    def _validate(self) -> None:
        self.prepare()
        secrets_missing = self.storage.missing_secrets()
        if secrets_missing and self.storage.get_flow_state() != states.SUCCESS:
            raise exc.MissingSecrets(self._flow, secrets_missing)
        missing: set[str] = set()
        last_cause: exc.MissingDependencies | None = None
        culprits = 0
        last_atom: Atom | None = None
        storage = self.storage
        for atom in self.compilation.iter_atoms():
            for method, mapping, optional in (
                    ("execute", atom.rebind, atom.optional),
                    ("revert", atom.revert_rebind, atom.revert_optional)):
                lacking = storage.fetch_unsatisfied_args(atom.name, mapping,
                                                         optional_args=optional)
                if lacking:
                    last_cause = exc.MissingDependencies(
                        atom, sorted(lacking), cause=last_cause, method=method)
                    culprits += 1
                    last_atom = atom
                    missing.update(lacking)
        if missing:
            assert last_cause is not None
            # As TaskFlow: the flow is named, and each atom's own error is in the cause chain.
            if culprits == 1 and self._flow is last_atom:
                raise last_cause
            raise exc.MissingDependencies(self._flow, sorted(missing), cause=last_cause)
        self._validated = True

    def reset(self) -> None:
        """Put every atom back to PENDING and the flow to PENDING, to run it again."""
        self.compile()
        with self._lock:
            assert self._runtime is not None
            self._runtime.reset_all()
            # A flow run again from the start is neither cancelled nor bounded by the
            # deadline of its earlier run (written with the state change below).
            self.storage.flow_meta.pop(stopping.META_CANCELLED, None)
            self.storage.flow_meta.pop(stopping.META_DEADLINE, None)
            self._change_state(states.PENDING)

    def suspend(self) -> None:
        """Ask a running engine to stop: running atoms finish, nothing new starts.

        If the SUSPENDING state cannot be stored (the backend is gone, or a conductor's claim
        lapsed), a running engine halts instead (see :meth:`halt`).
        """
        try:
            self._change_state(states.SUSPENDING)
        except exc.StorageFailure as err:
            if self._loop is None:
                raise
            self.halt(err)
            return
        if self._flow_locks is not None:
            self._flow_locks.stop()  # a run still waiting for its locks starts nothing
        if self._runtime is not None:
            # A retry waiting out its delay has not started anything: stop waiting now.
            self._runtime.timer.cancel_all()
        loop = self._loop
        if loop is not None:
            loop.wake()  # cancel what has not started now, not after the next completion

    def halt(self, cause: exc.StorageFailure) -> None:
        """Stop at once without recording or reverting anything more (from any thread).

        For a process that knows its writes are no longer its to make, such as a conductor
        whose claim on the job may have lapsed. Nothing more is started or reverted, what has
        not started is cancelled, and ``run`` raises
        :class:`~flowengine.exceptions.RunHalted` once what is running has finished; the
        stored record stays as the last successful write left it. An engine also halts by
        itself when a write of its progress fails.

        Args:
            cause: Why its writes stopped (named by the ``RunHalted`` raised).
        """
        self.storage.stop_writing(cause)
        if self._flow_locks is not None:
            self._flow_locks.stop()
        loop = self._loop
        if loop is not None:
            loop.halt(cause)

    def cancel(self, reason: str = "cancelled", by: str = "engine.cancel") -> None:
        """Cancel the flow and undo what it did (callable from any thread, before or during a
        run).

        What has not started is taken back (revoked on workers) and left as if it never ran;
        running tasks are asked to stop (their context's ``cancel_requested``; an ``async
        def`` task is interrupted at its next await; on workers through the broker), and are
        waited for; then every completed atom is reverted in reverse order, no retry
        controller retries anything, and the flow ends ``REVERTED``, ``run`` raising
        :class:`~flowengine.exceptions.FlowCancelled`. Who asked, when and why are stored in
        the flow detail's meta (``cancelled``). Only the first cancel counts; a flow whose
        every atom already succeeded is left as it is.

        Args:
            reason: Why (shown by ``flowengine show``, the dashboard and events).
            by: Who asks.

        Raises:
            ValueError: ``reason`` or ``by`` is empty.
        """
        self._request_cancel(stopping.CancelRequest.now(reason, by))

    def _request_cancel(self, request: stopping.CancelRequest) -> None:
        with self._cancel_lock:
            if self._cancel is not None:
                return
            self._cancel = request
        runtime = self._runtime
        if runtime is not None and runtime.task_action.executor.runs_inline:
            # A task running on the engine's own thread must hear it now: the loop only gets
            # its thread back when the task returns. (Elsewhere the loop tells running tasks
            # once it has taken back those not started.)
            runtime.calls.signal.request(request.reason)
        loop = self._loop
        if loop is not None:
            loop.cancel(request)

    def repair(self, action: str, atom: str | None = None, reason: str | None = None,
               by: str = "engine.repair") -> None:
        """Repair the stored flow as its next run starts (see :mod:`flowengine.engines.repair`).

        ``retry-reverts`` runs its failed reverts again; ``mark-reverted`` stores ``atom`` as
        reverted on the operator's word; ``retry-from`` runs on from ``atom``, whose execute
        failed. The run then finishes the flow; the repair is recorded in the flow's and the
        atoms' metadata and announced on :attr:`interventions`. Checked now, against the flow
        as stored: call it on an engine loaded on the stored flow, before ``run``.

        Raises:
            RepairRefused: the repair does not fit the flow's state.
            ValueError: a bad repair (unknown action, missing atom or reason).
        """
        request = repairing.Repair.now(action, atom, reason, by)
        with self._lock:
            self.compile()
            repairing.check(self.storage, self.compilation, request)
            self._repairs.append(request)

    def _make_repairs(self) -> None:
        assert self._runtime is not None
        while self._repairs:
            request = self._repairs.pop(0)
            changed = repairing.apply(self._runtime, request)
            self._interventions.notify(repairing.REPAIRED, {
                "flow_name": self.storage.flow_name, "flow_uuid": self.storage.flow_uuid,
                **request.record(changed)})

    @property
    def cancelled(self) -> stopping.CancelRequest | None:
        """A cancel asked of this engine (or found stored with its flow) that no run has taken
        up yet: a run that starts applies it, and one running applies it at once."""
        return self._cancel

    def _admitted(self) -> contextlib.AbstractContextManager[None]:
        """A set-up slot: in the wide pool if the storage does I/O (see setup_slots)."""
        return setup_slots.admitted(io=sr.shared(self._backend))

    def _set_up(self) -> None:
        """What a run does before its first atom (holding a set-up slot): validate."""
        self.validate()

    def _watch_requests(self) -> sr.SuspendWatch | None:
        """What reads suspend requests from other processes (None: none can reach the flow)."""
        backend = self._backend
        if not sr.shared(backend):
            return None
        return sr.SuspendWatch(backend, self.storage.flow_uuid,
                               self._options.suspend_check_interval)

    def _act_on_marks(self, suspend_seen: bool) -> None:
        """Do what the flow's stored marks ask, just read (any thread)."""
        watch = self._watch
        if suspend_seen:
            self.suspend()
        if watch is not None and watch.cancel is not None and self._cancel is None:
            self._request_cancel(watch.cancel)

    def _read_marks_now(self) -> None:
        """Read the flow's marks at once (the broker said there is news) and act on them."""
        watch = self._watch
        if watch is not None:
            self._act_on_marks(watch.requested(force=True))

    def _reach(self) -> dict[str, Any]:
        """More of ``running_on``: how else a requester can reach this engine while it runs."""
        return {}

    def _forget_run(self) -> None:
        # Stored with the end state: the flow runs nowhere now, and a request is answered.
        self.storage.flow_meta.pop(sr.META_RUNNING_ON, None)
        self.storage.flow_meta.pop(sr.META_REQUEST, None)

    def run(self, timeout: float | None = None) -> None:
        """Run the flow to an end state, re-raising its failure(s) if it did not succeed.

        Args:
            timeout: the longest single wait for running atoms (not a deadline).
        """
        if not self._lock.acquire(blocking=False):
            raise exc.ExecutionFailure("Engine currently locked, please try again later")
        try:
            for _state in self.run_iter(timeout=timeout):
                pass
        finally:
            self._lock.release()

    def run_iter(self, timeout: float | None = None) -> Iterator[str]:
        """Run the flow, yielding each state the engine enters.

        Sending a truthy value into the generator asks the engine to suspend.
        """
        with self.hooks.whole_run(self):
            with self._lock, self._admitted():  # once, however many set-up steps there are
                self._set_up()
                self._make_repairs()
            if self._admission.needed_by(self.compilation.iter_atoms()):
                yield from self._run_admitted(timeout)
            else:
                yield from self._run(timeout)

    def _run_admitted(self, timeout: float | None) -> Iterator[str]:
        """A run that holds locks or limits (see :mod:`~flowengine.engines.admission`): the
        flow's own locks first, released (and the tasks' with them) however the run ends."""
        assert self._runtime is not None
        self.storage.flush_unsaved()  # before the locks' waits are recorded
        locks = self._flow_locks = FlowLocks(self._admission, self.storage, self.halt)
        gate: TaskGate | None = None
        try:
            if not locks.take():  # suspended (or halted) while it waited: nothing started
                if self.storage.unsaved is not None:
                    raise self._halted(self.storage.unsaved)
                # Recorded as a run suspended before its first atom, so that whoever ran it
                # (a conductor) hands it back rather than taking it for finished.
                for state in (states.RUNNING, states.SUSPENDING, states.SUSPENDED):
                    self._change_state(state)
                yield states.SUSPENDED
                return
            gate = self._runtime.gate = TaskGate(self._admission, self.storage, locks.keys,
                                                 self.halt)
            yield from self._run(timeout)
        finally:
            self._flow_locks = None
            self._runtime.gate = None
            if self.storage.unsaved is None:  # a halted run writes nothing more
                with contextlib.suppress(exc.StorageFailure):
                    self.storage.update_flow_metadata({META_COORDINATION: None})
            if gate is not None:
                gate.release_all()
            locks.release()

    def _run(self, timeout: float | None) -> Iterator[str]:
        assert self._runtime is not None
        # A previous run halted with changes only in memory: they are what this process did,
        # and must reach the backend before anything more runs (or this run fails here).
        self.storage.flush_unsaved()
        executor = self._runtime.task_action.executor
        final: str | None = None
        started = time.monotonic()
        watch = self._watch = self._watch_requests()
        deadline = self._deadline()
        signal = self._runtime.calls.new_run(deadline)
        with _started(executor), self.hooks.run(self):
            self._change_state(states.RUNNING)  # with the deadline, if it was just set
            if watch is not None:
                self.storage.update_flow_metadata({sr.META_RUNNING_ON: {
                    **sr.running_on(type(self).__name__), **self._reach()}})
            loop = self._loop = RunLoop(self._runtime, self._statistics, timeout=timeout)
            if self.storage.unsaved is not None:  # halted while the run was starting
                loop.halt(self.storage.unsaved)
            self._resume_cancel()
            with self._cancel_lock:
                request = self._cancel
            if request is not None:  # asked before the run started (or stored with it)
                signal.request(request.reason)
                loop.cancel(request)
            if deadline is not None:
                self._arm_deadline(deadline)
            if watch is not None:
                sr.POLLER.add(watch, self._act_on_marks)  # read it while atoms run long
            closed = False
            try:
                for state in loop.run_iter():
                    if watch is not None:
                        self._act_on_marks(watch.requested())
                    if state in META_STATES:
                        continue
                    final = state
                    if state == states.FAILURE:
                        if loop.halted is not None:
                            raise self._halted(loop.halted)
                        Failure.reraise_if_any(loop.failures)
                    if closed:
                        continue
                    try:
                        try_suspend = yield state
                    except GeneratorExit:
                        closed = True
                        self.suspend()
                    else:
                        if try_suspend:
                            self.suspend()
            except exc.RunHalted:
                raise  # nothing more is written: the stored record stays as it was
            except Exception:
                # Not BaseException: on SystemExit or KeyboardInterrupt the process stops but the
                # flow did not fail; it stays RUNNING, as on TaskFlow, for a later engine to resume.
                self._forget_run()
                try:
                    self._change_state(states.FAILURE)
                except Exception:
                    # The error being raised names what failed first; a later one (often the
                    # same fault again) must not hide it, so it is logged.
                    LOG.exception(
                        "Could not store flow %r (%s) as FAILURE either",
                        self.storage.flow_name, self.storage.flow_uuid)
                raise
            finally:
                if watch is not None:
                    sr.POLLER.remove(watch)
                with self._cancel_lock:
                    if loop.cancel_seen and self._cancel is loop.cancelled:
                        self._cancel = None  # taken up by this run: not the next one's
                self._watch = None
                self._loop = None
                self._statistics["active_for"] = time.monotonic() - started
                self._forget_run()
        if final is not None and final not in self.IGNORABLE_STATES:
            try:
                self._change_state(final)
            except exc.StorageFailure as err:
                self.storage.stop_writing(err)
                raise self._halted(err) from err
            if final == states.REVERTED and loop.cancel_applied:
                assert loop.cancelled is not None
                raise self._cancelled_error(loop.cancelled)
            if final not in self.NO_RERAISING_STATES:
                failures = list(self.storage.get_execute_failures().values())
                failures += self.storage.get_revert_failures().values()
                Failure.reraise_if_any(failures)


    def _deadline(self) -> float | None:
        """When this run's flow must be done (epoch seconds by the engine's clock): the stored
        deadline of a resumed flow, else one set now from the ``deadline`` option (stored with
        the RUNNING state that follows)."""
        stored = stopping.stored_deadline(self.storage.flow_meta)
        if stored is not None or self._options.deadline is None:
            return stored
        at = self._epoch_clock() + self._options.deadline
        self.storage.flow_meta[stopping.META_DEADLINE] = {"at": at,
                                                         "seconds": self._options.deadline}
        return at

    def _arm_deadline(self, at: float) -> None:
        """Cancel the flow once ``at`` has come (on the engine's timer, which tests move)."""
        assert self._runtime is not None
        expiry = self._runtime.timer.after(max(0.0, at - self._epoch_clock()), None)

        def expired(future: cf.Future) -> None:
            if not future.cancelled():  # not the run ending (or suspending) first
                LOG.info("Flow %r (%s) reached its deadline; cancelling it",
                         self.storage.flow_name, self.storage.flow_uuid)
                self.cancel(stopping.DEADLINE_REASON, by=stopping.DEADLINE_REASON)

        expiry.add_done_callback(expired)

    def _resume_cancel(self) -> None:
        """A flow stored as cancelled and not finished (its engine died while reverting) is
        cancelled again: the resumed run goes on reverting."""
        request = stopping.CancelRequest.from_record(
            self.storage.flow_meta.get(stopping.META_CANCELLED))
        if request is not None:
            with self._cancel_lock:
                if self._cancel is None:
                    self._cancel = request

    def _cancelled_error(self, request: stopping.CancelRequest) -> exc.FlowCancelled:
        storage = self.storage
        return exc.FlowCancelled(
            f"Flow {storage.flow_name!r} ({storage.flow_uuid}) was {request}; what it had done "
            f"was reverted", reason=request.reason, by=request.by)

    def _halted(self, cause: exc.StorageFailure) -> exc.RunHalted:
        storage = self.storage
        return exc.RunHalted(
            f"Flow {storage.flow_name!r} ({storage.flow_uuid}) halted: its progress could not "
            f"be recorded ({cause}). Nothing was started or reverted after that; the stored "
            f"record is as its last successful write left it, so resuming the flow (or its "
            f"job, under a conductor) goes on from there", cause=cause)


@contextlib.contextmanager
def _started(executor: ex.TaskExecutor) -> Iterator[None]:
    executor.start()
    try:
        yield
    finally:
        executor.stop()


class SerialActionEngine(ActionEngine):
    """Runs one atom at a time, in the calling thread.

    Options:
        time_limits: ``{task name: seconds}`` overriding the tasks' ``time_limit``. A call with
            a time limit runs on a helper thread, so the engine can stop waiting for it.
    """

    KIND = "serial"


#: Executor names the parallel engine accepts; TaskFlow's green-thread names run on threads.
_THREAD_EXECUTORS = frozenset(("thread", "threads", "threaded",
                               "greenthread", "greenthreads", "greenthreaded"))


class ParallelActionEngine(ActionEngine):
    """Runs independent atoms at the same time on a thread pool.

    Options:
        executor: a ``concurrent.futures.Executor`` to use (never shut down by the engine),
            or the string "threads".
        max_workers: size of the engine's own pool when no executor is given.
        max_async_tasks: ``async def`` calls awaited at the same time, on one event loop
            thread (they take no pool thread); default 64.
        time_limits: ``{task name: seconds}`` overriding the tasks' ``time_limit``.
    """

    KIND = "parallel"

    def __init__(self, flow: flow_base.Flow | Atom, flow_detail: FlowDetail,
                 backend: Backend | None, options: Mapping[str, Any] | None) -> None:
        super().__init__(flow, flow_detail, backend, options)
        given = self._options.executor
        if isinstance(given, cf.ProcessPoolExecutor):
            # Process pools would pickle tasks and arguments; flowengine never pickles.
            raise ValueError(
                f"Parallel engine option 'executor' must be a thread-based Executor or "
                f"'threads', not {given!r} (process pools would need pickle)")
        if isinstance(given, str) and given.lower() not in _THREAD_EXECUTORS:
            raise ValueError(
                f"Unknown executor string {given!r} expected one of "
                f"{sorted(_THREAD_EXECUTORS)} (or mixed case equivalent)")

    def _task_executor(self) -> ex.TaskExecutor:
        given = self._options.executor
        if given is None or isinstance(given, str):
            return ex.ParallelThreadTaskExecutor(max_workers=self._options.max_workers,
                                                 **self._local_options())
        if isinstance(given, ex.TaskExecutor):
            return given
        return ex.ParallelThreadTaskExecutor(executor=given, **self._local_options())
