"""The engine's run loop as a state machine (built once with automaton, then frozen).

RESUMING -> SCHEDULING -> WAITING -> ANALYZING -> (SCHEDULING | WAITING | GAME_OVER), and from
GAME_OVER to one of SUCCESS, REVERTED, FAILURE or SUSPENDED. Each state has a handler that does
its work and returns the next event. A write of the flow's progress that fails halts the loop
(:meth:`RunLoop.halt`): it starts nothing more and reverts nothing, and ends in FAILURE with
:attr:`RunLoop.halted` set. A cancel (:meth:`RunLoop.cancel`) is its opposite: it revokes what has
not started and reverts everything that completed, ending REVERTED with :attr:`RunLoop.cancelled`
set. A run looks its transitions up in a table read off the
frozen machine, as requests and attempts do, rather than driving a copy of it.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from automaton import exceptions as machine_errors
from automaton import machines

from flowengine import exceptions as exc
from flowengine import states as st
from flowengine.atom import Atom
from flowengine.engines.runtime import Runtime
from flowengine.engines.stopping import CancelRequest
from flowengine.types.failure import Failure

LOG = logging.getLogger(__name__)

START = "start"
SCHEDULE = "schedule_next"
WAIT = "wait_finished"
ANALYZE = "examine_finished"
FINISH = "completed"
FAILED = "failed"
SUSPENDED = "suspended"
SUCCESS = "success"
REVERTED = "reverted"

#: States that are the loop's own business; they are never announced as flow states.
META_STATES = frozenset((st.GAME_OVER, st.UNDEFINED))
#: Atoms scheduled from one batch before finished ones are handled first.
YIELD_AFTER = 32


def _dispatch_order(atom: Atom) -> int:
    """Sort key: higher ``priority`` first (sorting is stable, so ties keep graph order)."""
    return -atom.priority


#: Queued to wake a waiting loop; never in flight, so analyzing it completes nothing.
_WAKE_UP: cf.Future = cf.Future()
#: States with time spent in them reported in ``engine.statistics``.
TIMED_STATES = (st.ANALYZING, st.RESUMING, st.SCHEDULING, st.WAITING)


def _build() -> machines.FiniteMachine:
    m = machines.FiniteMachine()
    for state in (st.UNDEFINED, st.RESUMING, st.SCHEDULING, st.WAITING, st.ANALYZING,
                  st.GAME_OVER):
        m.add_state(state)
    for state in (st.SUCCESS, st.REVERTED, st.FAILURE, st.SUSPENDED):
        m.add_state(state, terminal=True)
    m.default_start_state = st.UNDEFINED
    m.add_transition(st.UNDEFINED, st.RESUMING, START)
    m.add_transition(st.RESUMING, st.SCHEDULING, SCHEDULE)
    m.add_transition(st.SCHEDULING, st.WAITING, WAIT)
    m.add_transition(st.WAITING, st.ANALYZING, ANALYZE)
    m.add_transition(st.ANALYZING, st.SCHEDULING, SCHEDULE)
    m.add_transition(st.ANALYZING, st.WAITING, WAIT)
    m.add_transition(st.ANALYZING, st.GAME_OVER, FINISH)
    m.add_transition(st.GAME_OVER, st.SUCCESS, SUCCESS)
    m.add_transition(st.GAME_OVER, st.REVERTED, REVERTED)
    m.add_transition(st.GAME_OVER, st.FAILURE, FAILED)
    m.add_transition(st.GAME_OVER, st.SUSPENDED, SUSPENDED)
    m.freeze()
    return m


#: The loop's shape, shared by every run.
MACHINE = _build()
#: ``(state, event) -> next state``, read off MACHINE. Copying the automaton machine for every
#: run and processing each event through it cost far more than these lookups, and a service
#: running a flow per request pays it for every engine.
_NEXT: dict[tuple[str, str], str] = {(start, event): end for start, event, end in MACHINE}
#: States the loop ends in (no transition leaves them).
_TERMINAL = frozenset(MACHINE.states) - {start for start, _event, _end in MACHINE}


def _next_state(state: str, event: str) -> str:
    try:
        return _NEXT[(state, event)]
    except KeyError:
        # A handler returned an event its state does not take: a bug in this module.
        raise machine_errors.NotFound(
            f"The run loop has no transition from state {state!r} on event {event!r}"
        ) from None


def _succeeded(future: cf.Future) -> bool:
    """Whether a future already holds a successful (non-Failure) outcome."""
    if not future.done() or future.cancelled() or future.exception() is not None:
        return False
    result = future.result()
    return not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Failure))


class RunLoop:
    """One run of the engine loop over a runtime.

    Args:
        runtime: the engine's runtime.
        statistics: dict filled with TaskFlow's statistics keys as the loop runs.
        timeout: longest single wait for running atoms (None: until one finishes).
    """

    def __init__(self, runtime: Runtime, statistics: dict[str, Any],
                 timeout: float | None = None) -> None:
        self._runtime = runtime
        self._storage = runtime.storage
        self._timeout = timeout
        self.failures: list[Failure] = []
        #: The failed (or refused) write that halted the loop, if one did.
        self.halted: exc.StorageFailure | None = None
        #: The cancel asked of the loop (from any thread), if one was.
        self.cancelled: CancelRequest | None = None
        #: Whether the loop applied it (on its own thread); False if it came too late.
        self.cancel_applied = False
        self._cancel_seen = False
        self._next_up: list[Any] = []
        # The rest of a batch cut short (_schedule), already deduplicated and in dispatch order,
        # with its length then: while _next_up is still exactly that list, it is not sorted
        # again. A wide flow is dispatched in slices, and re-sorting the remainder for every
        # slice cost time quadratic in the width.
        self._carried: tuple[list[Any], int] = ([], 0)
        self._in_flight: dict[cf.Future, Any] = {}
        self._in_flight_atoms: set[Any] = set()  # the values of _in_flight, kept alongside
        # Futures report completion here, so waiting costs O(1) per finished atom rather than a
        # scan of everything in flight.
        self._finished: queue.SimpleQueue[cf.Future] = queue.SimpleQueue()
        self._done: list[cf.Future] = []
        self._blocked = False  # waiting in _wait for a completion (see wake)
        self._wake_requested = False
        self._woken_from_elsewhere = False  # by a thread other than the loop's own (see wake)
        self._thread: int | None = None
        self._completed_inline = False
        self._stats = statistics
        statistics.clear()
        statistics["seconds_per_state"] = {s.lower(): 0.0 for s in TIMED_STATES}
        for key in ("discarded_failures", "awaiting", "completed", "incomplete"):
            statistics[key] = 0

    def run_iter(self) -> Iterator[str]:
        """Yield every state the loop enters, ending with a terminal one."""
        state: str = MACHINE.default_start_state  # type: ignore[assignment]
        event = START
        seconds = self._stats["seconds_per_state"]
        self._thread = threading.get_ident()
        while True:
            state = _next_state(state, event)
            yield state
            # A suspension run_iter's caller asked for on this state (the engine's own thread)
            # lets the atoms already announced as running finish, as TaskFlow's does; only
            # one from elsewhere, while the loop waits, cancels those still queued.
            self._wake_requested = False
            if state in _TERMINAL:
                return
            started = time.monotonic()
            event = _HANDLERS[state](self)
            if state.lower() in seconds:
                seconds[state.lower()] += time.monotonic() - started

    def _flow_state(self) -> str:
        return self._storage.get_flow_state()

    def _resume(self) -> str:
        unfinished = self._runtime.resume()
        seen = set(unfinished)
        self._next_up = list(unfinished) + [a for a in self._runtime.next_atoms() if a not in seen]
        return SCHEDULE

    def _schedule(self) -> str:
        if self.cancelled is not None and not self._cancel_seen:
            self._apply_cancel()
        if self.halted is None and self._flow_state() == st.RUNNING and self._next_up:
            # Higher priority first; sorted() is stable, so ties keep graph order. An atom can
            # be listed twice (carried over from a yielded batch and found ready again).
            carried, length = self._carried
            if self._next_up is carried and len(carried) == length:
                ordered = carried
            else:
                unique = list(dict.fromkeys(self._next_up))
                ordered = sorted(unique, key=_dispatch_order)
            self._next_up = []
            running = self._in_flight_atoms  # kept current as atoms start and complete
            for index, atom in enumerate(ordered):
                if index >= YIELD_AFTER and not self._finished.empty():
                    # A wide batch on an asynchronous executor: handle what has finished
                    # (store it, free its successors) before sending more, so dispatch and
                    # completion overlap. Smaller batches go out whole, as TaskFlow's do.
                    self._next_up = ordered[index:]
                    self._carried = (self._next_up, len(self._next_up))
                    break
                if self.halted is not None:  # halted from elsewhere while the batch went out
                    break
                if self.cancelled is not None and not self._cancel_seen:
                    break  # cancelled meanwhile: the rest of the batch is not started
                # Intentions may have changed since the atom was found ready (a failure).
                if atom in running or not self._runtime.can_start(atom):
                    continue
                try:
                    future = self._runtime.schedule(atom)
                except exc.StorageFailure as err:
                    # Its RUNNING (or REVERTING) state was not stored, so it was not started.
                    self.halt(err)
                    break
                except Exception:
                    LOG.exception("Engine failed to schedule atom %r", atom.name)
                    self.failures.append(Failure())
                    break
                self._in_flight[future] = atom
                running.add(atom)
                if _succeeded(future):
                    # Ran in this thread (serial executor): store the result before the next
                    # atom starts, so a crash never loses finished work. Failures take the
                    # usual path and are resolved after the batch, as TaskFlow's engine does.
                    self._completed_inline = True
                    self._complete(future)
                else:
                    future.add_done_callback(self._finished.put)
        elif self._flow_state() == st.SUSPENDING:
            self._cancel_pending()
        # A suspension asked for on this thread while this batch went out (from a RUNNING
        # notification, say) lets the batch run: its atoms were announced as started. Waits on
        # the engine's timer (a retry's delay, a task's start delay) started nothing and are
        # cancelled either way: the loop would block until they end.
        if self._wake_requested and self._flow_state() == st.SUSPENDING:
            self._runtime.timer.cancel_all()
            self._runtime.start_delays.take_back_delayed()
            if self._woken_from_elsewhere:
                # Asked from another thread while the batch went out: what it sent and has not
                # started is cancelled (revoked, remotely) as if the loop had been waiting.
                self._cancel_pending()
        self._wake_requested = False
        self._stats["incomplete"] = len(self._in_flight)
        return WAIT

    def halt(self, failure: exc.StorageFailure) -> None:
        """Stop because the flow's progress can no longer be recorded (callable from any thread).

        Nothing more is started and nothing is reverted: work that cannot be recorded must not
        be done, and a revert nobody can record would leave the stored record claiming work
        that was undone. What has not started yet is cancelled (revoked, remotely); what is
        running is waited for, and its outcome is not written. The storage writes nothing
        more, so the stored record stays as the last successful write left it.
        """
        if self.halted is None:
            self.halted = failure
            LOG.warning("Flow %r (%s) halts: its progress cannot be recorded: %s",
                        self._storage.flow_name, self._storage.flow_uuid, failure)
        self._storage.stop_writing(failure)
        self.wake()

    def cancel(self, request: CancelRequest) -> None:
        """Cancel the flow (callable from any thread): the loop applies it on its own thread.

        What has not started is taken back (revoked, remotely) and left as if it never ran;
        running executes are asked to stop through their context (the engine tells them at
        once); every completed atom is then reverted in reverse order, and the loop ends
        REVERTED (FAILURE if a revert fails). A halt wins over a cancel, and a flow whose
        every atom already succeeded is not cancelled.
        """
        if self.cancelled is None:
            self.cancelled = request
            self.wake()

    @property
    def cancel_seen(self) -> bool:
        """Whether the loop took up :attr:`cancelled` (applied it, or found it too late)."""
        return self._cancel_seen

    def in_flight(self) -> int:
        """How many atoms the loop started whose outcome it has not applied yet, leaving out
        those taken back before they started (a suspension's or a cancel's): each is running,
        queued in the executor, or finished and not yet analyzed. Callable from any thread.
        """
        # A copy first: the loop's thread adds and removes entries meanwhile, and list() of a
        # dict is taken whole under the GIL where iterating it here could fail half-way.
        return sum(not future.cancelled() for future in list(self._in_flight))

    def _apply_cancel(self) -> None:
        self._cancel_seen = True
        request = self.cancelled
        assert request is not None
        runtime, storage = self._runtime, self._storage
        if self.halted is not None:
            return
        if runtime.is_success():
            LOG.info("Flow %r (%s) is not cancelled (%s): every atom already succeeded",
                     storage.flow_name, storage.flow_uuid, request)
            return
        LOG.info("Flow %r (%s) is %s; reverting what it did", storage.flow_name,
                 storage.flow_uuid, request)
        if self._flow_state() == st.SUSPENDING:
            storage.set_flow_state(st.RUNNING)  # the cancel supersedes the suspension
        runtime.timer.cancel_all()  # a retry's wait or a start delay started nothing
        runtime.start_delays.take_back_delayed()
        # Atoms a previous run left in flight (resumed) are reverted: what they did is unknown.
        unfinished = [atom for atom in self._next_up if atom not in self._in_flight_atoms
                      and storage.get_atom_state(atom.name) in (st.RUNNING, st.REVERTING)]
        self._next_up = []
        try:
            runtime.cancel(request)
        except exc.StorageFailure as err:
            self.halt(err)
            return
        self.cancel_applied = True
        # Executes not started yet are taken back (their atoms are then left PENDING, see
        # _complete); those running are told to stop and are waited for; reverts go on. An
        # executor whose calls run elsewhere takes back and stops its own (first, so that
        # taking back the futures finds them dealt with).
        runtime.task_action.executor.stop_executions(request.reason)
        for future, atom in list(self._in_flight.items()):
            if storage.get_atom_state(atom.name) == st.RUNNING:
                future.cancel()
        # Only now are local executes told: told first, one could end and free its thread
        # for a queued one before that was taken back.
        runtime.calls.signal.request(request.reason)
        try:
            self._next_up = unfinished + runtime.next_atoms(apply_deciders=False)
        except exc.StorageFailure as err:
            self.halt(err)

    def wake(self) -> None:
        """Make a loop blocked waiting for atoms look at the flow state now (e.g. a suspension,
        which should cancel what has not started yet rather than wait for the next completion).

        Only a blocked loop is woken: anywhere else it looks at the flow state anyway, and a
        queued wake-up would read as a completion to handle (and cut a batch short).
        """
        self._woken_from_elsewhere = threading.get_ident() != self._thread
        self._wake_requested = True
        if self._blocked:  # set before _wait reads _wake_requested, so one of them sees it
            self._finished.put(_WAKE_UP)

    def _cancel_pending(self) -> None:
        for future, atom in list(self._in_flight.items()):
            if future.cancel():
                LOG.debug("Cancelled %r because the engine is suspending", atom.name)

    def _wait(self) -> str:
        finished = self._finished
        # Atoms finished while scheduling may have unblocked others: analyze before blocking.
        inline, self._completed_inline = self._completed_inline, False
        if self._in_flight and finished.empty() and not inline:
            self._blocked = True
            try:
                # A cancel asked while the batch went out (its wake-up was spent there) is
                # applied now: a remote task told nothing yet would keep the loop waiting.
                if not self._wake_requested and (self.cancelled is None or self._cancel_seen):
                    self._done.append(finished.get(timeout=self._timeout))
            except queue.Empty:
                return ANALYZE
            finally:
                self._blocked = self._wake_requested = False
        while not finished.empty():
            self._done.append(finished.get_nowait())
        self._stats["incomplete"] = len(self._in_flight) - len(self._done)
        return ANALYZE

    def _complete(self, future: cf.Future) -> bool:
        """Apply one finished future; False if the engine must stop."""
        atom = self._in_flight.pop(future)
        self._in_flight_atoms.discard(atom)
        if future.cancelled():
            if (self.cancel_applied and self.halted is None
                    and self._storage.get_atom_state(atom.name) == st.RUNNING):
                try:
                    self._runtime.never_started(atom)
                except exc.StorageFailure as err:
                    self.halt(err)
                    return False
            frontier = self._runtime.frontier
            if frontier is not None:
                # It did nothing: whatever it may do now (a cancel's revert of a retry whose
                # wait was cut short) is looked for again.
                frontier.candidates.add(atom)
            return True
        try:
            outcome, result = future.result()
            failure = self._runtime.complete(atom, outcome, result)
        except exc.StorageFailure as err:
            self.halt(err)  # its outcome was not recorded: a resumed run does it again
            return False
        except Exception:
            LOG.exception("Engine failed completing atom %r", atom.name)
            self.failures.append(Failure())
            return False
        self._stats["completed"] += 1
        if failure is not None:
            self.failures.append(failure)
            return False
        if isinstance(result, Failure):
            self._stats["discarded_failures"] += 1
        return True

    def _analyze(self) -> str:
        # A cancel first: a failure it finds is not resolved (no retry controller is asked).
        if self.cancelled is not None and not self._cancel_seen:
            self._apply_cancel()
        done, self._done = self._done, []
        for future in done:
            if future in self._in_flight:
                self._complete(future)
        if self.halted is not None:
            self._next_up = []
            self._runtime.timer.cancel_all()  # a retry's wait started nothing
            self._stats["awaiting"] = 0
            if self._in_flight:
                self._cancel_pending()
                return WAIT
            return FINISH
        flow_state = self._flow_state()
        if not self.failures and flow_state == st.RUNNING:
            try:
                more = self._runtime.next_atoms()
            except exc.StorageFailure as err:  # a decider's IGNORE could not be stored
                self.halt(err)
                return self._analyze()
            except Exception:
                LOG.exception("Engine failed finding the next atoms to run")
                self.failures.append(Failure())
                more = []
            self._next_up.extend(more)
        else:
            self._next_up = [] if self.failures else self._next_up
        self._stats["awaiting"] = len(self._next_up)
        if self._next_up and flow_state == st.RUNNING and not self.failures:
            return SCHEDULE
        if self._in_flight:
            if flow_state == st.SUSPENDING:
                self._cancel_pending()
            return WAIT
        return FINISH

    def _game_over(self) -> str:
        self._runtime.timer.cancel_all()
        if self.failures or self.halted is not None:
            return FAILED
        if self._next_up or self._runtime.leftover():
            return SUSPENDED
        if self._runtime.is_success():
            return SUCCESS
        return REVERTED


#: What each non-terminal state does; kept with the class rather than as bound methods on
#: every loop, which would tie each loop into a reference cycle only a collection frees.
_HANDLERS: dict[str, Callable[[RunLoop], str]] = {
    st.RESUMING: RunLoop._resume,
    st.SCHEDULING: RunLoop._schedule,
    st.WAITING: RunLoop._wait,
    st.ANALYZING: RunLoop._analyze,
    st.GAME_OVER: RunLoop._game_over,
}
