"""``flowengine db``: a store's layout (``status``, ``upgrade``) and copying a TaskFlow store
into one (``import-taskflow``).

Exit codes: 0 done (``status``: the store is current); 1 the store cannot be used as it is
(``status``: an upgrade is due), cannot be reached, is foreign or newer than this flowengine, or
(``import-taskflow``) some TaskFlow records could not be read and were not copied; 2 usage
errors (a bad URL, a store that does not exist where one must).
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from flowengine.cli import exits
from flowengine.cli import formatting as fmt
from flowengine.cli.options import json_option, show_envvars

if TYPE_CHECKING:  # persistence pulls in SQLAlchemy: imported when a command runs
    from flowengine.persistence import base
    from flowengine.persistence.taskflow_import import ImportReport


def _backend_option(help_text: str) -> Any:
    return click.option("--backend", "backend_uri", envvar="FLOWENGINE_BACKEND", required=True,
                        help=help_text)


def _open(uri: str, must_exist: bool) -> base.Backend:
    """The backend ``uri`` names (nothing opened yet); a bad URL is a usage error (exit 2)."""
    from flowengine import exceptions as exc
    from flowengine.cli import records
    from flowengine.persistence import backends

    if must_exist:
        return records.open_backend(uri, create=False)
    try:
        return backends.fetch(uri)
    except (exc.NotFound, ValueError, TypeError) as err:
        raise click.BadParameter(str(err), param_hint="--backend") from err


@contextlib.contextmanager
def _failing_in_one_line() -> Iterator[None]:
    """A storage error (unreachable, foreign, newer, a failed step) exits 1 with one line."""
    from flowengine import exceptions as exc
    from flowengine.persistence.backends._uri import mask_urls
    from flowengine.persistence.taskflow_store import TaskFlowStoreError

    try:
        yield
    except (exc.StorageFailure, TaskFlowStoreError) as err:
        click.echo(f"error: {mask_urls(' '.join(str(err).split()))}", err=True)
        raise SystemExit(exits.ERROR) from err


@click.group("db")
def db_group() -> None:
    """A persistence store's layout, and moving a TaskFlow store to flowengine."""


@show_envvars
@db_group.command("status")
@_backend_option("The store: sqlite:///flows.db, postgresql://..., dir:///path.")
@json_option()
def status_command(backend_uri: str, as_json: bool) -> None:
    """Say whether the store's layout (its SQL schema version) is the one this flowengine
    uses, and what ``flowengine db upgrade`` would do. Changes nothing.

    Exit code 0 when the store is current, 1 when it needs an upgrade or cannot be used.
    """
    from flowengine.persistence import layout
    from flowengine.persistence._hints import upgrade_hint
    from flowengine.persistence.backends._uri import mask_urls

    backend = _open(backend_uri, must_exist=True)
    try:
        with _failing_in_one_line():
            found = layout.status(backend)
    finally:
        backend.close()
    if as_json:
        click.echo(fmt.to_json({"backend": found.backend, "version": found.version,
                                "latest": found.latest, "current": found.current,
                                "pending": list(found.pending)}, sort_keys=True))
    else:
        click.echo(f"{found.backend}: {_version_text(found.version, found.latest)}"
                   f"{'current' if found.current else 'needs an upgrade'}")
        for step in found.pending:
            click.echo(f"  to apply: {step}")
        if not found.current:
            click.echo(upgrade_hint(mask_urls(backend_uri)))
    if not found.current:
        raise SystemExit(exits.ERROR)


def _version_text(version: int | None, latest: int | None) -> str:
    if version is None:
        return ""
    if version == latest:
        return f"schema version {version}, "
    return f"schema version {version} (this flowengine uses {latest}), "


@show_envvars
@db_group.command("upgrade")
@_backend_option("The store to create or upgrade: sqlite:///flows.db, postgresql://..., "
                 "dir:///path.")
