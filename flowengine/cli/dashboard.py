"""``flowengine dashboard``: serve the web dashboard (needs the ``dashboard`` extra)."""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from flowengine.cli import records
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.flow_options import backend_option
from flowengine.cli.loading import allow_factories_option
from flowengine.cli.options import show_envvars, without_options
from flowengine.persistence.backends._uri import mask_urls


@show_envvars
@without_options("taskflow_compat")  # the dashboard reads events, flowengine's alone
@click.command("dashboard")
@backend_option(required=True)
@broker_options
@click.option("--board", envvar="FLOWENGINE_BOARD", default=None, metavar="URL",
              help="Jobboard URL: adds the jobs page.")
@click.option("--host", envvar="FLOWENGINE_HOST", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --token.")
@click.option("--port", envvar="FLOWENGINE_PORT", type=click.IntRange(1, 65535), default=8080,
              show_default=True, help="Port to listen on.")
@click.option("--read-only", is_flag=True, envvar="FLOWENGINE_READ_ONLY",
              help="Show everything, change nothing: actions are hidden and refused.")
@allow_factories_option("no flow's factory is imported: pages draw the stored atoms, without "
                        "links, and cannot resume a flow; refused with --read-only")
@click.option("--token", envvar="FLOWENGINE_TOKEN", default=None,
              help="Every request must present it (bearer token, basic auth password, or "
                   "?token= once in a browser). Prefer the environment variable.")
@click.pass_context
def dashboard_command(ctx: click.Context, backend_uri: str, board: str | None, host: str,
                      port: int, read_only: bool, allow_factories: str | None,
                      token: str | None, **broker: Any) -> None:
    """Serve a web dashboard of the stored flows, the live workers and the dead letters.

    Flows are read from --backend; live updates, workers and dead letters come from the
    broker the other commands take (--url, --exchange, --transport...).
    """
    try:
        # First: its ImportError names the extra, where uvicorn's would name only itself.
        from flowengine.dashboard import DashboardData, EventHub, access, create_app
        from flowengine.dashboard.interface import open_board
        from flowengine.worker_based.events import EventReceiver
    except ImportError as err:
        raise click.ClickException(str(err)) from err
    try:
        import uvicorn
    except ImportError as err:
        raise click.ClickException(f"the dashboard needs the 'dashboard' extra: pip install "
                                   f"'flowengine[dashboard]' ({err})") from err
    factories = _factories(ctx, allow_factories, read_only)
    if not access.is_loopback(host) and not token:
        raise click.UsageError(f"--host {host} is reachable from other machines: give --token "
                               "(or FLOWENGINE_TOKEN) too")
    backend = records.open_backend(backend_uri, create=False)
    settings = broker_kwargs(taskflow_compat=False, **broker)
    del settings["taskflow_compat"]
    hub = EventHub(lambda: EventReceiver(**settings))
    try:
        jobboard = open_board(board, backend) if board else None
    except ImportError as err:
        raise click.UsageError(str(err)) from err
    data = DashboardData(backend, hub, settings, jobboard, factories=factories)
    # Without a token, loopback is the only protection: refuse other Host names, so a web
    # page whose DNS name was rebound to 127.0.0.1 cannot read the dashboard.
    hosts = None if token else ["127.0.0.1", "localhost", "::1", "[::1]", host]
    app = create_app(data, read_only=read_only, token=token, allowed_hosts=hosts)
    click.echo(f"flowengine dashboard: http://{host}:{port}/ (flows from "
               f"{mask_urls(backend_uri)}{', read-only' if read_only else ''})", err=True)
    try:
        # No access log: a request line can hold a ?token= before it is exchanged for a cookie.
        # Open pages hold event streams: shutting down must not wait for them to leave.
        uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning",
                    timeout_graceful_shutdown=2)
    finally:
        backend.close()


def _factories(ctx: click.Context, allow_factories: str | None, read_only: bool) -> Any:
    """The factory policy of the pages: none unless --allow-factories, and never read-only
    (given on the command line with --read-only it is refused; from the environment, where
    conductors may share it, it is ignored)."""
    from flowengine.cli.loading import factory_policy_of
    from flowengine.dashboard.compiled import NO_FACTORIES

    if read_only and allow_factories:
        if ctx.get_parameter_source("allow_factories") is ParameterSource.COMMANDLINE:
            raise click.UsageError("--allow-factories imports and runs stored factories; a "
                                   "--read-only dashboard never does: give one")
        return NO_FACTORIES
    return factory_policy_of(allow_factories, default=NO_FACTORIES)
