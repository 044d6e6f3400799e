"""``flowengine jobs list|post|show|trash|repost`` and ``flowengine conductors``.

Job details are always shown with their secrets masked.
"""

from __future__ import annotations

import os
import re
from typing import Any

import click

from flowengine.cli import records
from flowengine.cli.board_options import board_options, open_board
from flowengine.cli.flow_options import backend_option
from flowengine.cli.formatting import table, to_json, truncate
from flowengine.cli.loading import factory_options, import_target, parse_args, store_option
from flowengine.cli.options import json_option, parse_pairs, show_envvars, split_from_env

#: The owner the commands claim a job as before trashing it.
OPERATOR = "flowengine-cli"


def _job_record(job: Any) -> dict[str, Any]:
    from flowengine import exceptions as exc
    from flowengine.jobs.masking import masked

    try:
        owner = job.board.find_owner(job)
    except exc.NotFound:
        owner = None
    return {"uuid": job.uuid, "name": job.name, "state": job.state,
            "priority": job.priority.value, "owner": owner, "attempts": job.attempts,
            "created_on": job.created_on.isoformat() if job.created_on else None,
            "book": {"uuid": job.book_uuid, "name": job.book_name},
            "details": masked(job.details)}


def _find(board: Any, prefix: str) -> Any:
    matches = [job for job in board.iterjobs(ensure_fresh=True) if job.uuid.startswith(prefix)]
    if len(matches) != 1:
        what = "no job" if not matches else f"{len(matches)} jobs"
        raise click.ClickException(f"{what} on the board with a uuid starting {prefix!r}")
    return matches[0]


#: A W3C ``traceparent``: version, trace id, parent span id, flags (lowercase hex).
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def _traceparent(given: str | None) -> str | None:
    """``--traceparent``, else ``$TRACEPARENT`` (the name CI systems and otel-cli use), checked."""
    value = (given or os.environ.get("TRACEPARENT") or "").strip()
    if value and not _TRACEPARENT.fullmatch(value):
        raise click.BadParameter(f"{value[:80]!r} is not a W3C traceparent (00-<32 hex trace"
                                 " id>-<16 hex span id>-<2 hex flags>)",
                                 param_hint="--traceparent or $TRACEPARENT")
    return value or None


@click.group("jobs")
def jobs_group() -> None:
    """List, post, inspect, trash and re-post jobs on a jobboard."""


@show_envvars
@jobs_group.command("list")
@board_options
@click.option("--trash", "trashed", is_flag=True, envvar="FLOWENGINE_TRASH",
              help="List the trashed jobs instead.")
@json_option()
def list_command(board_uri: str, board_options: tuple[str, ...], trashed: bool,
                 as_json: bool) -> None:
    """List the jobs on the board (most urgent first), or its trash."""
    from flowengine.jobs.masking import masked

    headers: tuple[str, ...]
    keys: tuple[str, ...]
    with open_board(board_uri, board_options) as board:
        if trashed:
            rows = [{"uuid": t.uuid, "name": t.name, "reason": t.reason,
                     "attempts": t.attempts, "trashed_on": t.trashed_on.isoformat(),
                     "details": masked(t.posting.get("details") or {})}
                    for t in board.iter_trash()]
            headers, keys = ("UUID", "NAME", "ATTEMPTS", "TRASHED", "REASON"), (
                "uuid", "name", "attempts", "trashed_on", "reason")
        else:
            rows = [_job_record(job) for job in board.iterjobs(ensure_fresh=True)]
            headers, keys = ("UUID", "NAME", "STATE", "PRIORITY", "OWNER", "ATTEMPTS"), (
                "uuid", "name", "state", "priority", "owner", "attempts")
    if as_json:
        click.echo(to_json(rows, indent=2))
        return
    for line in table(headers, [[truncate(str(r[k] if r[k] is not None else "-"))
                                 for k in keys] for r in rows]):
        click.echo(line)


@show_envvars
@jobs_group.command("show")
@board_options
@click.argument("job_id")
def show_command(board_uri: str, board_options: tuple[str, ...], job_id: str) -> None:
    """Show one job (JOB_ID: its uuid or the start of it) as JSON."""
    with open_board(board_uri, board_options) as board:
        click.echo(to_json(_job_record(_find(board, job_id)), indent=2))


@show_envvars
@jobs_group.command("post")
@board_options
@backend_option(required=True)
@click.argument("spec", metavar="MODULE:FACTORY")
@store_option
@factory_options
@click.option("--name", envvar="FLOWENGINE_NAME", default=None, help="The job's name.")
@click.option("--priority", envvar="FLOWENGINE_PRIORITY", default="NORMAL", show_default=True,
              type=click.Choice(["VERY_HIGH", "HIGH", "NORMAL", "LOW", "VERY_LOW"],
                                case_sensitive=False))
@click.option("--traceparent", envvar="FLOWENGINE_TRACEPARENT", default=None,
              help="A W3C traceparent (00-<trace id>-<span id>-<flags>) the conductor's span of "
                   "the job continues, e.g. a CI pipeline's; default: $TRACEPARENT, else the "
                   "current span when tracing is on.")
@click.option("--lock", "locks", envvar="FLOWENGINE_LOCK", multiple=True,
              callback=split_from_env,
              help="A lock the job holds while it runs (a resource name, e.g. lb:1234), on the "
                   "board's own service; jobs with the same lock never run at once. "
                   "Repeatable.")
