"""``flowengine workers``: which workers are alive, what they run and how busy they are."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click

from flowengine.cli import exits
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.options import json_option, show_envvars, split_env_list

if TYPE_CHECKING:  # the command imports the worker-based modules only when it runs
    from flowengine.worker_based.broker.delivery import Delivery

#: Default seconds to listen: longer than the workers' heartbeat interval (2 s).
DEFAULT_WAIT = 2.5


class WorkerTable:
    """What was heard about each worker, by worker id (thread-safe)."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[str, Any]] = {}
        self._gone: set[str] = set()
        self._lock = threading.Lock()

    def _row(self, worker: str) -> dict[str, Any]:
        return self._rows.setdefault(worker, {
            "worker": worker, "topics": [], "tasks": [], "capacity": None, "free": None,
            "in_flight": None, "threads": None, "prefetch": None, "paused": None,
            "last_heartbeat": None, "hostname": None, "pid": None, "versions": {},
            "source": []})

    def _merge(self, row: dict[str, Any], topic: Any, tasks: Any, source: str) -> None:
        if isinstance(topic, str) and topic not in row["topics"]:
            row["topics"] = sorted([*row["topics"], topic])
        if isinstance(tasks, list):
            row["tasks"] = sorted(set(row["tasks"]) | {str(t) for t in tasks})
        if source not in row["source"]:
            row["source"].append(source)

    def on_event(self, event: dict[str, Any]) -> None:
        """Take in a worker-online, worker-heartbeat, worker-offline or topic-paused/resumed
        event."""
        worker = event.get("worker")
        if not isinstance(worker, str):
            return
        with self._lock:
            if event.get("type") == "worker-offline":
                self._gone.add(worker)
                return
            self._gone.discard(worker)
            row = self._row(worker)
            self._merge(row, event.get("topic"), event.get("tasks"), "events")
            if event.get("type") in ("topic-paused", "topic-resumed"):
                row["paused"] = event["type"] == "topic-paused"
            for key in ("capacity", "free", "in_flight", "threads", "prefetch", "paused",
                        "hostname", "pid", "async_slots"):
                if event.get(key) is not None:
                    row[key] = event[key]
            if isinstance(event.get("versions"), dict):
                row["versions"] = {str(k): str(v) for k, v in event["versions"].items()}
            if event.get("type") == "worker-heartbeat":
                row["last_heartbeat"] = event.get("timestamp")

    def on_notify(self, worker: str | None, topic: str, tasks: list[str],
                  free: Any, versions: dict[str, str] | None = None) -> None:
        """Take in a NOTIFY reply (TaskFlow workers send no id: they are named by topic)."""
        with self._lock:
            row = self._row(worker or f"taskflow@{topic}")
            self._merge(row, topic, tasks, "notify")
            if isinstance(free, int):
                row["free"] = free
            if versions:
                row["versions"] = dict(versions)

    def live(self) -> list[dict[str, Any]]:
        """The workers heard from and not gone offline, by id."""
        with self._lock:
            return [dict(r) for k, r in sorted(self._rows.items()) if k not in self._gone]


class _Listening:
    """Takes in the NOTIFY replies of the asked topics' workers, heard through a quiet view
    of the process's broker client (it sends no requests). The client asks the topics as the
    view attaches, and every few seconds after."""

    def __init__(self, table: WorkerTable, topics: list[str]) -> None:
        self._table = table
        self._topics = set(topics)

    def on_notify(self, data: Any, message: Delivery) -> None:
        from flowengine.worker_based import protocol as pr
        from flowengine.worker_based.wire import versions as vs

        if data["topic"] not in self._topics:  # another topic's worker answering discovery
            return
        headers = message.headers or {}
        self._table.on_notify(headers.get(pr.HEADER_WORKER), data["topic"], data["tasks"],
                              headers.get(pr.HEADER_CAPACITY),
                              vs.decode(headers.get(vs.HEADER_TASK_VERSIONS)))


