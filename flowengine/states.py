"""States of flows, atoms (tasks and retries), jobs and engines, and their allowed transitions.

Constant names and values are TaskFlow's. The transition tables are frozen module-level data built
once at import; the ``check_*_transition`` functions keep TaskFlow's semantics exactly:

* flows and jobs: ``True`` to apply a transition, ``False`` to ignore it (same state, or a
  suspend/resume request that arrives after the flow finished), :class:`InvalidState` otherwise;
* tasks and retries: ``True`` when allowed, ``False`` otherwise (never raises; callers skip a
  transition that returns ``False``).
"""

from __future__ import annotations

from flowengine import exceptions as exc

__all__ = [
    # Job states.
    "CLAIMED",
    "COMPLETE",
    "UNCLAIMED",
    # Flow and atom states.
    "PENDING",
    "RUNNING",
    "SUCCESS",
    "FAILURE",
    "REVERTING",
    "REVERTED",
    "REVERT_FAILURE",
    "SUSPENDING",
    "SUSPENDED",
    "RESUMING",
    "RETRYING",
    "IGNORE",
    # Atom intentions.
    "EXECUTE",
    "REVERT",
    "RETRY",
    "INTENTIONS",
    # Engine states.
    "UNDEFINED",
    "GAME_OVER",
    "ANALYZING",
    "SCHEDULING",
    "WAITING",
    "META_STATES",
    # State sets.
    "JOB_STATES",
    "FLOW_STATES",
    "TASK_STATES",
    "RETRY_STATES",
    "ENGINE_STATES",
    "ATOM_ACTIVE_STATES",
    "ATOM_FINISHED_STATES",
    "FLOW_FINISHED_STATES",
    # Transition tables and checks.
    "ALLOWED_JOB_TRANSITIONS",
    "ALLOWED_FLOW_TRANSITIONS",
    "IGNORED_FLOW_TRANSITIONS",
    "ALLOWED_TASK_TRANSITIONS",
    "ALLOWED_RETRY_TRANSITIONS",
    "check_job_transition",
    "check_flow_transition",
    "check_task_transition",
    "check_retry_transition",
]

# Job states.
CLAIMED = "CLAIMED"
COMPLETE = "COMPLETE"
UNCLAIMED = "UNCLAIMED"

# Flow states; atoms use a subset of them plus RETRYING, IGNORE and REVERT_FAILURE.
PENDING = "PENDING"
RUNNING = "RUNNING"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
REVERTING = "REVERTING"
REVERTED = "REVERTED"
SUSPENDING = "SUSPENDING"
SUSPENDED = "SUSPENDED"
RESUMING = "RESUMING"
RETRYING = "RETRYING"
IGNORE = "IGNORE"
REVERT_FAILURE = "REVERT_FAILURE"

# Atom intentions (IGNORE is both a state and an intention, as in TaskFlow).
EXECUTE = "EXECUTE"
REVERT = "REVERT"
RETRY = "RETRY"
INTENTIONS = (EXECUTE, IGNORE, REVERT, RETRY)

# Engine (run loop) states; UNDEFINED and GAME_OVER are its meta states.
UNDEFINED = "UNDEFINED"
GAME_OVER = "GAME_OVER"
ANALYZING = "ANALYZING"
SCHEDULING = "SCHEDULING"
WAITING = "WAITING"
META_STATES = (GAME_OVER, UNDEFINED)

Transition = tuple[str, str]

JOB_STATES: frozenset[str] = frozenset({UNCLAIMED, CLAIMED, COMPLETE})
FLOW_STATES: frozenset[str] = frozenset(
    {PENDING, RUNNING, SUCCESS, FAILURE, REVERTED, SUSPENDING, SUSPENDED, RESUMING}
)
TASK_STATES: frozenset[str] = frozenset(
    {PENDING, RUNNING, SUCCESS, FAILURE, REVERTING, REVERTED, REVERT_FAILURE, IGNORE}
)
RETRY_STATES: frozenset[str] = TASK_STATES | {RETRYING}
ENGINE_STATES: frozenset[str] = frozenset(
    {UNDEFINED, RESUMING, SCHEDULING, WAITING, ANALYZING, GAME_OVER}
    | {SUCCESS, FAILURE, REVERTED, SUSPENDED}
)

#: Atom states in which work (execute, revert or a retry's reset) is in progress.
ATOM_ACTIVE_STATES: frozenset[str] = frozenset({RUNNING, REVERTING, RETRYING})
#: Atom states in which nothing is in progress and a result (or failure) is settled.
ATOM_FINISHED_STATES: frozenset[str] = frozenset(
    {SUCCESS, FAILURE, REVERTED, REVERT_FAILURE, IGNORE}
)
#: States a flow can end an engine run in.
FLOW_FINISHED_STATES: frozenset[str] = frozenset({SUCCESS, FAILURE, REVERTED, SUSPENDED})

