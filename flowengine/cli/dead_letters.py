"""``flowengine dead-letters``: list parked requests and put them back (bury and kick)."""

from __future__ import annotations

import json
from typing import Any

import click

from flowengine.cli.broker import broker_kwargs, broker_options

#: Exit code when the named dead letter does not exist (as for other commands' unknown ids).
EXIT_NOT_FOUND = 2


def _open(**options: Any) -> Any:
    from flowengine.worker_based.dead_letters import DeadLetters

    return DeadLetters(**broker_kwargs(**options))


@click.group("dead-letters")
def dead_letters_group() -> None:
    """Requests parked after their last attempt was lost."""


@dead_letters_group.command("list")
@broker_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def list_command(as_json: bool, **options: Any) -> None:
    """Show the parked requests, oldest first."""
    letters = _open(**options)
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


@dead_letters_group.command("requeue")
@broker_options
@click.argument("letter_id")
def requeue_command(letter_id: str, **options: Any) -> None:
    """Send the parked request LETTER_ID back to its worker topic."""
    from flowengine.exceptions import NotFound

    letters = _open(**options)
    try:
        letter = letters.requeue(letter_id)
    except NotFound as err:
        click.echo(f"error: {err}", err=True)
        raise SystemExit(EXIT_NOT_FOUND) from err
    finally:
        letters.close()
    click.echo(f"requeued {letter.id} ({letter.task_name}) to topic {letter.topic}")
