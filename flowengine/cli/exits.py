"""Exit codes of the ``flowengine`` commands.

Scripts and schedulers branch on these, so they never change meaning (3 to 5 are ``run``'s
alone, 7 the proving commands'):

====  ========================================================================================
0     success (``run``: the flow ended SUCCESS; ``check``: the flow compiles and validates)
1     an error before or around the run: a module or factory that cannot be imported or
      called, an unreadable backend, a broker that cannot be reached, missing inputs
      (``MissingDependencies``), a flow that does not compile
2     usage error (click's own), or nothing found where something was asked for: a FLOW_ID,
      ``--resume`` id or dead letter that is not stored, no live worker, no event in time
3     ``run``: the flow failed and was reverted (REVERTED)
4     ``run``: the flow ended in FAILURE (a revert failed, or the engine itself failed)
5     ``run``: the flow was suspended (SIGINT/SIGTERM); resume it with ``--resume``
6     ``run``: the run halted because its progress could not be recorded (the database is
      unreachable, the disk is full): nothing more ran and nothing was reverted; the stored
      record is as its last successful write left it, so resume with ``--resume`` once the
      backend is back
7     ``run``: the flow was cancelled (``flowengine cancel``, the dashboard, its
      ``--deadline``) and what it did was reverted (REVERTED); ``cancel --wait`` too, once it
      is; ``cancel`` and ``repair`` when they run the flow themselves
8     ``rehearse``, ``chaos``: a finding: the flow is not proven safe (3 to 7 are ``run``'s)
130   ``run``: interrupted a second time while suspending
====  ========================================================================================
"""

from __future__ import annotations

from typing import NoReturn

import click

from flowengine import states
from flowengine.persistence.backends._uri import mask_urls

OK = 0
ERROR = 1
USAGE = 2
REVERTED = 3
FAILED = 4
SUSPENDED = 5
HALTED = 6
CANCELLED = 7
FINDINGS = 8
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


def unreachable(what: str, where: str, err: BaseException) -> NoReturn:
    """Say on stderr that ``what`` cannot be done with the broker at ``where``, passwords
    masked, and exit with ERROR."""
    click.echo(f"error: cannot {what} {mask_urls(where)}: {mask_urls(str(err))}", err=True)
    raise SystemExit(ERROR) from err
