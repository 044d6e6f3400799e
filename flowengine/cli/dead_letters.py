"""``flowengine dead-letters``: list parked requests and put them back (bury and kick)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import click

from flowengine.cli import exits
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.options import json_option, show_envvars


@contextlib.contextmanager
def _reaching(broker: dict[str, Any]) -> Iterator[None]:
    """A broker error inside exits 1 with a masked ``error:`` line, as ``events`` does."""
    try:
        yield
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
    """Show the parked requests, oldest first (exit code 1: the broker cannot be reached)."""
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


@show_envvars
@dead_letters_group.command("requeue")
@broker_options
@click.argument("letter_id")
def requeue_command(letter_id: str, **options: Any) -> None:
    """Send the parked request LETTER_ID back to its worker topic.

    Exit code 2 when no parked request has that id, 1 when the broker cannot be reached.
    """
    from flowengine.exceptions import NotFound
    from flowengine.worker_based.dead_letters import DeadLetters

    broker = broker_kwargs(**options)
    with _reaching(broker):
        letters = DeadLetters(**broker)
        try:
            letter = letters.requeue(letter_id)
        except NotFound as err:  # SystemExit passes through _reaching
            click.echo(f"error: {err}", err=True)
            raise SystemExit(exits.USAGE) from err
        finally:
            letters.close()
    click.echo(f"requeued {letter.id} ({letter.task_name}) to topic {letter.topic}")
