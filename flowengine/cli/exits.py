"""Exit codes of the flow commands (``run``, ``flows``, ``show``, ``graph``, ``check``).

Scripts and schedulers branch on these, so they never change meaning:

====  ========================================================================================
0     success (``run``: the flow ended SUCCESS; ``check``: the flow compiles and validates)
1     an error before or around the run: a module or factory that cannot be imported or
      called, an unreadable backend, missing inputs (``MissingDependencies``), a flow that
      does not compile
2     usage error (click's own), including a FLOW_ID or ``--resume`` id that is not stored
3     ``run``: the flow failed and was reverted (REVERTED)
4     ``run``: the flow ended in FAILURE (a revert failed, or the engine itself failed)
5     ``run``: the flow was suspended (SIGINT/SIGTERM); resume it with ``--resume``
130   ``run``: interrupted a second time while suspending
====  ========================================================================================
"""

from __future__ import annotations

from flowengine import states

OK = 0
ERROR = 1
USAGE = 2
REVERTED = 3
FAILED = 4
SUSPENDED = 5
INTERRUPTED = 130

#: Exit code of ``run`` for the state its flow ended in (anything else is ERROR).
BY_FLOW_STATE: dict[str, int] = {
    states.SUCCESS: OK,
    states.REVERTED: REVERTED,
    states.FAILURE: FAILED,
    states.SUSPENDED: SUSPENDED,
}


def for_flow_state(state: str | None) -> int:
    """The exit code for a flow that ended in ``state``."""
    return BY_FLOW_STATE.get(state or "", ERROR)
