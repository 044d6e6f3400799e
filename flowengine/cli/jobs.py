"""``flowengine jobs list|post|show|cancel|trash|repost|repost-orphans``, ``flowengine conductors``.

Job details are always shown with their secrets masked.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

import click

from flowengine.cli import records
from flowengine.cli.board_options import board_options, open_board
from flowengine.cli.broker import broker_kwargs
from flowengine.cli.flow_options import backend_option, engine_options
from flowengine.cli.formatting import table, to_json, truncate
from flowengine.cli.loading import (
    build_flow,
    factory_options,
    import_target,
    parse_args,
    store_option,
)
from flowengine.cli.options import (
    json_option,
    operator,
    parse_pairs,
    show_envvars,
    split_from_env,
)

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


#: Ended jobs ``jobs list --backend`` shows, most recent first.
ENDED_SHOWN = 20
_SECTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "jobs": (("UUID", "NAME", "STATE", "PRIORITY", "OWNER", "ATTEMPTS"),
             ("uuid", "name", "state", "priority", "owner", "attempts")),
    "trash": (("UUID", "NAME", "ATTEMPTS", "TRASHED", "REASON"),
              ("uuid", "name", "attempts", "trashed_on", "reason")),
    "damaged": (("KEY", "STATE", "REASON"), ("uuid", "state", "reason")),
    "ended": (("UUID", "NAME", "ENDED", "AT", "REASON"),
              ("uuid", "name", "ended", "ended_at", "reason")),
}
_TITLES = {"damaged": "damaged postings (skipped by every board; moved to the trash unless "
                      "claimed):",
           "ended": f"ended jobs (the {ENDED_SHOWN} most recent, from --backend):"}


@show_envvars
@jobs_group.command("list")
@board_options
@backend_option(required=False)
@click.option("--trash", "trashed", is_flag=True, envvar="FLOWENGINE_TRASH",
              help="List the trashed jobs instead.")
@json_option()
def list_command(board_uri: str, board_options: tuple[str, ...], backend_uri: str | None,
                 trashed: bool, as_json: bool) -> None:
    """List the jobs on the board (most urgent first), or its trash.

    A damaged posting (a value on the board that is not a job) is listed with what is wrong
    with it. With --backend, also how the most recent jobs ended (SUCCESS, REVERTED, FAILED or
    TRASHED, with the reason), as their conductors recorded it in their logbooks.
    """
    from flowengine.jobs.masking import masked

    sections: dict[str, list[dict[str, Any]]] = {}
    persistence = records.open_backend(backend_uri, create=False) if backend_uri else None
    try:
        with open_board(board_uri, board_options, persistence=persistence) as board:
            if trashed:
                sections["trash"] = [
                    {"uuid": t.uuid, "name": t.name, "reason": t.reason,
                     "attempts": t.attempts, "trashed_on": t.trashed_on.isoformat(),
                     "details": masked(t.posting.get("details") or {})}
                    for t in board.iter_trash()]
            else:
                sections["jobs"] = [_job_record(job)
                                    for job in board.iterjobs(ensure_fresh=True)]
                sections["damaged"] = [
                    {"uuid": d.key, "name": None, "state": "DAMAGED (trashed)" if d.trashed
                     else "DAMAGED", "reason": d.reason, "trashed": d.trashed}
                    for d in board.iter_damaged()]
                if persistence is not None:
                    sections["ended"] = [_ended_record(e) for e in _endings(persistence, board)]
    finally:
        if persistence is not None:
            persistence.close()
    if as_json:
        for rows in sections.values():
            for row in rows:
                click.echo(to_json(row, sort_keys=True))
        return
    for number, (section, rows) in enumerate(sections.items()):
        if number and not rows:
            continue
        if number:
            click.echo("")
            click.echo(_TITLES[section])
        headers, keys = _SECTIONS[section]
        for line in table(headers, [[truncate(str(r[k] if r[k] is not None else "-"))
                                     for k in keys] for r in rows]):
            click.echo(line)


def _endings(persistence: Any, board: Any) -> list[Any]:
    from flowengine.jobs import endings

    return endings.find_endings(persistence, board, limit=ENDED_SHOWN)


def _ended_record(ending: Any) -> dict[str, Any]:
    found = ending.to_dict()
    return {"uuid": found["uuid"], "name": found["name"], "state": "COMPLETE",
            "ended": found["outcome"], "reason": found["reason"] or None,
            "ended_at": found["ended_at"], "conductor": found["conductor"],
            "book": found["book"], "flow_state": found["flow_state"]}


@show_envvars
@jobs_group.command("show")
@board_options
@click.argument("job_id")
def show_command(board_uri: str, board_options: tuple[str, ...], job_id: str) -> None:
    """Show one job (JOB_ID: its uuid or the start of it) as JSON (one line)."""
    with open_board(board_uri, board_options) as board:
        click.echo(to_json(_job_record(_find(board, job_id)), sort_keys=True))


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
@click.option("--deadline", type=click.FloatRange(min=0, min_open=True), default=None,
              envvar="FLOWENGINE_DEADLINE", metavar="SECONDS",
              help="The flow must be done SECONDS from now, queued or running: the conductor "
                   "running it then cancels it (undoing what it did).")
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
                 traceparent: str | None, deadline: float | None, locks: tuple[str, ...],
                 on_conflict: str) -> None:
    """Post the flow the factory MODULE:FACTORY builds as a job; print its uuid.

    Conductors import the factory by name, so its module must be importable where they run.
    """
    from flowengine import tracing
    from flowengine.jobs.posting import post_flow

    traceparent = _traceparent(traceparent)
    args, kwargs = parse_args(factory_args), parse_pairs(factory_kwargs, "factory keyword")
    given = parse_pairs(store, "store value")
    # Fails here, naming the spec and what is missing, rather than in a conductor.
    _check_runnable(spec, import_target(spec), args, kwargs, given)
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
                                factory_args=args, factory_kwargs=kwargs, store=given, name=name,
                                priority=priority, details=details or None, deadline=deadline)
            except (ValueError, ImportError) as err:
                raise click.ClickException(f"cannot post {spec}: {err}") from err
    finally:
        persistence.close()
    click.echo(job.uuid)


def _check_runnable(spec: str, target: Any, args: list[Any], kwargs: dict[str, Any],
                    store: dict[str, Any]) -> None:
    """Refuse (one line) a job whose flow cannot run: one that does not build, or that needs
    inputs neither it nor ``store`` provides, as ``flowengine check`` says."""
    from flowengine import engines
    from flowengine import exceptions as exc

    flow = build_flow(spec, target, args, kwargs)
    engine = engines.load(flow, store=store)
    try:
        engine.compile()
        engine.validate()
    except exc.MissingDependencies as err:
        wanted = sorted(err.missing_requirements)
        raise click.ClickException(
            f"cannot post {spec}: flow {flow.name!r} needs input(s) nothing provides: "
            f"{', '.join(wanted)} (give them with "
            f"{' '.join(f'--store {name}=VALUE' for name in wanted)})") from err
    except (exc.TaskFlowException, TypeError, ValueError, NotImplementedError) as err:
        raise click.ClickException(f"cannot post {spec}: flow {flow.name!r} cannot run: "
                                   f"{type(err).__name__}: {str(err).splitlines()[0]}") from err


@show_envvars
@jobs_group.command("cancel")
@board_options
@backend_option(required=True)
@click.argument("job_id")
@click.option("--reason", required=True, envvar="FLOWENGINE_REASON", metavar="TEXT",
              help="Why (stored with the job's flow; shown by show, the dashboard and events).")
@engine_options
@click.option("--wait", "wait_seconds", type=click.FloatRange(min=0), default=None,
              envvar="FLOWENGINE_WAIT", metavar="SECONDS",
              help="Wait up to SECONDS for a running job's flow to end (exit 7 once cancelled).")
@click.pass_context
def cancel_command(ctx: click.Context, board_uri: str, board_options: tuple[str, ...],
                   backend_uri: str, job_id: str, reason: str, engine_name: str,
                   topics: tuple[str, ...], wait_seconds: float | None, **broker: Any) -> None:
    """Cancel a job's flow (JOB_ID: its uuid or the start of it) and undo what it did.

    \b
    A job a conductor runs: its flow is asked to cancel (see flowengine cancel), and the
    conductor consumes the job once the flow is reverted. A job no conductor holds: it is
    claimed here, its flow's reverts run here (on its stored engine, or --engine) and the
    job is consumed. Exit codes as flowengine cancel's.
    """
    from flowengine import exceptions as exc
    from flowengine import states
    from flowengine.cli import exits, run
    from flowengine.cli.suspend import wait_for_end
    from flowengine.engines import suspend_requests as sr

    by = operator("flowengine jobs cancel")
    persistence = records.open_backend(backend_uri, create=False)
    try:
        with open_board(board_uri, board_options, persistence=persistence) as board:
            job = _find(board, job_id)
            flow_uuid = _flow_of(job, persistence)
            try:
                asked = sr.request_cancel(persistence, flow_uuid, reason, by=by)
            except sr.NotRunning as err:
                if err.state in (states.SUCCESS, states.REVERTED):
                    raise click.ClickException(f"job {job.uuid}'s flow is {err.state}: it "
                                               f"ended, there is nothing to cancel") from err
                owner = board.find_owner(job)
                if owner:
                    raise click.ClickException(
                        f"job {job.uuid} is claimed by {owner}, whose engine is not running "
                        f"its flow ({err}): cancel again once it runs, or once the claim "
                        f"lapses") from err
                try:
                    board.claim(job, OPERATOR)
                except exc.TaskFlowException as claim_err:
                    raise click.ClickException(f"cannot claim job {job.uuid} to cancel it: "
                                               f"{claim_err}") from claim_err
                click.echo(f"job {job.uuid} runs nowhere: cancelling its flow here")
                code = run.run_stored(ctx, flow_uuid, persistence, backend_uri, engine_name,
                                      topics, broker_kwargs(**broker), cancel=(reason, by))
                if code == exits.CANCELLED:
                    board.consume(job, OPERATOR)
                    click.echo(f"consumed job {job.uuid}")
                else:
                    board.abandon(job, OPERATOR, counted=False)
                ctx.exit(code)
            click.echo(asked.text)
            if wait_seconds is None:
                return
            state = wait_for_end(persistence, flow_uuid, wait_seconds)
    finally:
        persistence.close()
    if state == states.REVERTED:
        click.echo(f"job {job.uuid}'s flow is cancelled: REVERTED")
        ctx.exit(exits.CANCELLED)
    if state is None:
        click.echo(f"job {job.uuid}'s flow ended, and its records were removed with the "
                   f"consumed job (a conductor started with --keep-logbooks keeps them)")
        return
    click.echo(f"error: job {job.uuid}'s flow is {state}", err=True)
    ctx.exit(exits.FAILED if state == states.FAILURE else exits.ERROR)


def _flow_of(job: Any, persistence: Any) -> str:
    """The uuid of the flow a job runs (``details["flow_uuid"]``, or its book's only one)."""
    flow_uuid = (job.details or {}).get("flow_uuid")
    if isinstance(flow_uuid, str):
        return flow_uuid
    with contextlib.closing(persistence.get_connection()) as conn:
        book = conn.get_logbook(job.book_uuid)
    flows = [fd.uuid for fd in book]
    if len(flows) != 1:
        raise click.ClickException(f"job {job.uuid} names no flow and its book has "
                                   f"{len(flows)}")
    return flows[0]


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
            # The claim is only the way to the trash: not an attempt at running the job.
            board.trash(job, OPERATOR, reason=reason, counted=False)
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
@jobs_group.command("repost-orphans")
@board_options
@backend_option(required=True)
@click.argument("flow_ids", nargs=-1, metavar="[FLOW_ID]...")
@click.option("--wait", "wait", type=click.FloatRange(min=0), envvar="FLOWENGINE_WAIT",
              default=None, help="Seconds a flow must stay orphaned before it is re-posted "
                                 "(default: the board's claim_ttl, the longest a conductor "
                                 "running it can take to show it).")
@click.pass_context
def repost_orphans_command(ctx: click.Context, board_uri: str, board_options: tuple[str, ...],
                           backend_uri: str, flow_ids: tuple[str, ...],
                           wait: float | None) -> None:
    """Post again the jobs of the flows orphaned on the board (all, or those FLOW_ID starts):
    conductors then resume each flow from its stored state.

    An orphaned flow is stored unfinished, was posted to this board, and neither the board,
    its trash nor a live conductor has its job any more (`flowengine check --orphans` lists
    them). Its job is posted with the details and priority it was first posted with. Exit
    code 2: a FLOW_ID names no orphaned flow.
    """
    from flowengine.cli import orphans

    ctx.exit(orphans.repost(board_uri, board_options, backend_uri, flow_ids, wait))


@show_envvars
@click.command("conductors")
@board_options
@json_option()
def conductors_command(board_uri: str, board_options: tuple[str, ...], as_json: bool) -> None:
    """List the conductors alive on the board."""
    with open_board(board_uri, board_options) as board:
        found = [e.to_dict() for e in board.iter_entities("conductor")]
    if as_json:
        for entity in found:
            click.echo(to_json(entity, sort_keys=True))
        return
    rows = [[e["name"], str(e["metadata"].get("hostname", "-")),
             str(e["metadata"].get("pid", "-")), str(e["metadata"].get("engine", "-"))]
            for e in found]
    for line in table(("NAME", "HOST", "PID", "ENGINE"), rows):
        click.echo(line)
