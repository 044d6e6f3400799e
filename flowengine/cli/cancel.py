"""``flowengine cancel``: cancel a stored flow, wherever it runs, and undo what it did.

A flow running in another process is asked through the persistence backend (and, for a
worker-based engine on the broker the options name, at once through it), as ``suspend`` asks
(see :mod:`flowengine.engines.suspend_requests`): its engine stops its running tasks and
reverts what they did. A flow that runs nowhere (suspended, failed, or whose process died) is
cancelled here: its engine is rebuilt as ``run --resume`` rebuilds it, and runs its reverts.
"""

from __future__ import annotations

from typing import Any

import click

from flowengine import exceptions as exc
from flowengine import states
from flowengine.cli import exits, records, run
from flowengine.cli.broker import broker_kwargs
from flowengine.cli.flow_options import backend_option, engine_options
from flowengine.cli.loading import LoadError
from flowengine.cli.options import operator, show_envvars
from flowengine.cli.suspend import tell, wait_and_exit
from flowengine.engines import suspend_requests as sr
from flowengine.persistence.backends._uri import mask_urls
from flowengine.worker_based.remote_control import ACTION_CANCEL

#: Flow states with nothing left to cancel.
_ENDED = (states.SUCCESS, states.REVERTED)


@show_envvars
@click.command("cancel")
@click.argument("flow_id")
@click.option("--reason", required=True, envvar="FLOWENGINE_REASON", metavar="TEXT",
              help="Why (stored with the flow; shown by show, the dashboard and events).")
@backend_option(required=True)
@engine_options
@click.option("--wait", "wait_seconds", type=click.FloatRange(min=0), default=None,
              envvar="FLOWENGINE_WAIT", metavar="SECONDS",
              help="Wait up to SECONDS for a flow running elsewhere to end (exit 7 once it is "
                   "cancelled and reverted).")
@click.pass_context
def cancel_command(ctx: click.Context, flow_id: str, reason: str, backend_uri: str,
                   engine_name: str, topics: tuple[str, ...], wait_seconds: float | None,
                   **broker: Any) -> None:
    """Cancel FLOW_ID (its uuid, or the start of it): its running tasks are asked to stop,
    what has not started never runs, and what completed is reverted in reverse order.

    \b
    A flow running in another process is asked to (through --backend, and at once through
    the broker the broker options name when it runs on a worker-based engine there); with
    --wait, the command waits for it to end. A flow running nowhere (SUSPENDED, FAILURE, or
    its process gone) is cancelled here, on its stored engine (or --engine), and its reverts
    run in this process.
    Exit codes: 0 asked (no --wait), 7 cancelled and reverted, 4 a revert failed (FAILURE),
    2 no such flow or nothing to cancel (it ended), 1 other errors or --wait ran out.
    """
    backend = records.open_backend(backend_uri, create=False)
    by = operator("flowengine cancel")
    settings = broker_kwargs(**broker)
    try:
        with records.reading(backend, backend_uri, keep_open=True) as conn:
            fd = records.find_flow(conn, flow_id, backend_uri)
        try:
            asked = sr.request_cancel(backend, fd.uuid, reason, by=by)
        except sr.NotRunning as err:
            if err.state in _ENDED:
                click.echo(f"error: flow {fd.name!r} ({fd.uuid}) is {err.state}: it ended, "
                           f"there is nothing to cancel", err=True)
                raise SystemExit(exits.USAGE) from err
            click.echo(f"{err}: cancelling it here, by running its reverts")
            ctx.exit(run.run_stored(ctx, fd.uuid, backend, backend_uri, engine_name, topics,
                                    settings, cancel=(reason, by)))
        except sr.SuspendRefused as err:
            click.echo(f"error: {err}", err=True)
            raise SystemExit(exits.USAGE) from err
        except exc.StorageFailure as err:
            raise LoadError(f"cannot write to {mask_urls(backend_uri)}: {err}") from err
        tell(asked, fd.uuid, settings, action=ACTION_CANCEL)
        if wait_seconds is not None:
            _wait(backend, fd.uuid, wait_seconds)
    finally:
        backend.close()


def _wait(backend: Any, flow_id: str, seconds: float) -> None:
    wait_and_exit(backend, flow_id, seconds, states.REVERTED, exits.CANCELLED,
                  f"flow {flow_id} is cancelled: REVERTED", failed=exits.FAILED)