@json_option()
def upgrade_command(backend_uri: str, as_json: bool) -> None:
    """Create the store, or bring its layout (SQL schema) to the one this flowengine uses,
    and say what was done. Running it again does nothing.

    Records are kept; two upgrades at once apply each step once. A store newer than this
    flowengine, or a TaskFlow store, is refused and left as it is (exit code 1).
    """
    from flowengine.persistence import layout

    backend = _open(backend_uri, must_exist=False)
    try:
        with _failing_in_one_line():
            applied = layout.upgrade(backend)
            found = layout.status(backend)
    finally:
        backend.close()
    if as_json:
        click.echo(fmt.to_json({"backend": found.backend, "applied": applied,
                                "version": found.version}, sort_keys=True))
        return
    version = "" if found.version is None else f" (schema version {found.version})"
    if not applied:
        click.echo(f"{found.backend}: already current{version}; nothing to do")
        return
    for step in applied:
        click.echo(f"{found.backend}: applied {step}")
    click.echo(f"{found.backend}: current{version}")


@show_envvars
@db_group.command("import-taskflow")
@click.option("--from", "source_uri", envvar="FLOWENGINE_FROM", required=True,
              metavar="URL", help="The TaskFlow 6.x store: what its persistence 'connection' "
                                  "was (sqlite:///..., postgresql://...) or dir:///its/path.")
@_backend_option("The flowengine store to copy into (created or upgraded first): another "
                 "database or PostgreSQL schema than TaskFlow's, or another directory.")
@json_option()
def import_taskflow_command(source_uri: str, backend_uri: str, as_json: bool) -> None:
    """Copy every logbook, flow and atom detail of a TaskFlow store into a flowengine store,
    uuids, states, results and failures included, so that flowengine engines resume the flows
    TaskFlow left in flight. The TaskFlow store is only read.

    Stop TaskFlow's engines and conductors first. Safe to run again: flows copied before are
    left alone, copied again if only TaskFlow changed them since, and kept as they are once
    flowengine has changed them. Exit code 1 when some TaskFlow records could not be read
    (the others are copied; the report names them).
    """
    from flowengine.persistence.backends._uri import mask_urls
    from flowengine.persistence.taskflow_import import import_taskflow

    if mask_urls(source_uri.rstrip("/")) == mask_urls(backend_uri.rstrip("/")):
        raise click.BadParameter(
            "the flowengine store must be another database, PostgreSQL schema or directory "
            "than the TaskFlow store (their tables have the same names)", param_hint="--backend")
    backend = _open(backend_uri, must_exist=False)
    try:
        with _failing_in_one_line():
            report = import_taskflow(source_uri, backend)
    finally:
        backend.close()
    if as_json:
        click.echo(fmt.to_json(report.to_dict(), sort_keys=True))
    else:
        _echo_report(report, backend_uri)
    if not report.complete:
        raise SystemExit(exits.ERROR)


def _echo_report(report: ImportReport, backend_uri: str) -> None:
    from flowengine.persistence import taskflow_import as ti
    from flowengine.persistence.backends._uri import mask_urls

    for step in report.layout_steps:
        click.echo(f"{report.target}: applied {step}")
    counts = ", ".join(f"{report.count(o)} {o}" for o in (ti.IMPORTED, ti.REFRESHED,
                                                           ti.UNCHANGED, ti.KEPT, ti.REFUSED)
                       if report.count(o))
    click.echo(f"{report.source} -> {report.target}: {len(report.flows)} flow(s): "
               f"{counts or 'none'}; {report.books_added} logbook(s) added")
    for flow in report.flows:
        if flow.outcome in (ti.KEPT, ti.REFUSED):
            click.echo(f"  {flow.outcome} {flow.uuid} {flow.name or '-'}: {flow.reason}")
    waiting = report.in_flight
    if waiting:
        click.echo(f"in flight ({len(waiting)}): resume each with a flowengine engine, e.g. "
                   f"flowengine run --resume FLOW --backend {shlex.quote(mask_urls(backend_uri))}")
        rows = [[flow.uuid, flow.name, flow.state or "-", flow.book] for flow in waiting]
        for line in fmt.table(["FLOW", "NAME", "STATE", "BOOK"], rows):
            click.echo(f"  {line}")
