"""The runtime: what one engine knows while running a compiled flow.

It joins the compilation, storage, readiness counters and actions, and answers the engine loop's
three questions: what can be done next (:meth:`Runtime.next_atoms`), how to start it
(:meth:`Runtime.schedule`) and what its outcome means (:meth:`Runtime.complete`).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
import weakref
from collections.abc import Iterable
from typing import Any, cast

from flowengine import context, states
from flowengine import deciders as de
from flowengine import retry as retry_mod
from flowengine.atom import Atom
from flowengine.engines import executor as ex
from flowengine.engines import resolution
from flowengine.engines.actions import RetryAction, TaskAction
from flowengine.engines.admission import ADMITTED, TaskGate
from flowengine.engines.calls import CallContexts
from flowengine.engines.compiler import FLOW, FLOW_END, TASK, Compilation
from flowengine.engines.delays import RetryWaits
from flowengine.engines.frontier import Frontier
from flowengine.engines.options import EngineOptions
from flowengine.engines.start_delays import StartDelays, start_delay
from flowengine.engines.stopping import META_CANCELLED, CancelRequest
from flowengine.hooks import Hooks
from flowengine.storage import Storage
from flowengine.task import Task
from flowengine.types.failure import Failure
from flowengine.types.notifier import Notifier

LOG = logging.getLogger(__name__)

#: Outcome of a retry's backoff timer: the retry may now run its next attempt.
DELAY_ELAPSED = "delay-elapsed"
#: What the engine's ``interventions`` notifier announces as a cancel is applied.
CANCELLED = "cancelled"
_REVERTIBLE = frozenset((states.SUCCESS, states.FAILURE, states.REVERT_FAILURE))
# A retry left RETRYING by an interrupted run starts its next attempt from there.
_STARTABLE = frozenset((states.PENDING, states.RETRYING))


class _StateHook:
    """Keeps the readiness counters in step with every stored state change.

    It holds its runtime weakly: the runtime holds it (through its actions), and an engine's
    objects that refer to each other in a cycle outlive the engine until a full collection,
    which in a process running many flows walks them all again and again.
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = weakref.ref(runtime)

    def __call__(self, atom: Atom, state: str) -> None:
        runtime = self._runtime()
        if runtime is not None and (frontier := runtime.frontier) is not None:
            frontier.state_changed(atom, state)


