"""A worker process for ``flowengine rehearse`` and ``flowengine chaos``: ``flowengine worker``
with the tools' eyes inside.

    python -m flowengine.testing.worker_process --exchange X --topic T --task pkg.mod:Class \\
        [--url URL | --transport NAME] [--transport-option k=v] [--threads N] \\
        [--rehearsal DIR] [--events-log PATH] [--ready PATH]

``--rehearsal DIR``: every task call goes through the rehearsal's interceptor, which reads
the faults in force from ``DIR/plan.json`` at each call and writes the call, and the side
effects the tasks report, to ``DIR/ledger.jsonl`` (shared with the rehearsing process).
``--events-log PATH``: each request this worker starts and finishes is appended to ``PATH``
(one JSON line, with its flow, atom, request id and attempt), the worker-side record ``chaos``
certifies from. ``--ready PATH``: created once the worker consumes. SIGTERM and SIGINT stop it
gracefully, as ``flowengine worker``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from flowengine.worker_based import extensions as ext

#: Seconds in-flight requests get to finish when the worker is told to stop.
STOP_GRACE = 5.0


class EventsLog(ext.EventSink):
    """Appends the worker's request events to a JSON-lines file (the event sink of
    :class:`~flowengine.worker_based.worker.Worker`). One ``write`` per line on an ``O_APPEND``
    descriptor: lines of several processes never interleave."""

    KEPT = frozenset({"task-started", "task-succeeded", "task-failed"})

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._pid = os.getpid()

    def emit(self, event_type: str, **fields: object) -> None:
        if event_type not in self.KEPT:
            return
        line = {"event": event_type, "t": time.time(), "pid": self._pid,
                **{k: fields.get(k) for k in ("flow_uuid", "atom_uuid", "task_name",
                                              "request_id", "attempt", "action", "worker")}}
        try:
            os.write(self._fd, (json.dumps(line, default=repr) + "\n").encode("utf-8"))
        except OSError:  # the record is the tools'; the work must go on without it
            pass

    def close(self) -> None:
        """Nothing to flush: each line was written whole."""


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m flowengine.testing.worker_process")
    parser.add_argument("--exchange", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--task", action="append", required=True, dest="tasks")
    parser.add_argument("--url")
    parser.add_argument("--transport")
    parser.add_argument("--transport-option", action="append", default=[],
                        dest="transport_options")
    parser.add_argument("--taskflow-compat", action="store_true")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rehearsal")
    parser.add_argument("--events-log")
    parser.add_argument("--ready")
    return parser.parse_args(argv)


def _options(pairs: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            found[key] = json.loads(value)
        except ValueError:
            found[key] = value
    return found


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or SIGINT."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if os.getcwd() not in sys.path:  # task modules in the current directory, as python -m
        sys.path.insert(0, os.getcwd())
    from flowengine.cli.signal_relay import SignalRelay
    from flowengine.engines import interception
    from flowengine.worker_based import events as ev
    from flowengine.worker_based.worker import Worker

    in_force = contextlib.ExitStack()  # for the process's life
    if args.rehearsal:
        from flowengine.testing import effects, rehearsal
        from flowengine.testing import ledger as lg

        shared = lg.FileLedger(Path(args.rehearsal) / rehearsal.LEDGER_FILE)
        effects.use(shared)
        in_force.enter_context(interception.installed(
            rehearsal.recorder(shared, Path(args.rehearsal))))
    sink: Any = True
    if args.events_log:
        sink = ev.combine(ev.EventPublisher(args.exchange, url=args.url,
                                            transport=args.transport,
                                            transport_options=_options(args.transport_options)),
                          EventsLog(args.events_log))
    worker = Worker(args.exchange, args.topic, tasks=args.tasks, threads_count=args.threads,
                    url=args.url, transport=args.transport,
                    transport_options=_options(args.transport_options),
                    taskflow_compat=args.taskflow_compat, events=sink)
    stopping = threading.Event()

    def stop(_signum: signal.Signals) -> None:
        if not stopping.is_set():
            stopping.set()
            worker.stop(STOP_GRACE)

    SignalRelay(stop, "flowengine-testing-worker-signals").install()
    if args.ready:
        ready = Path(args.ready)

        def say_ready() -> None:
            if worker.wait(60):
                ready.touch()

        threading.Thread(target=say_ready, daemon=True).start()
    worker.run(display_banner=False)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a task thread still running must not keep the process alive


if __name__ == "__main__":
    main()
