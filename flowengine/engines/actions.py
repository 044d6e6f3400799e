"""Atom actions: state changes (stored, then announced) and running tasks and retries."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.atom import Atom
from flowengine.engines import executor as ex
from flowengine.engines.delays import RetryWait, RetryWaits
from flowengine.persistence.atom_meta import (  # noqa: F401 - the engines' names for them
    META_DELAYED_UNTIL,
    META_RETRY_DUE,
)
from flowengine.retry import EXECUTE_REVERT_HISTORY, REVERT_FLOW_FAILURES, Retry
from flowengine.storage import Storage
from flowengine.task import Task
from flowengine.types.failure import Failure
from flowengine.types.notifier import Notifier

LOG = logging.getLogger(__name__)

#: Marks "no result given" (None is a valid result).
NO_RESULT: Any = object()
_TASK_RESULT_STATES = frozenset((states.SUCCESS, states.FAILURE, states.REVERT_FAILURE,
                                 states.REVERTED))
#: Called as ``hook(atom, new_state)`` after every stored state change.
StateHook = Callable[[Any, str], None]
_RETRY_RESULT_STATES = frozenset((states.SUCCESS, states.FAILURE, states.REVERT_FAILURE,
                                  states.REVERTED))
#: Task meta key: ``[value]`` when ``execute`` returned a value its ``provides`` does not fit.
META_RETURNED = "returned"
#: Task meta key: the broker's handle of that delayed request (beanstalkd), stored right after
#: it is put, so that an engine resuming the flow after a crash deletes it.
META_DELAYED_JOB = "delayed_job"
#: Atom metadata key: ids of the attempts of the atom's current action a remote executor sent
#: (the first one stored with the RUNNING or REVERTING state).
META_ATTEMPT_IDS = "attempt_ids"
#: Task meta key: ``[value]``, what ``execute`` returned, kept when its revert fails (the failed
#: revert's record keeps no result), so a repair that runs the revert again passes it.
META_REVERT_INPUT = "revert_input"


# Values json.dumps always encodes, checked without encoding them.
_PLAIN = (str, int, float, bool, type(None))


def unfit_for_json(atom_name: str, what: str, value: Any) -> Failure | None:
    """A failure naming the atom and the type if ``value`` is not a JSON value, else None.

    Results are stored and sent as JSON on every backend and transport, so every engine makes
    this check the moment a result is produced, whether or not anything stores it yet.
    """
    if isinstance(value, _PLAIN):
        return None
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError) as err:
        return Failure.from_exception(exc.InvalidFormat(
            f"Atom {atom_name!r} {what} a value of type {type(value).__name__}, which is not "
            f"JSON ({err}); results are stored and sent as JSON"))
    return None


def atom_meta(storage: Storage, atom_name: str) -> dict[str, Any]:
    """The named atom's stored metadata (read only)."""
    detail = storage.flow_detail.find(storage.get_atom_uuid(atom_name))
    return detail.meta if detail is not None else {}


