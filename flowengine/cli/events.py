"""``flowengine events``: follow the event stream of an exchange."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

import click

from flowengine.cli import exits
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.options import json_option, show_envvars, without_options

#: Fields shown first on a line, in this order, when an event has them.
_LEADING = ("flow_uuid", "task_name", "atom_uuid", "action", "attempt", "worker", "topic")
#: Fields every event has (shown in the line's head, or not at all).
_ENVELOPE = frozenset({"type", "hostname", "pid", "clock", "timestamp", "utcoffset",
                       "local_received"})


def _short(key: str, value: Any) -> str:
    if key in ("runtime", "duration") and isinstance(value, (int, float)):
        return f"{value:.3f}s"
    if isinstance(value, str):
        return json.dumps(value) if (not value or " " in value) else value
    return json.dumps(value, sort_keys=True)


def format_line(event: Mapping[str, Any]) -> str:
    """One human-readable line: time, type, origin, then the event's own fields."""
    stamp = event.get("timestamp")
    when = (datetime.datetime.fromtimestamp(stamp).strftime("%H:%M:%S.%f")[:-3]
            if isinstance(stamp, (int, float)) else "?")
    keys = [k for k in _LEADING if k in event]
    keys += sorted(k for k in event if k not in _ENVELOPE and k not in _LEADING)
    fields = " ".join(f"{k}={_short(k, event[k])}" for k in keys if event[k] is not None)
    origin = f"{event.get('hostname')}:{event.get('pid')}#{event.get('clock')}"
    return f"{when} {event.get('type', '?'):<18} {origin} {fields}".rstrip()


@show_envvars
@without_options("taskflow_compat")  # the events exchange is flowengine's alone
@click.command("events")
@broker_options
@json_option("One JSON object per event and line.")
@click.option("--flow", "flow", envvar="FLOWENGINE_FLOW", default=None, metavar="UUID",
              help="Only events of this flow.")
@click.option("--type", "types", envvar="FLOWENGINE_TYPE", multiple=True, metavar="TYPE",
              help="Only events whose type starts with TYPE (task-, flow-failed). Repeatable.")
@click.option("--count", envvar="FLOWENGINE_COUNT", type=click.IntRange(min=1), default=None,
              help="Stop after this many events.")
@click.option("--timeout", envvar="FLOWENGINE_TIMEOUT", type=click.FloatRange(min=0),
              default=None, help="Stop after this many seconds.")
def events_command(as_json: bool, flow: str | None, types: tuple[str, ...], count: int | None,
                   timeout: float | None, **broker: Any) -> None:
    """Print the events engines and workers publish, as they happen.

    Events are read from the fanout exchange <exchange>.events through a private queue, so
    only events published while the command listens are seen. "listening on ..." goes to
    stderr once they will be.

    \b
    Exit codes:
      0  --count events were printed, or the stream was stopped (Ctrl-C)
      1  the broker cannot be reached
      2  usage error; or --timeout passed before --count events (without --count: before
         any event)
    """
    from flowengine.worker_based.events import EventReceiver

    receiver = EventReceiver(types=types, flow=flow, **_receiver_kwargs(broker))
    seen = 0
    try:
        ready = lambda: click.echo(f"listening on {receiver.where}", err=True)  # noqa: E731
        for event in receiver.iter(timeout=timeout, ready=ready):
            click.echo(json.dumps(event, sort_keys=True) if as_json else format_line(event))
            seen += 1
            if count is not None and seen >= count:
                return
    except KeyboardInterrupt:
        return
    except Exception as err:
        exits.unreachable("read events from", receiver.where, err)
    if timeout is not None and (seen == 0 or count is not None):
        click.echo(f"timeout: {seen} event(s) in {timeout:g}s", err=True)
        raise SystemExit(exits.USAGE)


def _receiver_kwargs(broker: dict[str, Any]) -> dict[str, Any]:
    kwargs = broker_kwargs(taskflow_compat=False, **broker)
    del kwargs["taskflow_compat"]
    return kwargs
