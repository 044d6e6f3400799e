"""``flowengine repair``: put right a flow its engine could not finish, instead of editing rows.

The repairs are :mod:`flowengine.engines.repair`'s: run failed reverts again, vouch for one atom
as reverted, or run on from a failed execute. The flow is repaired and then run here, on its
stored engine (or ``--engine``), as ``run --resume`` runs it; a flow an engine or a conductor
still holds is refused, naming where it runs.
"""

from __future__ import annotations

import contextlib
from typing import Any

import click

from flowengine.cli import exits, records, run
from flowengine.cli.board_options import open_board
from flowengine.cli.broker import broker_kwargs
from flowengine.cli.flow_options import backend_option, engine_options
from flowengine.cli.options import operator, show_envvars, split_from_env
from flowengine.engines import repair as repairing


@show_envvars
@click.command("repair")
@click.argument("flow_id")
@backend_option(required=True)
@click.option("--retry-reverts", is_flag=True, envvar="FLOWENGINE_RETRY_REVERTS",
              help="Run the failed reverts again (their cause is fixed), then the rest.")
@click.option("--mark-reverted", "mark_reverted", metavar="ATOM",
              envvar="FLOWENGINE_MARK_REVERTED",
              help="Store ATOM as reverted without running its revert (you vouch that what it "
                   "did is undone; needs --reason), then run the remaining reverts.")
@click.option("--retry-from", "retry_from", metavar="ATOM", envvar="FLOWENGINE_RETRY_FROM",
              help="ATOM's execute failed and its cause is fixed: run ATOM and everything "
                   "after it again, keeping the results before it.")
@click.option("--reason", envvar="FLOWENGINE_REASON", metavar="TEXT",
              help="Why (stored with the repair; required with --mark-reverted).")
@click.option("--board", "board_uri", envvar="FLOWENGINE_BOARD", default=None,
              help="A jobboard URI whose claims hold flows too: refuse a flow whose job a "
                   "conductor claimed.")
@click.option("--board-option", "board_options", envvar="FLOWENGINE_BOARD_OPTION",
              multiple=True, callback=split_from_env,
              help="Jobboard conf key=value. Repeatable.")
@engine_options
@click.pass_context
def repair_command(ctx: click.Context, flow_id: str, backend_uri: str, retry_reverts: bool,
                   mark_reverted: str | None, retry_from: str | None, reason: str | None,
                   board_uri: str | None, board_options: tuple[str, ...], engine_name: str,
                   topics: tuple[str, ...], **broker: Any) -> None:
    """Repair FLOW_ID (its uuid, or the start of it) and run it to its end here.

    \b
    Give one of --retry-reverts, --mark-reverted ATOM (with --reason) or --retry-from ATOM.
    The repair is recorded with the flow and its atoms (who, when, why, what) and shown by
    show, the dashboard and the event stream. Refused (exit 2) while an engine runs the flow,
    or a conductor on --board holds its job, naming where; and when the flow is not in a
    state the repair fits. Otherwise the exit code is run's: 0 SUCCESS, 3 REVERTED,
    4 FAILURE (a revert failed again), 7 cancelled (a cancelled flow's reverts finished).
    """
    chosen = [(action, atom) for action, atom, given in (
        (repairing.RETRY_REVERTS, None, retry_reverts),
        (repairing.MARK_REVERTED, mark_reverted, mark_reverted is not None),
        (repairing.RETRY_FROM, retry_from, retry_from is not None)) if given]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --retry-reverts, --mark-reverted ATOM, "
                               "--retry-from ATOM")
    [(action, atom)] = chosen
    by = operator("flowengine repair")
    try:
        repairing.Repair.now(action, atom, reason, by)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    backend = records.open_backend(backend_uri, create=False)
    try:
        with records.reading(backend, backend_uri, keep_open=True) as conn:
            fd = records.find_flow(conn, flow_id, backend_uri)
        with contextlib.ExitStack() as stack:
            board = None if board_uri is None else stack.enter_context(
                open_board(board_uri, board_options, persistence=backend))
            held = repairing.holder(fd.meta, fd.uuid, board)
        if held is not None:
            click.echo(f"error: flow {fd.name!r} ({fd.uuid}) is held by {held}: it cannot be "
                       f"repaired while it runs", err=True)
            raise SystemExit(exits.USAGE)
        try:
            code = run.run_stored(ctx, fd.uuid, backend, backend_uri, engine_name, topics,
                                  broker_kwargs(**broker), repair=(action, atom, reason, by))
        except repairing.RepairRefused as err:
            click.echo(f"error: {err}", err=True)
            raise SystemExit(exits.USAGE) from err
    finally:
        backend.close()
    ctx.exit(code)