class TaskAction:
    """Changes task states and hands tasks to the task executor."""

    def __init__(
        self, storage: Storage, notifier: Notifier, executor: ex.TaskExecutor, on_state: StateHook
    ) -> None:
        self._storage = storage
        self._notifier = notifier
        self._executor = executor
        self._on_state = on_state
        # What tasks returned that could not be stored (not JSON, or the write failed): kept
        # in memory so that this engine's revert still receives it.
        self._kept: dict[str, Any] = {}

    def _announce(self, task: Task, state: str, old_state: str, result: Any) -> None:
        self._on_state(task, state)
        details = {
            "task_name": task.name,
            "task_uuid": self._storage.get_atom_uuid(task.name),
            "old_state": old_state,
        }
        if result is not NO_RESULT:
            details["result"] = self._storage.masked(result)
        self._notifier.notify(state, details)

    @property
    def executor(self) -> ex.TaskExecutor:
        """Where tasks run."""
        return self._executor

    def reset_state(self, task: Task, state: str, keep_failures: bool = False) -> None:
        """Forget the task's results and move it to ``state`` (PENDING or IGNORE)."""
        old_state = self._storage.get_atom_state(task.name)
        self._kept.pop(task.name, None)
        self._storage.reset(task.name, state, keep_failures)
        if old_state != state:
            self._storage.set_task_progress(task.name, 0.0)  # as TaskFlow's engine does
        self._announce(task, state, old_state, NO_RESULT)

    def change_state(
        self, task: Task, state: str, progress: float | None = None, result: Any = NO_RESULT,
        meta: Mapping[str, Any] | None = None,
    ) -> bool:
        """Store then announce ``task``'s move to ``state``; False if nothing changed.

        ``meta`` is merged into the atom's metadata in the same write.
        """
        storage = self._storage
        old_state = storage.get_atom_state(task.name)
        if state == old_state and state not in _TASK_RESULT_STATES:
            if progress is None or storage.get_task_progress(task.name) == progress:
                if meta:  # sent again after a resume: the new request's id, nothing to announce
                    storage.update_atom_metadata(task.name, meta)
                return False
        if state in _TASK_RESULT_STATES:
            storage.save(task.name, None if result is NO_RESULT else result, state,
                         progress=progress, meta=meta)
        else:
            storage.set_atom_state(task.name, state, progress=progress, meta=meta)
        self._announce(task, state, old_state, result)
        if progress is not None:
            task.update_progress(progress)
        return True

    def _attempt_meta(self, task: Task) -> dict[str, Any] | None:
        """The id the executor gives the first attempt of the action starting now (remote
        executors), stored with the state that starts it: a process resuming after a crash
        can revoke what its predecessor left queued, at no extra write."""
        request_id = self._executor.reserve_request_id(self._storage.get_atom_uuid(task.name))
        return None if request_id is None else {META_ATTEMPT_IDS: [request_id]}

    def _on_update_progress(self, task: Task, event_type: str, details: dict[str, Any]) -> None:
        # Runs on the task's thread; a failure to record progress must not fail the task.
        details = dict(details)
        progress = details.pop("progress", None)
        if progress is None:
            return
        try:
            self._storage.set_task_progress(task.name, progress, details=details)
        except exc.StorageFailure as err:  # the engine halts, or already has
            LOG.warning("Could not store progress %s of task %r: %s", progress, task.name, err)
        except Exception:
            LOG.exception("Failed to store progress %s of task %r", progress, task.name)

    def schedule_execution(self, task: Task, arguments: dict[str, Any],
                           delayed_until: float | None = None, delay: float = 0.0,
                           delayable: bool = False) -> cf.Future:
        """Mark RUNNING (stored before the work starts) and submit the task.

        Args:
            delayed_until: for a task whose enclosing retry still waits (worker-based engines),
                when the wait ends (epoch seconds), stored with the state; None: not delayed.
            delay: seconds no worker may take the request for (the executor must accept
                ``delay``, see ``delays_dispatch``).
            delayable: the task may carry a delay (in a retried subflow on an executor that
                dispatches with delays): its stored ``delayed_until`` is set or cleared.
        """
        meta = self._attempt_meta(task)
        if delayable and (delayed_until is not None
                          or atom_meta(self._storage, task.name).get(META_DELAYED_UNTIL)):
            # Written with the state, so RUNNING never shows without its delay (or with an
            # earlier run's).
            meta = {**(meta or {}), META_DELAYED_UNTIL: delayed_until, META_DELAYED_JOB: None}
        self.change_state(task, states.RUNNING, progress=0.0, meta=meta)
        uuid = self._storage.get_atom_uuid(task.name)
        progress = functools.partial(self._on_update_progress, task)
        delayed = delay > 0
        return self._executor.submit(ex.Work(
            task, uuid, ex.EXECUTE, arguments, progress_callback=progress,
            delay=delay if delayed else 0.0,
            on_delayed_job=functools.partial(self._store_delayed_job, task) if delayed else None))

    def _store_delayed_job(self, task: Task, job: str) -> None:
        """Store the handle of ``task``'s delayed job as soon as it is put (on the thread that
        put it), so that an engine resuming after a crash can delete the job."""
        try:
            self._storage.update_atom_metadata(task.name, {META_DELAYED_JOB: job})
        except Exception:  # a bookkeeping write must not break the run
            LOG.warning("Could not store delayed job %s of task %r", job, task.name,
                        exc_info=True)

    def complete_execution(self, task: Task, result: Any) -> Any:
        """Store the outcome of ``execute``; return it.

        A result that lacks a name the task provides fails the task; what it returned is kept
        for its revert, which must undo the work it really did (TaskFlow, which stores such a
        result, would pass it too).
        """
        returned = None
        self._kept.pop(task.name, None)
        unfit = None if isinstance(result, Failure) else unfit_for_json(task.name, "returned",
                                                                        result)
        if unfit is not None:
            self._kept[task.name], result = result, unfit
        elif not isinstance(result, Failure):
            try:
                self._storage.check_result_shape(task.name, result)
            except Exception:
                returned, result = [result], Failure()
        if returned is not None or atom_meta(self._storage, task.name).get(META_RETURNED):
            self._storage.update_atom_metadata(task.name, {META_RETURNED: returned})
        if isinstance(result, Failure):
            self.change_state(task, states.FAILURE, result=result)
        else:
            self.change_state(task, states.SUCCESS, result=result, progress=1.0)
        return result

    def schedule_reversion(self, task: Task, arguments: dict[str, Any]) -> cf.Future:
        """Mark REVERTING and submit the task's revert."""
        # A revert run again after it failed gets what execute returned, kept for it.
        kept = atom_meta(self._storage, task.name).get(META_REVERT_INPUT) if (
            self._storage.get_atom_state(task.name) == states.REVERT_FAILURE) else None
        self.change_state(task, states.REVERTING, progress=0.0, meta=self._attempt_meta(task))
        result = self._storage.get(task.name)
        if isinstance(kept, list) and kept and result is None:
            result = kept[0]
        returned = atom_meta(self._storage, task.name).get(META_RETURNED)
        if returned and isinstance(result, Failure):
            result = returned[0]
        if task.name in self._kept and isinstance(result, Failure):
            result = self._kept[task.name]
        failures = self._storage.get_execute_failures()
        return self._executor.submit(ex.Work(
            task, self._storage.get_atom_uuid(task.name), ex.REVERT, arguments, result, failures,
            progress_callback=functools.partial(self._on_update_progress, task)))

    def complete_reversion(self, task: Task, result: Any) -> None:
        """Store the outcome of ``revert``.

        A failed revert keeps what its revert was given (what execute returned) in the atom's
        metadata, in the same write: the failure's record keeps no result, and a repair that
        runs the revert again (:mod:`flowengine.engines.repair`) must pass it.
        """
        if not isinstance(result, Failure):
            result = unfit_for_json(task.name, "returned from revert", result) or result
        meta: dict[str, Any] | None = None
        if isinstance(result, Failure):
            given = self._storage.get(task.name)  # still REVERTING: what execute returned
            if given is not None and not isinstance(given, Failure):
                meta = {META_REVERT_INPUT: [given]}
            self.change_state(task, states.REVERT_FAILURE, result=result, meta=meta)
        else:
            meta = ({META_REVERT_INPUT: None}
                    if atom_meta(self._storage, task.name).get(META_REVERT_INPUT) else None)
            self.change_state(task, states.REVERTED, result=result, progress=1.0, meta=meta)


