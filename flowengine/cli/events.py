"""``flowengine events``: follow the event stream of an exchange."""

from __future__ import annotations

import datetime
import json
import queue
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import click

from flowengine.cli import event_order, exits
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.options import json_option, show_envvars, without_options

#: The event type every worker sends every few seconds, left out unless asked for.
HEARTBEAT = "worker-heartbeat"
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
@json_option("One JSON object per event and line (JSON lines).")
@click.option("--flow", "flow", envvar="FLOWENGINE_FLOW", default=None, metavar="UUID",
              help="Only events of this flow.")
@click.option("--type", "types", envvar="FLOWENGINE_TYPE", multiple=True, metavar="TYPE",
              help="Only events whose type starts with TYPE (task-, flow-failed). Repeatable.")
@click.option("--heartbeats", envvar="FLOWENGINE_HEARTBEATS", is_flag=True,
              help=f"Show {HEARTBEAT} events too (left out unless --type asks for them: "
                   "every worker sends one every few seconds).")
@click.option("--count", envvar="FLOWENGINE_COUNT", type=click.IntRange(min=1), default=None,
              help="Stop after this many events.")
@click.option("--timeout", envvar="FLOWENGINE_TIMEOUT", type=click.FloatRange(min=0),
              default=None, help="Stop after this many seconds.")
def events_command(as_json: bool, flow: str | None, types: tuple[str, ...], heartbeats: bool,
                   count: int | None, timeout: float | None, **broker: Any) -> None:
    """Print the events engines and workers publish, as they happen.

    Events are read from the fanout exchange <exchange>.events through a private queue, so
    only events published while the command listens are seen. "listening on ..." goes to
    stderr once they will be. Each event is held a moment (a few tenths of a second) so that
    lines come in the order the events happened, whichever process published them first.

    \b
    Exit codes:
      0  --count events were printed, or the stream was stopped (Ctrl-C)
      1  the broker cannot be reached
      2  usage error; or --timeout passed before --count events (without --count: before
         any event)
    """
    from flowengine.worker_based.events import EventReceiver

    receiver = EventReceiver(types=types, flow=flow, **_receiver_kwargs(broker))
    shown = heartbeats or any(t and HEARTBEAT.startswith(t) for t in types)
    printed = 0
    try:
        for event in _in_time_order(receiver, timeout):
            if not shown and event.get("type") == HEARTBEAT:
                continue
            click.echo(json.dumps(event, sort_keys=True) if as_json else format_line(event))
            printed += 1
            if count is not None and printed >= count:
                return
    except KeyboardInterrupt:
        return
    except Exception as err:
        exits.unreachable("read events from", receiver.where, err)
    if timeout is not None and (printed == 0 or count is not None):
        click.echo(f"timeout: {printed} event(s) in {timeout:g}s", err=True)
        raise SystemExit(exits.USAGE)


def _in_time_order(receiver: Any, timeout: float | None) -> Iterator[Mapping[str, Any]]:
    """The receiver's events, each held for :data:`~.event_order.DEFAULT_WINDOW` so they come
    out in time order. A thread of its own listens, so held events come out on time even while
    nothing arrives; its errors are raised here."""
    arrived: queue.Queue[Mapping[str, Any] | BaseException | None] = queue.Queue()
    stop = threading.Event()

    def listen() -> None:
        try:
            for event in receiver.iter(timeout=timeout, stop=stop, ready=lambda: click.echo(
                    f"listening on {receiver.where}", err=True)):
                arrived.put(event)
        except Exception as err:
            arrived.put(err)
        finally:
            arrived.put(None)

    listener = threading.Thread(target=listen, name="flowengine-events", daemon=True)
    listener.start()
    order = event_order.TimeOrder()
    try:
        while True:
            try:
                item = arrived.get(timeout=order.wait())
            except queue.Empty:
                yield from order.release()
                continue
            if item is None:
                yield from order.drain()
                return
            if isinstance(item, BaseException):
                raise item
            order.add(item)
            yield from order.release()
    finally:
        stop.set()


def _receiver_kwargs(broker: dict[str, Any]) -> dict[str, Any]:
    kwargs = broker_kwargs(taskflow_compat=False, **broker)
    del kwargs["taskflow_compat"]
    return kwargs
