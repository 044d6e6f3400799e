"""``flowengine conductor``: claim jobs from a jobboard and run them until SIGTERM."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
from typing import Any

import click

from flowengine.cli import records, telemetry
from flowengine.cli.board_options import board_options as board_options_decorator
from flowengine.cli.board_options import open_board
from flowengine.cli.broker import broker_kwargs
from flowengine.cli.flow_options import backend_option, engine_options
from flowengine.cli.loading import (
    allow_factories_option,
    ensure_cwd_on_path,
    factory_policy_of,
)
from flowengine.cli.options import show_envvars, split_env_list
from flowengine.cli.signal_relay import SignalRelay


@show_envvars
@click.command("conductor")
@board_options_decorator
@backend_option(required=True)
@click.option("--name", envvar="FLOWENGINE_NAME", default=None,
              help="The conductor's name, its claims' owner (default: conductor-HOST-PID).")
@engine_options
@click.option("--max-jobs", envvar="FLOWENGINE_MAX_JOBS", type=click.IntRange(min=1),
              default=4, show_default=True, help="Jobs run at once.")
@click.option("--delete-succeeded", envvar="FLOWENGINE_DELETE_SUCCEEDED", is_flag=True,
              help="Delete the logbook of a job whose flow succeeded. Logbooks of jobs that "
                   "failed, were reverted or trashed are always kept, with how they ended "
                   "(`flowengine jobs list --backend`).")
@click.option("--keep-logbooks", envvar="FLOWENGINE_KEEP_LOGBOOKS", is_flag=True, hidden=True,
              help="Kept for older scripts: logbooks are kept unless --delete-succeeded.")
@allow_factories_option("a job's stored factory may come from any module outside those "
                        "(a job naming another is trashed, saying why)")
@click.option("--log-level", envvar="FLOWENGINE_LOG_LEVEL", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def conductor_command(board_uri: str, board_options: tuple[str, ...], backend_uri: str,
                      name: str | None, engine_name: str, topics: tuple[str, ...],
                      max_jobs: int, delete_succeeded: bool, keep_logbooks: bool,
                      allow_factories: str | None, log_level: str,
                      **broker: Any) -> None:
    """Claim jobs from the board and run them until SIGTERM or SIGINT.

    On the first signal it stops claiming, suspends the running jobs (their running atoms
    finish) and hands them back to the board for another conductor, without counting an
    attempt against them; a second signal exits at once (their claims then expire).
    """
    from flowengine.conductors.backends.impl_nonblocking import NonBlockingConductor

    if delete_succeeded and keep_logbooks:
        raise click.UsageError("--delete-succeeded deletes what --keep-logbooks keeps: give one")

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ensure_cwd_on_path()
    name = name or f"conductor-{socket.gethostname()}-{os.getpid()}"
    options: dict[str, Any] = {}
    if telemetry.is_worker_based(engine_name):
        options = {**broker_kwargs(**broker), "topics": split_env_list(tuple(topics))}
    persistence = records.open_backend(backend_uri, create=True)
    try:
        with open_board(board_uri, board_options, persistence=persistence, name=name) as board:
            conductor = NonBlockingConductor(
                name, board, persistence=persistence, engine=engine_name, engine_options=options,
                max_simultaneous_jobs=max_jobs, delete_logbook=delete_succeeded,
                factory_policy=factory_policy_of(allow_factories))
            _run_until_signalled(conductor)
    finally:
        persistence.close()


def _run_until_signalled(conductor: Any) -> None:
    def _stop(signum: signal.Signals) -> None:
        # On the relay thread: a handler must not take locks (see signal_relay). A second
        # signal raises SystemExit in the main thread at once, without coming here.
        with contextlib.suppress(OSError):
            click.echo(f"received {signum.name}: handing running jobs back", err=True)
        conductor.stop()

    relay = SignalRelay(_stop, "flowengine-conductor-signals", again="exit")
    relay.install()
    try:
        click.echo(f"conductor {conductor.name} running (pid {os.getpid()})", err=True)
        conductor.run()
    finally:
        relay.restore()
