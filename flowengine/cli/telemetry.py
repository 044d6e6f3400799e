"""What ``flowengine run`` reports while a flow runs: events and Prometheus metrics.

The worker-based engine has both built in (its options ``events`` and ``metrics_port``); for
the serial and parallel engines, which have neither, ``run`` attaches an
:class:`~flowengine.worker_based.event_listener.EventListener` itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import click

from flowengine.cli.loading import LoadError

#: Engine names (and URI schemes) of the worker-based engine.
WORKER_ENGINES = ("worker-based", "workers")


def is_worker_based(engine_name: str) -> bool:
    """Whether ``engine_name`` (a name or an engine URI) is the worker-based engine."""
    return engine_name.split("://", 1)[0] in WORKER_ENGINES


def telemetry_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --events/--no-events and --metrics-port."""
    decorators = [
        click.option("--events/--no-events", "events", envvar="FLOWENGINE_EVENTS", default=None,
                     help="Publish events to <exchange>.events on the broker options' broker "
                          "(default: on for the worker-based engine, off for the others)."),
        click.option("--metrics-port", envvar="FLOWENGINE_METRICS_PORT",
                     type=click.IntRange(0, 65535), default=None,
                     help="Serve Prometheus metrics on 127.0.0.1:PORT/metrics while the flow "
                          "runs."),
    ]
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


def engine_options(events: bool | None, metrics_port: int | None) -> dict[str, Any]:
    """The worker-based engine's options for ``--events`` and ``--metrics-port``."""
    options: dict[str, Any] = {}
    if events is not None:
        options["events"] = events
    if metrics_port is not None:
        options["metrics_port"] = metrics_port
    return options


def serve_metrics(port: int) -> int:
    """Start the metrics endpoint before anything runs and say where it is, on stderr; return
    its port (``port``, or the one chosen for 0). Exit 1 if it cannot be served."""
    from flowengine.worker_based.metrics import start_metrics_server

    try:
        bound = int(start_metrics_server(port).server_port)
    except (ImportError, OSError) as err:
        raise LoadError(f"cannot serve metrics on 127.0.0.1:{port}: {err}") from err
    click.echo(f"metrics on http://127.0.0.1:{bound}/metrics", err=True)
    return bound


@contextlib.contextmanager
def reporting(engine: Any, events: bool | None, metrics: bool,
              broker: dict[str, Any]) -> Iterator[None]:
    """While inside, a local engine publishes events (``events``) to ``broker`` and updates
    the metrics (``metrics``); the worker-based engine does both itself."""
    from flowengine.worker_based.event_listener import EventListener

    with contextlib.ExitStack() as stack:
        if events:
            from flowengine.worker_based.events import EventPublisher

            publisher = EventPublisher(broker["exchange"], url=broker["url"],
                                       transport=broker["transport"],
                                       transport_options=broker["transport_options"])
            stack.callback(publisher.close)  # after the listener: the flow's last event too
            stack.enter_context(EventListener(engine, publisher))
        if metrics:
            from flowengine.worker_based.metrics import MetricsSink

            stack.enter_context(EventListener(engine, MetricsSink(role="engine")))
        yield