def _ask_topics(table: WorkerTable, topics: Iterable[str], stop: threading.Event,
                **broker: Any) -> threading.Thread:
    """Ask ``topics`` for their workers and record the replies until ``stop`` (from a
    thread), through the process's broker client."""
    from flowengine.worker_based import client as cl
    from flowengine.worker_based import signing as sg
    from flowengine.worker_based.broker_spec import Broker

    asked = list(topics)
    # Replies are not checked for signatures, so that TaskFlow workers are listed too.
    spec = Broker(**broker, signing=sg.Signing())

    def run() -> None:
        with cl.borrowed(spec) as client:
            view = cl.QuietView(_Listening(table, asked).on_notify)
            client.attach(view, asked)
            try:
                stop.wait()
            finally:
                client.detach(view, asked, [])

    runner = threading.Thread(target=run, daemon=True, name="flowengine-workers-notify")
    runner.start()
    return runner


def _age(stamp: Any, now: float) -> str:
    return f"{max(now - stamp, 0.0):.1f}s ago" if isinstance(stamp, (int, float)) else "-"


def _capacity(row: dict[str, Any]) -> str:
    """``CAPACITY``: the most task threads, as ``now/most`` while an autoscaled pool is smaller."""
    most, now = row["capacity"], row["threads"]
    if most is None:
        return "-"
    slots = row.get("async_slots") or 0
    threads = f"{now}/{most - slots}" if isinstance(now, int) and now != most - slots else ""
    if slots:
        return f"{most} ({threads or most - slots} threads + {slots} async)"
    return threads or str(most)


def _versions(row: dict[str, Any]) -> str:
    """``VERSIONS``: one version if every class has it, else each class's (short names)."""
    versions = row.get("versions") or {}
    if not versions:
        return "-"
    if len(set(versions.values())) == 1:
        return str(next(iter(versions.values())))
    return ",".join(f"{name.rpartition('.')[2]}={version}"
                    for name, version in sorted(versions.items()))


def _print_table(rows: list[dict[str, Any]]) -> None:
    now = time.time()
    header = ("WORKER", "TOPICS", "TASKS", "VERSIONS", "CAPACITY", "FREE", "IN-FLIGHT",
              "PREFETCH", "PAUSED", "LAST HEARTBEAT")
    lines = [header] + [
        (r["worker"], ",".join(r["topics"]) or "-", str(len(r["tasks"])), _versions(r),
         _capacity(r),
         *("-" if r[k] is None else str(r[k]) for k in ("free", "in_flight", "prefetch")),
         "-" if r["paused"] is None else ("yes" if r["paused"] else "no"),
         _age(r["last_heartbeat"], now)) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


@show_envvars
@click.command("workers")
@broker_options
@click.option("--wait", envvar="FLOWENGINE_WAIT", type=click.FloatRange(min=0.1),
              default=DEFAULT_WAIT, show_default=True, help="Seconds to listen for workers.")
@click.option("--topic", "topics", envvar="FLOWENGINE_TOPIC", multiple=True,
              help="Also ask this topic's workers with NOTIFY (finds TaskFlow workers too)."
                   " Repeatable.")
@json_option("One JSON object per worker and line.")
def workers_command(wait: float, topics: tuple[str, ...], as_json: bool, **broker: Any) -> None:
    """List the live workers: id, topics, tasks, capacity, free slots, in-flight requests.

    Listens --wait seconds for the workers' announcements and heartbeats (every 2 s) on the
    events exchange, and with --topic also asks those topics' queues.

    \b
    Exit codes:
      0  at least one live worker was found
      1  the broker cannot be reached
      2  usage error; or no live worker was heard from
    """
    from flowengine.worker_based.events import EventReceiver

    kwargs = broker_kwargs(**broker)
    table = WorkerTable()
    stop = threading.Event()
    asking = _ask_topics(table, split_env_list(topics), stop, **kwargs) if topics else None
    events = {k: v for k, v in kwargs.items() if k != "taskflow_compat"}
    receiver = EventReceiver(types=("worker-", "topic-"), **events)
    try:
        for event in receiver.iter(timeout=wait):
            table.on_event(event)
    except Exception as err:
        exits.unreachable("read events from", receiver.where, err)
    finally:
        stop.set()
        if asking is not None:
            asking.join(timeout=10.0)
    rows = table.live()
    if as_json:
        for row in rows:
            click.echo(json.dumps(row, sort_keys=True))
    elif rows:
        _print_table(rows)
    if not rows:
        click.echo(f"no live workers heard from in {wait:g}s on {receiver.where}", err=True)
        raise SystemExit(exits.USAGE)