class RetryAction:
    """Changes retry controller states and runs them (always locally, in the engine).

    Args:
        clock: seconds since the epoch; a wait's due time is stored by this clock, because a
            monotonic one means nothing to the process that resumes the flow.
        waits: told when a wait starts (or resumes) and ends, for events and operators.
    """

    def __init__(self, storage: Storage, notifier: Notifier, on_state: StateHook,
                 clock: Callable[[], float] = time.time,
                 waits: RetryWaits | None = None) -> None:
        self._storage = storage
        self._notifier = notifier
        self._on_state = on_state
        self._clock = clock
        self._waits = waits if waits is not None else RetryWaits()

    def due(self, retry: Retry) -> float | None:
        """When the stored wait before the retry's next attempt ends (epoch seconds), or None."""
        due = atom_meta(self._storage, retry.name).get(META_RETRY_DUE)
        return float(due) if due is not None else None

    def _attempt(self, retry: Retry, decided: bool = False) -> int:
        """The attempt a wait comes before: the next one, or (``decided``) the latest."""
        return len(self._storage.get_retry_history(retry.name)) + (0 if decided else 1)

    def start_wait(self, retry: Retry, seconds: float) -> None:
        """Store when the wait of ``seconds`` before the retry's next attempt ends."""
        due = self._clock() + seconds if seconds > 0 else None
        if due is not None or self.due(retry) is not None:
            self._storage.update_atom_metadata(retry.name, {META_RETRY_DUE: due})

    def remaining_wait(self, retry: Retry, longest: float) -> float:
        """Seconds left of a stored wait (a resumed flow waits only that), at most ``longest``.

        The bound keeps a wall clock set back while the flow was suspended from stretching it.
        """
        due = self.due(retry)
        return 0.0 if due is None else max(0.0, min(due - self._clock(), longest))

    def waiting(self, retry: Retry, seconds: float, decided: bool = False) -> None:
        """Announce that the retry waits ``seconds`` now until it is due (its timer is armed,
        or, ``decided``, its next attempt was decided and its requests carry the wait)."""
        due = self.due(retry)
        if due is not None:
            self._waits.announce(RetryWait(retry.name, self._attempt(retry, decided), due,
                                           seconds))

    def end_wait(self, retry: Retry, decided: bool = False, announce: bool = True) -> None:
        """The wait is over: forget its due time (so nothing shows it delayed) and say so
        (``decided``: the attempt it came before was decided already, see :meth:`waiting`;
        ``announce`` False: only forget it, as nobody was told it began)."""
        if self.due(retry) is None:
            return
        self._storage.update_atom_metadata(retry.name, {META_RETRY_DUE: None})
        if announce:
            self._waits.announce(RetryWait(retry.name, self._attempt(retry, decided), None, 0.0))

    def _announce(self, retry: Retry, state: str, old_state: str, result: Any) -> None:
        self._on_state(retry, state)
        details = {
            "retry_name": retry.name,
            "retry_uuid": self._storage.get_atom_uuid(retry.name),
            "old_state": old_state,
        }
        if result is not NO_RESULT:
            details["result"] = self._storage.masked(result)
        self._notifier.notify(state, details)

    def reset_state(self, retry: Retry, state: str, keep_failures: bool = False) -> None:
        """Forget the retry's history and move it to ``state`` (PENDING or IGNORE)."""
        old_state = self._storage.get_atom_state(retry.name)
        self._storage.reset(retry.name, state, keep_failures)
        self._announce(retry, state, old_state, NO_RESULT)

    def change_state(self, retry: Retry, state: str, result: Any = NO_RESULT) -> bool:
        """Store then announce ``retry``'s move to ``state``; False if nothing changed."""
        storage = self._storage
        old_state = storage.get_atom_state(retry.name)
        if state in _RETRY_RESULT_STATES:
            storage.save(retry.name, None if result is NO_RESULT else result, state)
            if state == states.REVERTED:
                # A reverted controller starts its next use with an empty history.
                storage.cleanup_retry_history(retry.name, state)
        else:
            if state == old_state:
                return False
            storage.set_atom_state(retry.name, state)
        self._announce(retry, state, old_state, result)
        return True

    def _call(self, method: Any, arguments: dict[str, Any], retry: Retry, **extra: Any) -> Any:
        kwargs = dict(arguments)
        kwargs[EXECUTE_REVERT_HISTORY] = self._storage.get_retry_history(retry.name)
        kwargs.update(extra)
        return method(**kwargs)

    def execute(self, retry: Retry, arguments: dict[str, Any]) -> tuple[str, Any]:
        """Run ``retry.execute`` now; return ``(EXECUTED, value or Failure)``."""
        self.change_state(retry, states.RUNNING)
        try:
            return ex.EXECUTED, self._call(retry.execute, arguments, retry)
        except Exception:
            return ex.EXECUTED, Failure()

    def revert(self, retry: Retry, arguments: dict[str, Any]) -> tuple[str, Any]:
        """Run ``retry.revert`` now; return ``(REVERTED, value or Failure)``."""
        self.change_state(retry, states.REVERTING)
        failures = self._storage.get_execute_failures()
        try:
            value = self._call(retry.revert, arguments, retry, **{REVERT_FLOW_FAILURES: failures})
            return ex.REVERTED, value
        except Exception:
            return ex.REVERTED, Failure()

    def complete_execution(self, retry: Retry, result: Any) -> Any:
        """Store the outcome of the retry's ``execute``; return it."""
        if not isinstance(result, Failure):
            result = unfit_for_json(retry.name, "returned", result) or result
        if isinstance(result, Failure):
            self.change_state(retry, states.FAILURE, result=result)
        else:
            self.change_state(retry, states.SUCCESS, result=result)
        return result

    def complete_reversion(self, retry: Retry, result: Any) -> None:
        """Store the outcome of the retry's ``revert``."""
        if isinstance(result, Failure):
            self.change_state(retry, states.REVERT_FAILURE, result=result)
        else:
            self.change_state(retry, states.REVERTED, result=result)

    def on_failure(self, retry: Retry, atom: Atom, failure: Failure,
                   arguments: dict[str, Any]) -> Any:
        """Record ``atom``'s failure in the retry's history and ask the retry what to do."""
        self._storage.save_retry_failure(retry.name, atom.name, failure)
        return self._call(retry.on_failure, arguments, retry)