@click.option("--on-conflict", envvar="FLOWENGINE_ON_CONFLICT", default="wait",
              show_default=True, type=click.Choice(["wait", "reject"], case_sensitive=False),
              help="When a lock is held: wait for it in line, or reject the job (refused now if "
                   "held now; trashed, with why, if held when a conductor takes it).")
def post_command(board_uri: str, board_options: tuple[str, ...], backend_uri: str, spec: str,
                 store: tuple[str, ...], factory_args: tuple[str, ...],
                 factory_kwargs: tuple[str, ...], name: str | None, priority: str,
                 traceparent: str | None, locks: tuple[str, ...], on_conflict: str) -> None:
    """Post the flow the factory MODULE:FACTORY builds as a job; print its uuid.

    Conductors import the factory by name, so its module must be importable where they run.
    """
    from flowengine import tracing
    from flowengine.jobs.posting import post_flow

    traceparent = _traceparent(traceparent)
    import_target(spec)  # fails here, naming the spec, rather than in a conductor
    details: dict[str, Any] = {}
    if traceparent:
        details[tracing.TRACE_KEY] = {tracing.TRACEPARENT: traceparent}
    if locks:
        details.update(_lock_details(board_uri, board_options, locks, on_conflict.lower()))
    persistence = records.open_backend(backend_uri, create=True)
    try:
        with open_board(board_uri, board_options, persistence=persistence) as board:
            try:
                job = post_flow(board, persistence, spec.replace(":", "."),
                                factory_args=parse_args(factory_args),
                                factory_kwargs=parse_pairs(factory_kwargs, "factory keyword"),
                                store=parse_pairs(store, "store value"), name=name,
                                priority=priority, details=details or None)
            except (ValueError, ImportError) as err:
                raise click.ClickException(f"cannot post {spec}: {err}") from err
    finally:
        persistence.close()
    click.echo(job.uuid)


def _lock_details(board_uri: str, board_options: tuple[str, ...], locks: tuple[str, ...],
                  on_conflict: str) -> dict[str, Any]:
    """The job details of ``--lock`` and ``--on-conflict``; with ``reject``, refused now if a
    lock is held now (a conductor still rejects the job if one is held when it takes it)."""
    from flowengine import coordination
    from flowengine import exceptions as exc
    from flowengine.cli.board_options import board_conf

    details = {coordination.JOB_LOCKS: list(dict.fromkeys(locks)),
               coordination.JOB_ON_CONFLICT: on_conflict}
    try:
        coordination.job_locks(details)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--lock") from err
    if on_conflict != "reject":
        return details
    try:
        with coordination.connect(board_conf(board_uri, board_options)) as coordinator:
            held = [e for e in coordinator.listing() if e.key in locks and e.holding]
    except exc.TaskFlowException as err:
        raise click.ClickException(f"cannot check the locks: {err}") from err
    if held:
        who = "; ".join(f"{e.key} by {coordination.describe_holder(e.info)}" for e in held)
        raise click.ClickException(f"not posted (--on-conflict reject): held now: {who}")
    return details


@show_envvars
@jobs_group.command("trash")
@board_options
@click.argument("job_id")
@click.option("--reason", envvar="FLOWENGINE_REASON", default="trashed by an operator",
              show_default=True, help="Why, kept with the trashed job.")
def trash_command(board_uri: str, board_options: tuple[str, ...], job_id: str,
                  reason: str) -> None:
    """Move an unclaimed job to the trash (JOB_ID: its uuid or the start of it)."""
    from flowengine import exceptions as exc

    with open_board(board_uri, board_options) as board:
        job = _find(board, job_id)
        try:
            board.claim(job, OPERATOR)
            board.trash(job, OPERATOR, reason=reason)
        except exc.TaskFlowException as err:
            raise click.ClickException(f"cannot trash job {job.uuid}: {err}") from err
        click.echo(f"trashed {job.uuid}")


@show_envvars
@jobs_group.command("repost")
@board_options
@click.argument("job_id")
def repost_command(board_uri: str, board_options: tuple[str, ...], job_id: str) -> None:
    """Put a trashed job back on the board, with its attempts reset."""
    from flowengine import exceptions as exc

    with open_board(board_uri, board_options) as board:
        matches = [t.uuid for t in board.iter_trash() if t.uuid.startswith(job_id)]
        if len(matches) != 1:
            raise click.ClickException(f"{len(matches) or 'no'} trashed jobs with a uuid"
                                       f" starting {job_id!r}")
        try:
            job = board.repost(matches[0])
        except exc.NotFound as err:
            raise click.ClickException(str(err)) from err
        click.echo(f"reposted {job.uuid}")


@show_envvars
@click.command("conductors")
@board_options
@json_option()
def conductors_command(board_uri: str, board_options: tuple[str, ...], as_json: bool) -> None:
    """List the conductors alive on the board."""
    with open_board(board_uri, board_options) as board:
        found = [e.to_dict() for e in board.iter_entities("conductor")]
    if as_json:
        click.echo(to_json(found, indent=2))
        return
    rows = [[e["name"], str(e["metadata"].get("hostname", "-")),
             str(e["metadata"].get("pid", "-")), str(e["metadata"].get("engine", "-"))]
            for e in found]
    for line in table(("NAME", "HOST", "PID", "ENGINE"), rows):
        click.echo(line)
