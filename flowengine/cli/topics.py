"""``flowengine topics``: what waits on each worker topic (beanstalkd's ``stats-tube``), and
``flowengine topics pause|resume TOPIC`` (beanstalkd's ``pause-tube``, on every transport)."""

from __future__ import annotations

import json
from typing import Any

import click

from flowengine.cli import exits
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.options import json_option, show_envvars

COLUMNS = ("topic", "ready", "running", "delayed", "dead", "workers")
#: The listing's extra column with ``--listen``: workers heard from that have the topic paused.
PAUSED = "paused"
#: Seconds the listing listens for live workers where the broker cannot count them: every
#: worker sends a heartbeat within it.
LISTEN_FOR_WORKERS = 2.5


class TopicsGroup(click.Group):
    """``topics [TOPICS]...`` lists; ``topics pause|resume TOPIC`` controls.

    Arguments that do not start with a subcommand's name are the listing's, so topic names
    stay plain arguments (a topic named ``pause`` is listed as ``topics list pause``).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Route anything but a subcommand (or ``--help``) to ``list``."""
        if not args or (args[0] not in self.commands and args[0] != "--help"):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@click.group("topics", cls=TopicsGroup)
def topics_command() -> None:
    """Worker topics: list what waits on them, pause and resume their workers.

    \b
    flowengine topics [TOPICS]...          list (see ``flowengine topics list --help``)
    flowengine topics pause TOPIC [--for SECONDS]
    flowengine topics resume TOPIC
    """


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _heard(seconds: float, **broker: Any) -> list[dict[str, Any]]:
    """The live workers heard from in ``seconds``: their announcements and heartbeats (every
    2 s) on the events exchange. (A NOTIFY would find them at once, but one sent to a topic
    nobody serves stays in its queue, counted as a ready request.)"""
    from flowengine.cli.workers import WorkerTable
    from flowengine.worker_based.events import EventReceiver

    table = WorkerTable()
    events = {k: v for k, v in broker.items() if k != "taskflow_compat"}
    for event in EventReceiver(types=("worker-", "topic-"), **events).iter(timeout=seconds):
        table.on_event(event)
    return table.live()


@topics_command.command("list")
@broker_options
@click.argument("topics", nargs=-1)
@click.option("--listen", envvar="FLOWENGINE_LISTEN", type=click.FloatRange(min=0.0),
              default=None,
              help="Also listen this many seconds to the workers' heartbeats (every 2 s) and "
                   "count, per topic, the workers that have it paused (a PAUSED column). By "
                   f"default the command listens {LISTEN_FOR_WORKERS:g}s when the broker "
                   "cannot count a topic's workers.")
@json_option("One JSON object per topic and line.")
def list_command(topics: tuple[str, ...], as_json: bool, listen: float | None,
                 **options: Any) -> None:
    """Requests ready, running and delayed, dead letters and workers of each worker topic.

    Without TOPICS, every topic of the exchange, on brokers that can list their queues
    (beanstalkd, Redis, flowengine-fs); elsewhere name them. WORKERS is the broker's count of
    the topic's consumers where it keeps one (beanstalkd, AMQP), else the live workers heard
    from. A count nobody can tell is shown as ``-`` (JSON null). Exit code 1: the broker
    cannot be reached; 2: it cannot list its queues.
    """
    from flowengine.worker_based.topics import TopicsNotListed, topic_stats

    broker = broker_kwargs(**options)
    columns = COLUMNS + ((PAUSED,) if listen else ())
    try:
        rows = [row.to_dict() for row in topic_stats(topics=topics, **broker)]
        uncounted = [row["topic"] for row in rows if row["workers"] is None]
        seconds = listen if listen is not None else (LISTEN_FOR_WORKERS if uncounted else 0.0)
        live = _heard(seconds, **broker) if seconds else []
    except TopicsNotListed as err:
        click.echo(f"error: {err}", err=True)
        raise SystemExit(exits.USAGE) from err
    except Exception as err:
        where = broker["url"] or broker["transport"] or "the embedded flowengine-fs transport"
        exits.unreachable("list the topics of", f"{where} exchange {broker['exchange']!r}", err)
    for row in rows:
        serving = [w for w in live if row["topic"] in w["topics"]]
        if row["workers"] is None and seconds:
            row["workers"] = len(serving)
        if listen:
            row[PAUSED] = sum(1 for w in serving if w["paused"])
    if as_json:
        for row in rows:
            click.echo(json.dumps(row, sort_keys=True))
        return
    if not rows:
        click.echo(f"no topics on exchange {broker['exchange']!r}")
        return
    table = [[column.upper() for column in columns]]
    table += [[_cell(row[column]) for column in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


def _send_pause(topic: str, paused: bool, seconds: float | None, **options: Any) -> None:
    from flowengine.worker_based.pause import send_pause

    broker = broker_kwargs(**options)
    if broker.pop("taskflow_compat"):
        click.echo("error: TaskFlow workers have no control queue to pause them through",
                   err=True)
        raise SystemExit(exits.USAGE)
    try:
        send_pause(topic, paused=paused, seconds=seconds, **broker)
    except Exception as err:
        where = broker["url"] or broker["transport"] or "the embedded flowengine-fs transport"
        exits.unreachable("send the pause to", f"{where} exchange {broker['exchange']!r}", err)
    state = "paused" if paused else "resumed"
    length = f" for {seconds:g}s" if seconds is not None else ""
    click.echo(f"topic {topic!r} {state}{length} on the workers listening now")


@topics_command.command("pause")
@broker_options
@click.argument("topic")
@click.option("--for", "seconds", envvar="FLOWENGINE_FOR",
              type=click.FloatRange(min=0.0, min_open=True, max=86_400.0), default=None,
              help="Resume by itself after this many seconds (default: never).")
def pause_command(topic: str, seconds: float | None, **options: Any) -> None:
    """Workers on TOPIC take no new request; the ones running finish.

    Requests wait in the queue until ``flowengine topics resume TOPIC`` (or --for runs out).
    Workers started later are not paused. Exit code 1: the broker cannot be reached.
    """
    _send_pause(topic, True, seconds, **options)


@topics_command.command("resume")
@broker_options
@click.argument("topic")
def resume_command(topic: str, **options: Any) -> None:
    """Workers on TOPIC take requests again (the backlog first)."""
    _send_pause(topic, False, None, **options)


for _command in (list_command, pause_command, resume_command):
    show_envvars(_command)