class Runtime:
    """Shared state and decisions for one engine's runs."""

    def __init__(
        self,
        compilation: Compilation,
        storage: Storage,
        atom_notifier: Notifier,
        task_executor: ex.TaskExecutor,
        options: EngineOptions,
        waits: RetryWaits | None = None,
        interventions: Notifier | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.compilation = compilation
        #: The engine's hooks, told how each failure is resolved.
        self.hooks = hooks if hooks is not None else Hooks()
        #: Where an applied cancel is announced (the engine's ``interventions``).
        self.interventions = interventions if interventions is not None else Notifier()
        self.storage = storage
        self.options = options
        self.frontier: Frontier | None = None
        #: The tasks' locks and limits while a run holds any (see engines/admission.py).
        self.gate: TaskGate | None = None
        hook = _StateHook(self)
        self.task_action = TaskAction(storage, atom_notifier, task_executor, hook)
        # Option ``retry_clock`` (epoch seconds) moves retry waits in tests without sleeping.
        clock = options.retry_clock
        if waits is None:
            waits = RetryWaits(clock or time.monotonic)
        self.retry_action = RetryAction(storage, atom_notifier, hook,
                                        clock=clock or time.time, waits=waits)
        self.timer = waits.timer
        self.start_delays = StartDelays(storage, waits, clock or time.time, compilation)
        # Remote executors that take a delay hold a retry's wait in the broker, not here.
        self._dispatch_delays = task_executor.delays_dispatch
        #: Task name -> the retries whose wait its delayed request carries (ended with it).
        self._carrying: dict[str, list[retry_mod.Retry]] = {}
        #: Retries whose wait, carried by delayed requests, this engine announced.
        self._announced: set[str] = set()
        # The compilation answers (it refers to neither the runtime nor the storage, so the
        # storage holding its answer makes no reference cycle: see _StateHook).
        storage.set_scope_fetcher(compilation.visible_providers)
        #: The contexts of the task calls this runtime starts (see :mod:`flowengine.context`).
        self.calls = CallContexts(storage, compilation)
        #: The cancel this run applied: failures are no longer resolved, everything reverts.
        self.cancelled: CancelRequest | None = None

    # -- state ------------------------------------------------------------------------------

    def build_frontier(self) -> None:
        """(Re)build the readiness counters from stored states."""
        stored = {name: self.storage.get_atom_state(name) for name in self.compilation.atoms}
        self.frontier = Frontier(self.compilation, stored)

    def _action(self, atom: Atom) -> Any:
        return self.retry_action if isinstance(atom, retry_mod.Retry) else self.task_action

    def reset_atoms(self, atoms: Iterable[Any], state: str | None, intention: str | None,
                    force: bool = False, keep_failures: bool = False) -> None:
        """Move atoms to ``state`` (where allowed, or always if ``force``) and set ``intention``.

        ``keep_failures``: the storage still lists their failures (see ``Storage.reset``).
        """
        storage = self.storage
        for atom in atoms:
            if intention == states.RETRY and storage.get_atom_intention(atom.name) == states.REVERT:
                # Another failure of this round decided to revert this retry (an enclosing
                # controller's, say): retrying would undo that (TaskFlow's bug 2043808, alike).
                continue
            if state is not None:
                current = storage.get_atom_state(atom.name)
                check = (states.check_retry_transition if isinstance(atom, retry_mod.Retry)
                         else states.check_task_transition)
                if (force and current != state) or check(current, state):
                    if state in (states.PENDING, states.IGNORE):
                        # A fresh start: forget the old attempt's results and failures.
                        self._action(atom).reset_state(atom, state, keep_failures)
                    else:
                        self._action(atom).change_state(atom, state)
            if intention is not None:
                storage.set_atom_intention(atom.name, intention)
            if self.frontier is not None:
                self.frontier.candidates.add(atom)

    def reset_all(self) -> None:
        """Put every atom back to PENDING with the EXECUTE intention."""
        self.frontier = None
        # Unlike TaskFlow, which skips atoms that may not move to PENDING (so a finished flow
        # could never run again), a reset puts every atom back.
        self.reset_atoms(self.compilation.iter_atoms(), states.PENDING, states.EXECUTE,
                         force=True)

    def retry_subflow(self, retry: retry_mod.Retry) -> None:
        """Prepare a retry's subflow for another attempt."""
        self.storage.set_atom_intention(retry.name, states.EXECUTE)
        # As TaskFlow's, the failures of this attempt stay listed: a flow that reverts in the
        # end raises them all (WrappedFailure) and passes them to every revert.
        self.reset_atoms(self.compilation.successors_of(retry), states.PENDING, states.EXECUTE,
                         keep_failures=True)

    def ask_retry(self, retry: retry_mod.Retry, atom: Atom, failure: Failure) -> Any:
        """Record ``atom``'s failure with ``retry`` and return the retry's decision."""
        arguments = self.storage.fetch_mapped_args(
            retry.rebind, atom_name=retry.name, optional_args=retry.optional)
        return self.retry_action.on_failure(retry, atom, failure, arguments)

    # -- deciding what is next --------------------------------------------------------------

    def resume(self) -> set[Any]:
        """Resolve stored failures and return atoms a previous run left unfinished."""
        storage = self.storage
        # A run announces again the retry waits its delayed requests carry (see _delay_of).
        self._announced.clear()
        self._carrying.clear()
        self.start_delays.forget()
        if not self.options.never_resolve:
            for atom in self.compilation.iter_atoms():
                if (storage.get_atom_state(atom.name) == states.FAILURE
                        and storage.get_atom_intention(atom.name) == states.EXECUTE):
                    self.process_failure(atom, storage.get(atom.name))
            for atom in self.compilation.iter_atoms():
                if (isinstance(atom, retry_mod.Retry)
                        and storage.get_atom_state(atom.name) == states.RETRYING):
                    self.retry_subflow(atom)
        self.build_frontier()
        return {atom for atom in self.compilation.iter_atoms()
                if storage.get_atom_state(atom.name) in (states.RUNNING, states.REVERTING)}

    def _ready(self, atom: Atom, state: str, intention: str) -> bool:
        frontier = self.frontier
        assert frontier is not None
        if intention == states.EXECUTE:
            return state in _STARTABLE and frontier.preds_done(atom)
        if intention == states.REVERT:
            return state in _REVERTIBLE and frontier.succs_undone(atom)
        if intention == states.RETRY:
            return state not in states.ATOM_ACTIVE_STATES and frontier.succs_undone(atom)
        return False

    def next_atoms(self, apply_deciders: bool = True) -> list[Any]:
        """Atoms that can be started now (deciders may ignore some, which frees others)."""
        frontier = self.frontier
        assert frontier is not None
        ready: list[Any] = []
        storage = self.storage
        while frontier.candidates:
            for atom in frontier.take_candidates():
                state = storage.get_atom_state(atom.name)
                intention = storage.get_atom_intention(atom.name)
                if not self._ready(atom, state, intention):
                    continue
                if (apply_deciders and intention == states.EXECUTE
                        and not self._deciders_allow(atom)):
                    continue
                ready.append(atom)
        return ready

    def can_start(self, atom: Atom) -> bool:
        """Whether ``atom`` may be started now; resumed RUNNING/REVERTING atoms may restart."""
        state = self.storage.get_atom_state(atom.name)
        intention = self.storage.get_atom_intention(atom.name)
        if state == states.RUNNING and intention == states.EXECUTE:
            return True
        if state in (states.REVERTING, states.RUNNING) and intention == states.REVERT:
            # Interrupted while reverting, or while running after the flow began reverting:
            # revert it (its result is unknown, so revert receives None, as in TaskFlow).
            return True
        return self._ready(atom, state, intention)

    def leftover(self) -> int:
        """How many atoms could still be started (non-zero after a suspension).

        Once nothing is in flight, an atom still RUNNING or REVERTING was cancelled before it
        started (a suspension dropped it); a resumed run restarts it, so it counts.
        """
        storage = self.storage
        return sum(1 for atom in self.compilation.iter_atoms()
                   if storage.get_atom_state(atom.name) in (states.RUNNING, states.REVERTING)
                   or self._ready(atom, storage.get_atom_state(atom.name),
                                  storage.get_atom_intention(atom.name)))

    def is_success(self) -> bool:
        """Whether every atom succeeded (or was ignored)."""
        return all(self.storage.get_atom_state(name) in (states.SUCCESS, states.IGNORE)
                   for name in self.compilation.atoms)

    def _deciders_allow(self, atom: Atom) -> bool:
        edge_deciders = self.compilation.edge_deciders(atom)
        if not edge_deciders:
            return True
        history: dict[str, Any] = {}
        for ed in edge_deciders:
            if isinstance(ed.from_node, Atom):
                if self.storage.get_atom_state(ed.from_node.name) != states.IGNORE:
                    history[ed.from_node.name] = self.storage.get(ed.from_node.name)
        nays = []
        for ed in edge_deciders:
            if isinstance(ed.from_node, Atom) and ed.from_node.name not in history:
                continue  # an ignored atom gets no vote
            if not ed.decider(history=history):
                nays.append(ed)
        if not nays:
            return True
        self.reset_atoms(self._affected(atom, de.pick_widest(ed.depth for ed in nays)),
                         states.IGNORE, states.IGNORE)
        return False

    def _affected(self, atom: Atom, depth: de.Depth) -> list[Any]:
        graph = self.compilation.execution_graph
        if depth is de.Depth.ATOM:
            return [atom]
        if depth is de.Depth.NEIGHBORS:
            return [atom] + [s for s in graph.successors(atom) if graph.nodes[s]["kind"] == TASK]
        found: list[Any] = [atom]
        seen = {id(atom)}
        stack = [atom]
        while stack:
            for succ in graph.successors(stack.pop()):
                if id(succ) in seen:
                    continue
                seen.add(id(succ))
                kind = graph.nodes[succ]["kind"]
                if depth is de.Depth.FLOW and kind in (FLOW, FLOW_END, "retry"):
                    continue
                if isinstance(succ, Atom):
                    found.append(succ)
                stack.append(succ)
        return found

    # -- doing it ---------------------------------------------------------------------------

    def _args(self, atom: Atom, revert: bool) -> dict[str, Any]:
        if revert:
            return self.storage.fetch_mapped_args(
                atom.revert_rebind, atom_name=atom.name, optional_args=atom.revert_optional)
        return self.storage.fetch_mapped_args(
            atom.rebind, atom_name=atom.name, optional_args=atom.optional)

    def schedule(self, atom: Atom) -> cf.Future:
        """Start what ``atom``'s intention calls for; return a future of its outcome.

        Raises:
            StorageFailure: the atom's new state could not be stored, so nothing was started
                (the engine halts: see :class:`~flowengine.exceptions.RunHalted`).
        """
        intention = self.storage.get_atom_intention(atom.name)
        if isinstance(atom, retry_mod.Retry):
            return self._schedule_retry(atom, intention)
        # Current while the executor takes the call: it carries the context to where it runs.
        with context.bound(self.calls.of(atom, intention)):
            # A flow's atoms are tasks and retry controllers: the rest run as tasks.
            return self._schedule_task(cast(Task, atom), intention)

    def _schedule_task(self, atom: Task, intention: str) -> cf.Future:
        if intention == states.REVERT:
            arguments = self._args(atom, revert=True)
            return (self._wait_admission(atom, arguments)
                    or self._gated(atom, self.task_action.schedule_reversion(atom, arguments)))
        own_delay = start_delay(atom) > 0
        if not self._dispatch_delays:
            left = self.start_delays.local_wait(atom) if own_delay else 0.0
            if left > 0:  # the task stays PENDING meanwhile (complete() offers it again)
                waiting = self.timer.after(left, (DELAY_ELAPSED, None))
                self.start_delays.armed(atom)
                return waiting
            arguments = self._args(atom, revert=False)
            return (self._wait_admission(atom, arguments) or self._gated(
                atom, self.task_action.schedule_execution(atom, arguments, delayable=own_delay)))
        if self.gate is not None:
            admission = self._wait_admission(atom, self._args(atom, revert=False))
            if admission is not None:
                return admission
        retries = self.compilation.retries_around(atom)
        if not retries and not own_delay:
            return self._gated(atom, self.task_action.schedule_execution(
                atom, self._args(atom, revert=False)))
        unheard: list[tuple[retry_mod.Retry, float]] = []
        due, delay = self._delay_of(atom, retries, unheard) if retries else (None, 0.0)
        due, delay = self.start_delays.carried(atom, due, delay)
        future = self._gated(atom, self.task_action.schedule_execution(
            atom, self._args(atom, revert=False), delayed_until=due, delay=delay,
            delayable=True))
        if delay > 0:
            self.start_delays.delayed.add(future)  # taken back at once by a suspension
        self.start_delays.armed(atom)
        # Only now, with the request sent or held: whoever hears a wait may move time at once.
        for retry, left in unheard:
            self._announced.add(retry.name)
            self.retry_action.waiting(retry, left, decided=True)
        return future

    def _wait_admission(self, task: Task, arguments: dict[str, Any]) -> cf.Future | None:
        """The future of ``task``'s wait for its locks and limits (None: it may start now)."""
        return None if self.gate is None else self.gate.admit(task, arguments)

    def _gated(self, task: Task, future: cf.Future) -> cf.Future:
        """``task`` started as ``future``: what it holds goes if it is cancelled unstarted."""
        if self.gate is not None:
            self.gate.started(task, future)
        return future

    def _delay_of(self, task: Task, retries: list[retry_mod.Retry],
                  unheard: list[tuple[retry_mod.Retry, float]]) -> tuple[float | None, float]:
        """When the retry waits ``task``'s request must carry end, and the seconds left.

        On a worker-based engine a retried subflow's first tasks are sent at once with what
        is left of their controllers' waits as a delay (doc/priorities.rst); a wait that is
        over ends here. A resumed run's waits go to ``unheard``, heard once the request is out.
        """
        action = self.retry_action
        due: float | None = None
        delay = 0.0
        for retry in retries:
            stored = action.due(retry)
            if stored is None:
                continue
            history = len(self.storage.get_retry_history(retry.name))
            left = action.remaining_wait(retry, retry.delay_before(max(history, 2)))
            if left <= 0:
                self._end_carried_wait(retry)
                continue
            if retry.name not in self._announced:  # heard of once the request is out
                unheard.append((retry, left))
            self._carrying.setdefault(task.name, []).append(retry)
            if left > delay:
                due, delay = stored, left
        return due, delay

    def _end_carried_wait(self, retry: retry_mod.Retry) -> None:
        heard = retry.name in self._announced
        self._announced.discard(retry.name)
        # A wait nobody heard begin (no request carried it) ends unheard as well.
        self.retry_action.end_wait(retry, decided=True, announce=heard)

    def _schedule_retry(self, retry: retry_mod.Retry, intention: str) -> cf.Future:
        if intention == states.REVERT:
            outcome = self.retry_action.revert(retry, self._args(retry, revert=True))
            return self.timer.after(0, outcome)
        attempt = len(self.storage.get_retry_history(retry.name)) + 1
        wait = 0.0
        if intention == states.RETRY:
            self.retry_action.change_state(retry, states.RETRYING)
            self.retry_subflow(retry)
            wait = retry.delay_before(attempt)
            # Stored, so an engine resuming after a suspension waits only what is left of it.
            self.retry_action.start_wait(retry, wait)
        elif self.storage.get_atom_state(retry.name) == states.RETRYING:
            wait = self.retry_action.remaining_wait(retry, retry.delay_before(attempt))
            if wait <= 0:
                self.retry_action.end_wait(retry)  # it ran out while nothing ran the flow
        if wait > 0 and self.storage.get_flow_state() == states.SUSPENDING:
            # Suspended before the wait began: start nothing; a resumed run waits what is left.
            future: cf.Future = cf.Future()
            future.cancel()
            return future
        if wait > 0 and self._dispatch_delays:
            # The controller decides the next attempt now; the subflow's first requests carry
            # what is left of the wait as their delay (see _delay_of): no engine timer. The
            # wait is heard of once the first of them is sent or held (_schedule), not before:
            # a hearer that moves time between the delay's reckoning and its hold would leave
            # the request held for a whole delay counted from the moved time.
            LOG.debug("Retry %r sends attempt %d delayed %.3fs", retry.name, attempt, wait)
            outcome = self.retry_action.execute(retry, self._args(retry, revert=False))
            if isinstance(outcome[1], Failure):
                self._end_carried_wait(retry)  # no attempt follows to carry it
            return self.timer.after(0, outcome)
        if wait > 0:
            LOG.debug("Retry %r waits %.3fs before attempt %d", retry.name, wait, attempt)
            waited = self.timer.after(wait, (DELAY_ELAPSED, None))
            self.retry_action.waiting(retry, wait)  # after arming: whoever hears may move time
            return waited
        outcome = self.retry_action.execute(retry, self._args(retry, revert=False))
        return self.timer.after(0, outcome)

    def complete(self, atom: Atom, outcome: str, result: Any) -> Failure | None:
        """Apply an outcome; return a failure that must stop the engine, else None."""
        if outcome == ADMITTED:
            # A task holds the locks and limits it waited for: offer it to be started.
            if self.gate is not None:
                self.gate.admitted(atom)
            assert self.frontier is not None
            self.frontier.candidates.add(atom)
            return None
        if outcome == DELAY_ELAPSED and not isinstance(atom, retry_mod.Retry):
            # A task's start delay is over (local engines): offer it to be started.
            self.start_delays.elapsed(atom)
            assert self.frontier is not None
            self.frontier.candidates.add(atom)
            return None
        if outcome == DELAY_ELAPSED and isinstance(atom, retry_mod.Retry):
            self.retry_action.end_wait(atom)
            outcome, result = self.retry_action.execute(atom, self._args(atom, revert=False))
        for retry in self._carrying.pop(atom.name, ()):  # its request ran
            self._end_carried_wait(retry)
        self.start_delays.ended(atom)  # a worker-based request that carried its start delay
        action = self._action(atom)
        # A write that fails here raises: the engine halts without deciding anything more.
        if outcome == ex.EXECUTED:
            # A task whose result does not fit what it provides fails here.
            result = action.complete_execution(atom, result)
        else:
            action.complete_reversion(atom, result)
        if self.gate is not None:
            self.gate.finished(atom)  # only now: its outcome was written under its leases
        if not isinstance(result, Failure):
            return None
        if outcome == ex.EXECUTED and not self.options.never_resolve:
            if self.cancelled is None:  # a cancelled flow reverts: no controller retries it
                self.process_failure(atom, result)
            return None
        return result

    # -- cancelling -------------------------------------------------------------------------

    def cancel(self, request: CancelRequest) -> None:
        """Turn the run into undoing what it did: the cancel is recorded on the flow, no
        failure is resolved any more, and every atom is to be reverted (those that never
        started are not: their state says so). The loop's thread calls it."""
        self.cancelled = request
        self.storage.update_flow_metadata({META_CANCELLED: request.record()})
        frontier = self.frontier
        for atom in self.compilation.iter_atoms():
            if (isinstance(atom, retry_mod.Retry)
                    and self.storage.get_atom_state(atom.name) == states.RETRYING):
                # Cancelled while waiting to retry its subflow: the attempt it completed
                # stands, and is reverted like any other.
                self.retry_action.end_wait(atom)
                self.storage.set_atom_state(atom.name, states.SUCCESS)
                if frontier is not None:
                    frontier.state_changed(atom, states.SUCCESS)
        self.reset_atoms(self.compilation.iter_atoms(), None, states.REVERT)
        self.interventions.notify(CANCELLED, {"flow_name": self.storage.flow_name,
                                              "flow_uuid": self.storage.flow_uuid,
                                              **request.record()})

    def never_started(self, atom: Atom) -> None:
        """``atom``'s execute was taken back before it started (a cancel revoked it): it is
        left as if it never ran, and is not reverted."""
        self.reset_atoms([atom], states.PENDING, states.REVERT, force=True)

    def process_failure(self, atom: Atom, failure: Failure) -> None:
        """Decide how ``atom``'s failure is handled and set intentions accordingly."""
        strategy = resolution.determine(self, atom, failure, self.options.defer_reverts)
        self.hooks.failure_resolved(self.storage.get_atom_uuid(atom.name), strategy.strategy,
                                    strategy.retry)
        LOG.debug("Resolving failure of %r with %s: %s", atom.name, strategy,
                  self.storage.masked(failure))
        strategy.apply(self)
