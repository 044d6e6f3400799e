"""Orphaned flows on the command line: ``flowengine check --orphans`` and ``flowengine jobs
repost-orphans`` (see :mod:`flowengine.jobs.orphans` for what an orphan is)."""

from __future__ import annotations

from typing import Any

import click

from flowengine.cli import exits, records
from flowengine.cli.board_options import open_board
from flowengine.cli.formatting import table, to_json, truncate


def _rows(found: list[Any]) -> list[list[str]]:
    return [[o.flow_uuid, truncate(o.flow_name), o.state or "PENDING", truncate(o.book_name)]
            for o in found]


def report(board_uri: str, board_options: tuple[str, ...], backend_uri: str,
           as_json: bool = False) -> int:
    """Print the flows orphaned on the board; exits.ERROR if there are any, else exits.OK."""
    from flowengine.jobs import orphans

    persistence = records.open_backend(backend_uri, create=False)
    try:
        with open_board(board_uri, board_options, persistence=persistence) as board:
            found = orphans.find_orphans(board, persistence)
    finally:
        persistence.close()
    if as_json:
        for orphan in found:  # JSON lines, as every command's --json
            click.echo(to_json(orphan.to_dict(), sort_keys=True))
    elif not found:
        click.echo("OK: no orphaned flow: every unfinished flow posted to the board has its job")
    else:
        click.echo(f"error: {len(found)} orphaned flow(s): stored unfinished, their job on no "
                   f"board, held by no live conductor", err=True)
        for line in table(("FLOW", "NAME", "STATE", "LOGBOOK"), _rows(found)):
            click.echo(line, err=True)
        click.echo("hint: flowengine jobs repost-orphans --board ... --backend ... posts their "
                   "jobs again (conductors resume them from their stored state)", err=True)
    return exits.ERROR if found else exits.OK


def repost(board_uri: str, board_options: tuple[str, ...], backend_uri: str,
           flow_ids: tuple[str, ...], wait: float | None) -> int:
    """Re-post the orphans (those ``flow_ids`` start, or all), once they stayed orphaned for
    ``wait`` seconds (None: the board's ``claim_ttl``); exits.OK, or exits.USAGE when a
    FLOW_ID names no orphan."""
    from flowengine.jobs import orphans

    persistence = records.open_backend(backend_uri, create=False)
    try:
        with open_board(board_uri, board_options, persistence=persistence) as board:
            found = _chosen(orphans.find_orphans(board, persistence), flow_ids)
            if not found:
                click.echo("no orphaned flow to re-post")
                return exits.OK
            settle = board.options.claim_ttl if wait is None else wait
            if settle > 0:
                # A conductor lists what it runs every third of claim_ttl: one that still runs
                # a flow (it claimed the job just before the board lost it) shows it by then.
                click.echo(f"{len(found)} orphaned flow(s); checking again in {settle:g}s that "
                           f"no conductor holds them...", err=True)
                board.wait_until(lambda: False, settle)
                still = {o.flow_uuid for o in orphans.find_orphans(board, persistence)}
                found = [o for o in found if o.flow_uuid in still]
            for orphan in found:
                job = orphans.repost(board, persistence, orphan)
                click.echo(f"reposted flow {orphan.flow_name!r} ({orphan.flow_uuid}, "
                           f"{orphan.state or 'PENDING'}) as job {job.uuid}")
    finally:
        persistence.close()
    return exits.OK


def _chosen(found: list[Any], flow_ids: tuple[str, ...]) -> list[Any]:
    if not flow_ids:
        return found
    chosen = []
    for flow_id in flow_ids:
        matches = [o for o in found if o.flow_uuid.startswith(flow_id)]
        if len(matches) != 1:
            what = "no orphaned flow" if not matches else f"{len(matches)} orphaned flows"
            click.echo(f"error: {what} with a uuid starting {flow_id!r} (see flowengine check "
                       f"--orphans)", err=True)
            raise SystemExit(exits.USAGE)
        chosen.append(matches[0])
    return chosen