ALLOWED_JOB_TRANSITIONS: frozenset[Transition] = frozenset(
    {
        (UNCLAIMED, CLAIMED),
        (CLAIMED, UNCLAIMED),  # lost, abandoned or released
        (CLAIMED, COMPLETE),
    }
)

ALLOWED_FLOW_TRANSITIONS: frozenset[Transition] = frozenset(
    {
        (PENDING, RUNNING),
        (RUNNING, SUCCESS),
        (RUNNING, FAILURE),
        (RUNNING, REVERTED),
        (RUNNING, SUSPENDING),
        (RUNNING, RESUMING),
        # A finished flow may run again after its flow (or detail) was changed.
        (SUCCESS, RUNNING),
        (FAILURE, RUNNING),
        (REVERTED, PENDING),
        (SUCCESS, PENDING),
        # A suspending flow waits for running atoms, which may finish it in any way.
        (SUSPENDING, SUSPENDED),
        (SUSPENDING, SUCCESS),
        (SUSPENDING, FAILURE),
        (SUSPENDING, REVERTED),
        (SUSPENDING, RESUMING),
        (SUSPENDED, RUNNING),
        (RESUMING, SUSPENDED),
    }
)

# Suspend/resume requests that race with the end of a flow are dropped, not errors.
IGNORED_FLOW_TRANSITIONS: frozenset[Transition] = frozenset(
    (old, new)
    for old in (PENDING, FAILURE, SUCCESS, SUSPENDED, REVERTED)
    for new in (SUSPENDING, SUSPENDED, RESUMING)
    if old != new
)

ALLOWED_TASK_TRANSITIONS: frozenset[Transition] = frozenset(
    {
        (PENDING, RUNNING),
        (PENDING, IGNORE),
        (RUNNING, SUCCESS),
        (RUNNING, FAILURE),
        (FAILURE, REVERTING),
        (SUCCESS, REVERTING),
        (REVERTING, REVERTED),
        (REVERTING, REVERT_FAILURE),  # the engine leaves it there; a repair may run it again
        (REVERTED, PENDING),
        (IGNORE, PENDING),
    }
)

ALLOWED_RETRY_TRANSITIONS: frozenset[Transition] = ALLOWED_TASK_TRANSITIONS | {
    (SUCCESS, RETRYING),
    (RETRYING, RUNNING),
}


def _check_or_raise(
    kind: str,
    allowed: frozenset[Transition],
    ignored: frozenset[Transition],
    old_state: str,
    new_state: str,
) -> bool:
    if old_state == new_state:
        return False
    pair = (old_state, new_state)
    if pair in allowed:
        return True
    if pair in ignored:
        return False
    raise exc.InvalidState(f"{kind} transition from '{old_state}' to '{new_state}' is not allowed")


_NONE: frozenset[Transition] = frozenset()


def check_job_transition(old_state: str, new_state: str) -> bool:
    """Check a job state transition.

    Args:
        old_state: The job's current state.
        new_state: The requested state.

    Returns:
        ``True`` if the transition should be applied, ``False`` if it should be ignored (the
        states are equal).

    Raises:
        InvalidState: If the transition is forbidden; the message names both states.
    """
    return _check_or_raise("Job", ALLOWED_JOB_TRANSITIONS, _NONE, old_state, new_state)


def check_flow_transition(old_state: str, new_state: str) -> bool:
    """Check a flow state transition.

    Args:
        old_state: The flow's current state.
        new_state: The requested state.

    Returns:
        ``True`` if the transition should be applied, ``False`` if it should be ignored (the
        states are equal, or a suspend/resume arrives when the flow is not running).

    Raises:
        InvalidState: If the transition is forbidden; the message names both states.
    """
    return _check_or_raise(
        "Flow", ALLOWED_FLOW_TRANSITIONS, IGNORED_FLOW_TRANSITIONS, old_state, new_state
    )


def check_task_transition(old_state: str, new_state: str) -> bool:
    """Tell whether a task may move from ``old_state`` to ``new_state``.

    Args:
        old_state: The task's current state.
        new_state: The requested state.

    Returns:
        ``True`` if allowed, ``False`` otherwise (including equal states); never raises.
    """
    return (old_state, new_state) in ALLOWED_TASK_TRANSITIONS


def check_retry_transition(old_state: str, new_state: str) -> bool:
    """Tell whether a retry controller may move from ``old_state`` to ``new_state``.

    Retries follow the task table plus ``SUCCESS -> RETRYING -> RUNNING``.

    Args:
        old_state: The retry's current state.
        new_state: The requested state.

    Returns:
        ``True`` if allowed, ``False`` otherwise (including equal states); never raises.
    """
    return (old_state, new_state) in ALLOWED_RETRY_TRANSITIONS
