"""``flowengine flows`` and ``flowengine show``: what stored flows did, read from a backend."""

from __future__ import annotations

from typing import Any

import click

from flowengine import states
from flowengine.cli import formatting as fmt
from flowengine.cli import records
from flowengine.cli.flow_options import backend_option
from flowengine.cli.options import json_option, show_envvars
from flowengine.persistence.atom_meta import META_COORDINATION, describe_wait


@show_envvars
@click.command("flows")
@backend_option(required=True)
@click.option("--state", "states_wanted", multiple=True, envvar="FLOWENGINE_STATE",
              type=click.Choice(sorted(states.FLOW_STATES), case_sensitive=False),
              help="Only flows in this state (SUCCESS, REVERTED, ...). Repeatable.")
@json_option()
def flows_command(backend_uri: str, states_wanted: tuple[str, ...], as_json: bool) -> None:
    """List stored flows: state, atom counts by state, last update.

    With --json, one JSON object per flow, one per line.
    """
    wanted = {s.upper() for s in states_wanted}
    backend = records.open_backend(backend_uri, create=False)
    with records.reading(backend, backend_uri) as conn:
        found = [records.flow_summary(book, fd) for book, fd in records.iter_flows(conn)]
    found = [f for f in found if not wanted or f["state"] in wanted]
    if as_json:
        for flow in found:
            click.echo(fmt.to_json(flow, sort_keys=True))
        return
    if not found:
        click.echo("no flows")
        return
    rows = [[f["uuid"], f["name"], f["state"] or "-", _counts(f), f["updated_at"] or "-",
             f["book"] or "-"] for f in found]
    for line in fmt.table(["FLOW", "NAME", "STATE", "ATOMS", "UPDATED", "BOOK"], rows):
        click.echo(line)


def _counts(flow: dict[str, Any]) -> str:
    parts = ", ".join(f"{n} {state}" for state, n in flow["atom_states"].items())
    return f"{flow['atoms']} ({parts})" if parts else "0"


@show_envvars
@click.command("show")
@click.argument("flow_id")
@backend_option(required=True)
@click.option("--tracebacks", is_flag=True, envvar="FLOWENGINE_TRACEBACKS",
              help="Print the traceback of each failure.")
@click.option("--full", is_flag=True, envvar="FLOWENGINE_FULL",
              help="Do not shorten results.")
@json_option()
def show_command(flow_id: str, backend_uri: str, tracebacks: bool, full: bool,
                 as_json: bool) -> None:
    """Show one stored flow (FLOW_ID: its uuid, or the start of it) and its atoms.

    Exit code 2 when no stored flow has that id.
    """
    backend = records.open_backend(backend_uri, create=False)
    with records.reading(backend, backend_uri) as conn:
        fd = records.find_flow(conn, flow_id, backend_uri)
        flow = records.flow_summary(None, fd, records.book_written(conn, fd))
        atoms = [records.atom_record(ad) for ad in records.atoms_of(fd)]
    flow["meta"] = fd.meta
    if as_json:
        click.echo(fmt.to_json({"flow": flow, "atoms": atoms}, sort_keys=True))
        return
    click.echo(f"flow {flow['name']} ({flow['uuid']}): {flow['state'] or '-'}")
    click.echo(f"  atoms: {_counts(flow)}")
    click.echo(f"  updated: {flow['updated_at'] or '-'}")
    if flow["factory"]:
        click.echo(f"  factory: {flow['factory']}")
    for line in _coordination_lines(fd.meta) + _interventions(fd.meta):
        click.echo(f"  {line}")
    click.echo("")
    for line in _atom_table(atoms, None if full else fmt.VALUE_WIDTH):
        click.echo(line)
    _echo_attempts(atoms)
    _echo_failures(atoms, tracebacks)


