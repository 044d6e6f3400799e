"""``flowengine dead-letters``: list parked requests and put them back (bury and kick)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import click
from click.core import ParameterSource

from flowengine.cli import exits, loading, records
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.flow_options import backend_option
from flowengine.cli.options import json_option, show_envvars


@contextlib.contextmanager
def _reaching(broker: dict[str, Any]) -> Iterator[None]:
    """A broker error inside exits 1 with a masked ``error:`` line, as ``events`` does."""
    try:
        yield
    except click.ClickException:  # a bad option (--backend): click says so itself
        raise
    except Exception as err:
        where = broker["url"] or broker["transport"] or "the embedded flowengine-fs transport"
        exits.unreachable("reach the dead letters of", f"{where} exchange "
                          f"{broker['exchange']!r}", err)


@click.group("dead-letters")
def dead_letters_group() -> None:
    """Requests parked after their last attempt was lost."""


@show_envvars
@dead_letters_group.command("list")
@broker_options
@json_option("One JSON object per line.")
def list_command(as_json: bool, **options: Any) -> None:
    """Show the parked requests, oldest first, and when each expires (expired ones are
    removed). Exit code 1: the broker cannot be reached."""
    from flowengine.worker_based.dead_letters import DeadLetters

    broker = broker_kwargs(**options)
    with _reaching(broker):
        letters = DeadLetters(**broker)
        try:
            parked = letters.list()
        finally:
            letters.close()
    if as_json:
        for letter in parked:
            click.echo(json.dumps(letter.to_dict(), sort_keys=True))
        return
    if not parked:
        click.echo("no dead letters")
        return
    for letter in parked:
        workers = ", ".join(letter.workers) or "-"
        click.echo(f"{letter.id}  {letter.task_name} ({letter.action}) topic={letter.topic}")
        click.echo(f"    reason: {letter.reason}")
        click.echo(f"    workers: {workers}")
        shown = letter.to_dict()
        click.echo(f"    flow: {letter.flow_uuid or '-'}  parked: "
                   f"{shown.get('parked_at_iso', '-')}  "
                   f"expires: {shown.get('expires_at_iso', '-')}")
        if letter.removed_arguments:
            click.echo(f"    secret arguments removed: {', '.join(letter.removed_arguments)} "
                       f"(requeue with --resume)")


@show_envvars
@dead_letters_group.command("requeue")
@broker_options
@backend_option(required=False)
@click.option("--force", is_flag=True, envvar="FLOWENGINE_FORCE",
              help="Re-send the request even though its flow has finished: the task runs "
                   "again and nothing records its outcome.")
@click.option("--resume", is_flag=True, envvar="FLOWENGINE_RESUME",
              help="Resume the request's flow from --backend instead (as `flowengine run "
                   "--resume` does): the task runs again inside the flow.")
@loading.store_option
@loading.secret_option
@click.argument("letter_id")
@click.pass_context
def requeue_command(ctx: click.Context, letter_id: str, backend_uri: str | None, force: bool,
                    resume: bool, store: tuple[str, ...], secret: tuple[str, ...],
                    **options: Any) -> None:
    """Send the parked request LETTER_ID back to its worker topic, or (--resume) resume its flow.

    Says first what will happen, from the flow's state in --backend. Refused when the flow has
    finished or its state cannot be read (no --backend, or the flow is not in it) unless
    --force, and when the request's secret arguments were removed at parking (resume its flow
    instead, giving them with --store or --secret).

    \b
    Exit codes: 0 requeued (with --resume: `run`'s codes), 1 refused or the broker cannot be
    reached, 2 no parked request has that id.
    """
    from flowengine.exceptions import NotFound
    from flowengine.worker_based import requeue_rules as rules
    from flowengine.worker_based.dead_letter_keeping import RequeueRefused
    from flowengine.worker_based.dead_letters import DeadLetters

    if force and resume:
        raise click.UsageError("--force re-sends the raw request; --resume resumes its flow: "
                               "give one")
    broker = broker_kwargs(**options)
    with _reaching(broker):
        letters = DeadLetters(**broker)
        try:
            letter = _found(letters, letter_id)
            flow = _flow_state(backend_uri, letter)
            verdict = unknown_refused(rules.judge(letter, flow, force=force, resume=resume),
                                      flow, force, "give --backend URL (where the flow is "
                                      "stored), or --force to re-send it anyway")
            click.echo(verdict.message, err=not verdict.allowed)
            if not verdict.allowed:
                raise SystemExit(exits.ERROR)
            if not verdict.resume:
                try:
                    letters.requeue(letter_id)
                except NotFound as err:  # taken meanwhile, or just expired
                    click.echo(f"error: {err}", err=True)
                    raise SystemExit(exits.USAGE) from err
                except RequeueRefused as err:
                    click.echo(f"error: {err}", err=True)
                    raise SystemExit(exits.ERROR) from err
                click.echo(f"requeued {letter.id} ({letter.task_name}) to topic {letter.topic}")
                return
        finally:
            letters.close()
    code = _resume(ctx, letter.flow_uuid, backend_uri, store, secret)
    if code in exits.BY_FLOW_STATE.values():  # the flow ran: the letter is done with
        with _reaching(broker):
            letters = DeadLetters(**broker)
            try:
                letters.discard(letter_id)
            finally:
                letters.close()
    ctx.exit(code)


def unknown_refused(verdict: Any, flow: Any, force: bool, remedy: str) -> Any:
    """``verdict``, or a refusal when it would re-send a request whose flow's state is unknown
    without ``force``: the flow may have finished (reverted, say), and the task would run again
    with nothing to record its outcome. ``remedy`` says what to do instead."""
    from flowengine.worker_based.requeue_rules import Verdict

    if not verdict.allowed or verdict.resume or flow.state is not None or force:
        return verdict
    return Verdict(False, False, f"Refused: {flow.described}, so it may have finished (a "
                                 f"reverted flow's task would run again): {remedy}.")


def _found(letters: Any, letter_id: str) -> Any:
    from flowengine.exceptions import NotFound

    try:
        return letters.get(letter_id)
    except NotFound as err:
        click.echo(f"error: {err}", err=True)
        raise SystemExit(exits.USAGE) from err


def _flow_state(backend_uri: str | None, letter: Any) -> Any:
    from flowengine.worker_based import requeue_rules as rules

    if backend_uri is None:
        return rules.flow_state(None, letter)
    backend = records.open_backend(backend_uri, create=False)
    try:
        return rules.flow_state(backend, letter)
    finally:
        backend.close()


def _resume(ctx: click.Context, flow_uuid: str | None, backend_uri: str | None,
            store: tuple[str, ...], secret: tuple[str, ...]) -> int:
    """Run ``flowengine run --resume`` on the letter's flow; its exit code."""
    from flowengine.cli.run import run_command

    assert flow_uuid is not None and backend_uri is not None  # judge allowed the resume
    args = ["--resume", flow_uuid, "--backend", backend_uri]
    args += [f"--store={value}" for value in store] + [f"--secret={value}" for value in secret]
    # The broker options given here were given for the resume too (a URL password, say).
    for name, flag in (("url", "--url"), ("exchange", "--exchange"),
                       ("transport", "--transport")):
        if ctx.get_parameter_source(name) in _GIVEN:
            args += [flag, str(ctx.params[name])]
    for value in ctx.params["transport_options"] if ctx.get_parameter_source(
            "transport_options") in _GIVEN else ():
        args.append(f"--transport-option={value}")
    code = run_command.main(args=args, prog_name="flowengine run", standalone_mode=False)
    return int(code or 0)


_GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
