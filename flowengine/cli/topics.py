"""``flowengine topics``: what waits on each worker topic (beanstalkd's ``stats-tube``)."""

from __future__ import annotations

import json
from typing import Any

import click

from flowengine.cli import exits
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.options import json_option, show_envvars

COLUMNS = ("topic", "ready", "running", "delayed", "dead", "workers")


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


@show_envvars
@click.command("topics")
@broker_options
@click.argument("topics", nargs=-1)
@json_option("One JSON object per topic and line.")
def topics_command(topics: tuple[str, ...], as_json: bool, **options: Any) -> None:
    """Requests ready, running and delayed, dead letters and workers of each worker topic.

    Without TOPICS, every topic of the exchange, on brokers that can list their queues
    (beanstalkd); elsewhere name them. A count the broker cannot tell is shown as ``-``
    (JSON null). Exit code 1: the broker cannot be reached; 2: it cannot list its queues.
    """
    from flowengine.worker_based.topics import TopicsNotListed, topic_stats

    broker = broker_kwargs(**options)
    try:
        rows = [row.to_dict() for row in topic_stats(topics=topics, **broker)]
    except TopicsNotListed as err:
        click.echo(f"error: {err}", err=True)
        raise SystemExit(exits.USAGE) from err
    except Exception as err:
        where = broker["url"] or broker["transport"] or "the embedded flowengine-fs transport"
        exits.unreachable("list the topics of", f"{where} exchange {broker['exchange']!r}", err)
    if as_json:
        for row in rows:
            click.echo(json.dumps(row, sort_keys=True))
        return
    if not rows:
        click.echo(f"no topics on exchange {broker['exchange']!r}")
        return
    table = [[column.upper() for column in COLUMNS]]
    table += [[_cell(row[column]) for column in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    for line in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
