"""``flowengine suspend``: ask the engine running a stored flow, in any process, to suspend it.

The request goes through the persistence backend the engine stores the flow in (see
:mod:`flowengine.engines.suspend_requests`): the engine sees it at its next atom transition,
lets its running atoms finish and stops SUSPENDED.
"""

from __future__ import annotations

import time
from typing import Any, NoReturn

import click

from flowengine import exceptions as exc
from flowengine import states
from flowengine.cli import exits, records
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.flow_options import backend_option
from flowengine.cli.loading import LoadError
from flowengine.cli.options import show_envvars
from flowengine.engines import suspend_requests as sr
from flowengine.persistence import base
from flowengine.persistence.backends._uri import mask_urls
from flowengine.worker_based.remote_control import ACTION_SUSPEND, push_suspend

#: Seconds between two reads of the flow's state while ``--wait`` waits.
WAIT_POLL = 0.2


@show_envvars
@click.command("suspend")
@click.argument("flow_id")
@backend_option(required=True)
@broker_options
@click.option("--wait", "wait_seconds", type=click.FloatRange(min=0), default=None,
              envvar="FLOWENGINE_WAIT", metavar="SECONDS",
              help="Wait up to SECONDS for the flow to stop (exit 5 once SUSPENDED).")
def suspend_command(flow_id: str, backend_uri: str, wait_seconds: float | None,
                    **broker: Any) -> None:
    """Ask the engine running FLOW_ID to suspend it: its running atoms finish, nothing new
    starts, and the flow ends SUSPENDED (resume it with ``flowengine run --resume``).

    The engine may run in any process that stores the flow in --backend; it sees the request
    at its next atom transition. A worker-based engine on the broker the broker options name
    (--url, --exchange, --transport...) is also told at once through it. Exits 2 when the
    flow is not running anywhere; with --wait, 5 once it is SUSPENDED, or 1 if it ended
    otherwise or the wait ran out.
    """
    backend = records.open_backend(backend_uri, create=False)
    try:
        try:
            asked = sr.request_suspend(backend, flow_id, by="flowengine suspend")
        except sr.SuspendRefused as err:
            click.echo(f"error: {err}", err=True)
            raise SystemExit(exits.USAGE) from err
        except exc.StorageFailure as err:
            raise LoadError(f"cannot write to {mask_urls(backend_uri)}: {err}") from err
        tell(asked, flow_id, broker_kwargs(**broker))
        if wait_seconds is not None:
            _wait(backend, flow_id, wait_seconds)
    finally:
        backend.close()


def tell(asked: sr.Requested, flow_id: str, broker: dict[str, Any],
         action: str = ACTION_SUSPEND) -> None:
    """Say what was asked, and push it to the flow's engine through the broker the options
    name (``broker``: the command's broker options)."""
    click.echo(asked.text)
    settings = {key: value for key, value in broker.items() if key != "taskflow_compat"}
    pushed = push_suspend(asked.running_on, flow_id, settings, action=action)
    if pushed is not None:
        click.echo(mask_urls(pushed))


def wait_for_end(backend: base.Backend, flow_id: str, seconds: float) -> str | None:
    """The stored flow's state once it stops running, or after ``seconds`` (read every
    :data:`WAIT_POLL` seconds: the flow runs in another process, which can only be watched
    through its store); None once it is no longer stored (a conductor deletes a consumed
    job's logbook)."""
    deadline = time.monotonic() + seconds
    while True:
        conn = backend.get_connection()
        try:
            state = conn.get_flow_details(flow_id, lazy=True).state
        except exc.NotFound:
            return None
        finally:
            conn.close()
        if state not in (states.RUNNING, states.SUSPENDING) or time.monotonic() >= deadline:
            return state
        time.sleep(WAIT_POLL)


def _wait(backend: base.Backend, flow_id: str, seconds: float) -> None:
    wait_and_exit(backend, flow_id, seconds, states.SUSPENDED, exits.SUSPENDED,
                  f"flow {flow_id} is SUSPENDED")


def wait_and_exit(backend: base.Backend, flow_id: str, seconds: float, wanted: str, code: int,
                  said: str, failed: int = exits.ERROR) -> NoReturn:
    """Wait for the flow to end (:func:`wait_for_end`), then exit ``code`` saying ``said`` if
    it ended ``wanted``; else say how it is and exit ``failed`` (it ended FAILURE) or 1."""
    state = wait_for_end(backend, flow_id, seconds)
    if state == wanted:
        click.echo(said)
        raise SystemExit(code)
    click.echo(f"error: flow {flow_id} is {state or 'no longer stored'}"
               + (" (still)" if state in (states.RUNNING, states.SUSPENDING) else ""), err=True)
    raise SystemExit(failed if state == states.FAILURE else exits.ERROR)
