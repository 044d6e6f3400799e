"""``flowengine locks``: who holds each lock and limit, and who waits for it, in order."""

from __future__ import annotations

from typing import Any

import click

from flowengine.cli.board_options import board_options
from flowengine.cli.formatting import table, to_json, truncate
from flowengine.cli.options import json_option, show_envvars


def _row(entry: Any) -> dict[str, Any]:
    from flowengine import coordination

    info = dict(entry.info)
    return {"key": entry.key, "kind": "lock" if entry.limit == 1 else "limit",
            "limit": entry.limit, "position": entry.position,
            "state": "held" if entry.holding else "waiting",
            "holder": coordination.describe_holder(info), "owner": info.get("owner"),
            "flow": info.get("flow"), "flow_name": info.get("flow_name"),
            "job": info.get("job"), "task": info.get("task"), "since": info.get("since"),
            "expires_in": None if entry.expires_in is None else round(entry.expires_in, 1)}


@show_envvars
@click.command("locks")
@board_options
@click.option("--key", "prefix", envvar="FLOWENGINE_KEY", default="",
              help="Only the locks and limits whose name starts with this.")
@json_option()
def locks_command(board_uri: str, board_options: tuple[str, ...], prefix: str,
                  as_json: bool) -> None:
    """List the locks and concurrency limits on the board's service: for each, who holds it
    and who waits for it, in the order they will get it.

    Locks live beside the board's jobs (its namespace or path), where conductors, engines and
    workers using that board's service hold them.
    """
    from flowengine import coordination
    from flowengine import exceptions as exc
    from flowengine.cli.board_options import board_conf

    try:
        with coordination.connect(board_conf(board_uri, board_options)) as coordinator:
            rows = [_row(e) for e in coordinator.listing() if e.key.startswith(prefix)]
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--board") from err
    except exc.TaskFlowException as err:
        raise click.ClickException(f"cannot list the locks: {err}") from err
    if as_json:
        click.echo(to_json(rows, indent=2))
        return
    if not rows:
        click.echo("no locks held or waited for")
        return
    shown = [[r["key"], r["kind"], str(r["limit"]), str(r["position"]), r["state"],
              truncate(r["holder"]), r["since"] or "-",
              "-" if r["expires_in"] is None else f"{r['expires_in']}s"] for r in rows]
    for line in table(("KEY", "KIND", "LIMIT", "POSITION", "STATE", "WHO", "SINCE", "LEASE"),
                      shown):
        click.echo(line)
