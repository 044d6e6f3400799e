"""``flowengine worker``: run a worker process serving the given task classes."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

import click

from flowengine.cli.options import parse_pairs, split_env_list

DEFAULT_GRACE = 30.0


@click.command("worker")
@click.option("--url", envvar="FLOWENGINE_URL", default=None,
              help="Broker URL (default: the embedded filesystem transport).")
@click.option("--exchange", envvar="FLOWENGINE_EXCHANGE", default="default", show_default=True,
              help="Exchange engines publish requests to.")
@click.option("--topic", envvar="FLOWENGINE_TOPIC", required=True,
              help="This worker's topic (queue <exchange>_<topic>).")
@click.option("--task", "tasks", envvar="FLOWENGINE_TASKS", multiple=True, required=True,
              help="Task classes to serve: 'pkg.mod', 'pkg.mod:Class'. Repeatable.")
@click.option("--threads", envvar="FLOWENGINE_THREADS", type=click.IntRange(min=1), default=None,
              help="Task threads (also the most requests held at once).")
@click.option("--transport", envvar="FLOWENGINE_TRANSPORT", default=None,
              help="Kombu transport name (memory, redis, flowengine-fs, ...).")
@click.option("--transport-option", "transport_options", envvar="FLOWENGINE_TRANSPORT_OPTIONS",
              multiple=True, help="Transport option key=value (e.g. data_folder=/tmp/q). "
                                  "Repeatable.")
@click.option("--taskflow-compat", envvar="FLOWENGINE_TASKFLOW_COMPAT", is_flag=True,
              help="Declare queues exactly as TaskFlow does (mixed fleets).")
@click.option("--grace", envvar="FLOWENGINE_GRACE", type=float, default=DEFAULT_GRACE,
              show_default=True, help="Seconds in-flight work gets to finish on SIGTERM.")
@click.option("--log-level", envvar="FLOWENGINE_LOG_LEVEL", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def worker_command(url: str | None, exchange: str, topic: str, tasks: tuple[str, ...],
                   threads: int | None, transport: str | None,
                   transport_options: tuple[str, ...], taskflow_compat: bool, grace: float,
                   log_level: str) -> None:
    """Serve remote task requests until SIGTERM or SIGINT."""
    from flowengine.worker_based.worker import Worker

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options: dict[str, Any] = parse_pairs(split_env_list(transport_options), "transport option")
    # Like ``python -m``, let task modules in the current directory be found.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        worker = Worker(exchange=exchange, topic=topic, tasks=split_env_list(tasks),
                        threads_count=threads, url=url, transport=transport,
                        transport_options=options, taskflow_compat=taskflow_compat)
    except ImportError as err:
        raise click.ClickException(
            f"cannot import the tasks {list(split_env_list(tasks))}: {err}") from err
    except (ValueError, TypeError) as err:
        raise click.ClickException(f"cannot start the worker: {err}") from err
    stopping = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        if stopping.is_set():
            return
        stopping.set()
        click.echo(f"received {signal.Signals(signum).name}: finishing in-flight work "
                   f"(up to {grace:.0f}s)", err=True)
        threading.Thread(target=worker.stop, args=(grace,), daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    worker.run(banner_writer=lambda text: click.echo(text, err=True))
    sys.stderr.flush()
