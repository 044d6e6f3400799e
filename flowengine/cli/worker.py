"""``flowengine worker``: run a worker process serving the given task classes."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any

import click

from flowengine import tracing
from flowengine.cli import exits
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.options import show_envvars, split_from_env
from flowengine.cli.signal_relay import SignalRelay

LOG = logging.getLogger(__name__)

DEFAULT_GRACE = 30.0


def check_task_specs(specs: tuple[str, ...]) -> list[str]:
    """``specs``, once each imports and resolves.

    Raises:
        click.ClickException: A spec cannot be imported (whatever its module raised while
            loading: ImportError, SyntaxError, RuntimeError...) or resolved; the message
            names the spec and the error.
    """
    from flowengine.worker_based.worker import find_task_classes

    for spec in specs:
        try:
            find_task_classes(spec)
        except Exception as err:  # a task module runs arbitrary code on import
            raise click.ClickException(
                f"cannot load the tasks of '{spec}': {type(err).__name__}: {err}") from err
    return list(specs)


def parse_autoscale(value: str | None) -> tuple[int, int] | None:
    """``"MAX,MIN"`` (or ``"MAX"``: MIN 0) as ``(MAX, MIN)``; a clear error otherwise."""
    if value is None:
        return None
    try:
        parts = [int(part) for part in value.split(",")]
        if len(parts) == 1:
            parts.append(0)
        most, least = parts
        if most < 1 or not 0 <= least <= most:
            raise ValueError
    except ValueError:
        raise click.BadParameter(f"{value!r} is not MAX,MIN with 0 <= MIN <= MAX and MAX >= 1",
                                 param_hint="'--autoscale'") from None
    return most, least


def parse_limit_options(values: tuple[str, ...]) -> dict[str, int]:
    """``--limit`` values (``CLASS=N``, or ``N`` for the topic) as ``{key: N}``.

    Raises:
        click.BadParameter: Naming the value that is not ``[CLASS=]N`` with N >= 1.
    """
    from flowengine.worker_based.worker_side.limits import TOPIC

    found: dict[str, int] = {}
    for value in values:
        key, _, number = value.rpartition("=")
        if not number.strip().isdigit() or int(number) < 1 or "=" in key:
            raise click.BadParameter(f"{value!r} is not [CLASS=]N with N a whole number >= 1",
                                     param_hint="--limit")
        found[key.strip() or TOPIC] = int(number)
    return found


@show_envvars
@click.command("worker")
@broker_options
@click.option("--topic", envvar="FLOWENGINE_TOPIC", required=True,
              help="This worker's topic (queue <exchange>_<topic>).")
@click.option("--task", "tasks", envvar="FLOWENGINE_TASK", multiple=True, required=True,
              callback=split_from_env,
              help="Task classes to serve: 'pkg.mod', 'pkg.mod:Class'. Repeatable; the "
                   "environment variable holds several, separated by commas or whitespace.")
@click.option("--threads", envvar="FLOWENGINE_THREADS", type=click.IntRange(min=1), default=None,
              help="Task threads (also the most requests held at once).")
@click.option("--autoscale", envvar="FLOWENGINE_AUTOSCALE", default=None, metavar="MAX,MIN",
              callback=lambda _ctx, _param, value: parse_autoscale(value),
              help="Task threads grow with the backlog up to MAX and shrink to MIN when idle "
                   "(instead of --threads); the broker prefetch follows.")
@click.option("--async-concurrency", envvar="FLOWENGINE_ASYNC_CONCURRENCY",
              type=click.IntRange(min=1), default=None,
              help="Most `async def` task calls awaited at once on the worker's event loop "
                   "(default 1000); they count in the capacity besides the threads.")
@click.option("--grace", envvar="FLOWENGINE_GRACE", type=float, default=DEFAULT_GRACE,
              show_default=True, help="Seconds in-flight work gets to finish on SIGTERM.")
@click.option("--events/--no-events", envvar="FLOWENGINE_EVENTS", default=True, show_default=True,
              help="Publish events to <exchange>.events (see `flowengine events`).")
@click.option("--metrics-port", envvar="FLOWENGINE_METRICS_PORT", type=click.IntRange(0, 65535),
              default=None, help="Serve Prometheus metrics on 127.0.0.1:PORT/metrics.")
@click.option("--log-level", envvar="FLOWENGINE_LOG_LEVEL", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--signing-key-file", envvar="FLOWENGINE_SIGNING_KEY_FILE", default=None,
              help="File holding the key engines and workers sign messages with (else "
                   "FLOWENGINE_SIGNING_KEY; never on the command line, where `ps` shows it).")
@click.option("--limit", "limits", envvar="FLOWENGINE_LIMIT", multiple=True,
              callback=split_from_env, metavar="[CLASS=]N",
              help="At most N requests run at once across every worker and engine using "
                   "--coordination: of task class CLASS (short or full name), or, with no "
                   "CLASS, of this worker's topic. Repeatable.")
@click.option("--coordination", envvar="FLOWENGINE_COORDINATION", default=None,
              help="Where --limit is held: the jobboard URI of a Redis, ZooKeeper or etcd "
                   "(redis://host:6379/0?namespace=app).")
def worker_command(topic: str, tasks: tuple[str, ...], threads: int | None,
                   autoscale: tuple[int, int] | None, async_concurrency: int | None,
                   grace: float, events: bool,
                   metrics_port: int | None, log_level: str, signing_key_file: str | None,
                   limits: tuple[str, ...], coordination: str | None,
                   **broker: Any) -> None:
    """Serve remote task requests until SIGTERM or SIGINT.

    The first signal stops taking requests and lets in-flight ones finish (up to --grace); a
    second SIGINT (Ctrl-C again) exits at once (status 130), the broker handing out again what
    was unfinished.
    """
    from flowengine.worker_based.worker import BrokerRefused, Worker

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from flowengine.worker_based import secret_arguments

    # What a task logs while it runs is masked with its request's secret arguments.
    secret_arguments.install_filter()
    # Like ``python -m``, let task modules in the current directory be found.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if metrics_port is not None:
        from flowengine.worker_based.metrics import start_metrics_server

        try:
            start_metrics_server(metrics_port)
        except (ImportError, OSError) as err:
            raise click.ClickException(
                f"cannot serve metrics on port {metrics_port}: {err}") from err
    connection = broker_kwargs(**broker)  # usage errors first
    if autoscale is not None and threads is not None:
        raise click.UsageError("--autoscale and --threads exclude each other")
    worker_limits = parse_limit_options(limits)
    if worker_limits and not coordination:
        raise click.UsageError("--limit needs --coordination (the jobboard's Redis, ZooKeeper "
                               "or etcd URI)")
    try:
        worker = Worker(topic=topic, tasks=check_task_specs(tasks), threads_count=threads,
                        autoscale=autoscale, events=events, metrics=metrics_port is not None,
                        signing_key_file=signing_key_file, async_concurrency=async_concurrency,
                        limits=worker_limits, coordination=coordination, **connection)
    except (ValueError, TypeError) as err:
        raise click.ClickException(f"cannot start the worker: {err}") from err
    def _stop(signum: signal.Signals) -> None:
        # Runs on the relay thread (see signal_relay: a handler must not take locks).
        if stopping.is_set():
            if signum != signal.SIGINT:
                # A supervisor's SIGTERM after a terminal's Ctrl-C (the demo's job control
                # does this): the stop it asks for is under way.
                return
            # Ctrl-C again: whoever pressed it will not wait for the grace period. What is
            # still running was never acknowledged, so the broker hands it out again.
            LOG.warning("Worker %s (topic %r) received %s again: stopping now; requests still "
                        "running go back to the broker", worker.worker_id, topic, signum.name)
            _exit(exits.INTERRUPTED)
        stopping.set()
        # Stopping must not depend on stderr: a closed pipe would raise here.
        with contextlib.suppress(OSError):
            click.echo(f"received {signum.name}: finishing in-flight work "
                       f"(up to {grace:.0f}s)", err=True)
        # On a thread of its own: stop() waits for in-flight work (up to the grace period),
        # and the relay thread must stay free to hear a second signal meanwhile.
        threading.Thread(target=worker.stop, args=(grace,), name="flowengine-worker-stop",
                         daemon=True).start()

    stopping = threading.Event()
    SignalRelay(_stop, "flowengine-worker-signals").install()
    try:
        worker.run(banner_writer=lambda text: click.echo(text, err=True))
    except BrokerRefused as err:
        raise click.ClickException(str(err)) from err
    LOG.info("Worker %s (topic %r) stopped", worker.worker_id, topic)
    _exit(exits.OK)


def _exit(code: int) -> None:
    """End the process now with ``code``, logs and traces flushed.

    In-flight work past the grace period was handed back to the broker; a task thread still
    running it must not keep the process alive (the interpreter would wait for it).
    """
    tracing.flush()  # exit handlers (the SDK's own flush among them) do not run after os._exit
    logging.shutdown()
    with contextlib.suppress(OSError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