def _interventions(meta: dict[str, Any]) -> list[str]:
    """What operators did to the flow, and what bounds it: its deadline, a cancel (asked, or
    applied), its repairs."""
    # Imported here: listing flows (and every --help) must not load the engines.
    from flowengine.engines import repair as repairing
    from flowengine.engines import stopping
    from flowengine.engines import suspend_requests as sr

    lines = []
    deadline = stopping.stored_deadline(meta)
    if deadline is not None:
        seconds = (meta.get(stopping.META_DEADLINE) or {}).get("seconds")
        given = f" ({seconds:g}s after it first ran)" if isinstance(seconds, int | float) else ""
        lines.append(f"deadline: {fmt.timestamp(deadline)}{given}")
    asked = stopping.CancelRequest.from_record(meta.get(sr.META_CANCEL_REQUEST))
    if asked is not None and stopping.META_CANCELLED not in meta:
        lines.append(f"cancel requested by {asked.by} at {asked.at}: {asked.reason}")
    done = stopping.CancelRequest.from_record(meta.get(stopping.META_CANCELLED))
    if done is not None:
        lines.append(str(done))
    repairs = [r for r in meta.get(repairing.META_REPAIRS) or () if isinstance(r, dict)]
    if repairs:
        lines.append("repairs:")
        for record in repairs:
            about = f" {record.get('atom')}" if record.get("atom") else ""
            why = f": {record.get('reason')}" if record.get("reason") else ""
            atoms = ", ".join(map(str, record.get("atoms") or ())) or "none"
            lines.append(f"  {record.get('at')} {record.get('action')}{about} by "
                         f"{record.get('by')}{why} (atoms: {atoms})")
    return lines


def _coordination_lines(meta: dict[str, Any]) -> list[str]:
    """The locks a running flow holds, or the one it waits for (see engines/admission.py)."""
    found = meta.get(META_COORDINATION)
    if not isinstance(found, dict):
        return []
    lines = []
    if found.get("locks"):
        lines.append(f"locks held: {', '.join(map(str, found['locks']))}")
    if isinstance(found.get("waiting"), dict):
        lines.append(f"waiting for {describe_wait(found['waiting'])}")
    return lines


def _atom_table(atoms: list[dict[str, Any]], width: int | None) -> list[str]:
    headers = ["ATOM", "KIND", "STATE", "INTENTION", "PROGRESS", "STARTED", "DURATION", "REVERT"]
    # An atom waiting for a lock or a concurrency limit is not running: shown as WAITING.
    rows = [[atom["name"], atom["kind"],
             "WAITING" if atom["waiting_for"] else atom["state"] or "-", atom["intention"] or "-",
             fmt.percent(atom["progress"]), atom["started_at"] or "-",
             fmt.duration(atom["duration"]), fmt.duration(atom["revert_duration"])]
            for atom in atoms]
    # Attempts and workers are shown only when recorded (retries, and engines that store them).
    for key, title in (("attempts", "ATTEMPTS"), ("workers", "WORKERS"),
                       ("delayed_until", "DELAYED UNTIL")):
        if any(atom[key] is not None for atom in atoms):
            headers.append(title)
            for row, atom in zip(rows, atoms):
                row.append(_listed(atom[key]))
    if any(atom["waiting_for"] for atom in atoms):
        from flowengine.engines.admission import describe_wait

        headers.append("WAITING FOR")
        for row, atom in zip(rows, atoms):
            row.append(describe_wait(atom["waiting_for"]) if atom["waiting_for"] else "-")
    headers.append("RESULT")
    for row, atom in zip(rows, atoms):
        row.append(fmt.short_value(atom["result"], width))
    return fmt.table(headers, rows)


def _listed(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value)) or "-"
    return str(value)


def _echo_attempts(atoms: list[dict[str, Any]]) -> None:
    """Every remote attempt of each atom (only engines that run atoms elsewhere log them)."""
    rows = [[atom["name"], str(a.get("action") or "-"), _listed(a.get("attempt")),
             str(a.get("worker") or "-"), str(a.get("outcome") or "-")]
            for atom in atoms for a in atom["attempt_log"] or ()]
    if not rows:
        return
    click.echo("\nattempts:")
    for line in fmt.table(["ATOM", "ACTION", "ATTEMPT", "WORKER", "OUTCOME"], rows):
        click.echo(f"  {line}")


def _echo_failures(atoms: list[dict[str, Any]], tracebacks: bool) -> None:
    failed = [(atom["name"], action, atom[key]) for atom in atoms
              for action, key in (("execute", "failure"), ("revert", "revert_failure"))
              if atom[key] is not None]
    if not failed:
        return
    click.echo("\nfailures:")
    for name, action, failure in failed:
        click.echo(f"  {name} ({action}): {failure['type'] or 'Exception'}: {failure['message']}")
        if tracebacks:
            text = failure["traceback"]
            lines = ["Traceback (most recent call last):", *text.rstrip().splitlines()] \
                if text else ["(no traceback stored)"]
            for line in lines:
                click.echo(f"    {line}")
    if not tracebacks:
        click.echo("  (--tracebacks shows where each was raised)")
