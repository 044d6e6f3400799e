"""Prometheus metrics for workers and engines, fed by the same hooks as the event stream.

Needs the ``metrics`` extra (``pip install 'flowengine[metrics]'``); importing this module
works without it, using it raises an ImportError that says so. A :class:`MetricsSink` is an
:class:`~flowengine.worker_based.extensions.EventSink`: give it to a worker
(``Worker(metrics=True)``), a worker-based engine (option ``metrics=True``, or
``metrics_port=PORT`` to serve them too) or any engine through
:class:`~flowengine.worker_based.event_listener.EventListener`, and serve the registry with
:func:`start_metrics_server`. doc/operations.rst lists the metrics.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from flowengine.worker_based import extensions as ext

EXTRA_HINT = "pip install 'flowengine[metrics]'"

#: Event type -> the atom state its outcome counts as.
_OUTCOMES = {
    "task-succeeded": "SUCCESS",
    "task-failed": "FAILURE",
    "task-reverted": "REVERTED",
    "task-revert-failed": "REVERT_FAILURE",
}
_FINISHED = frozenset({"task-succeeded", "task-failed"})
#: What a worker's task-succeeded/failed counts as when the work was a revert.
_REVERT_OUTCOMES = {"task-succeeded": "REVERTED", "task-failed": "REVERT_FAILURE"}
#: Flow event type -> the flow state it counts as.
_FLOW_STATES = {
    "flow-succeeded": "SUCCESS",
    "flow-failed": "FAILURE",
    "flow-reverted": "REVERTED",
    "flow-suspended": "SUSPENDED",
}
_WORKER_LOST = "WorkerLost"


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as err:
        raise ImportError(
            f"flowengine metrics need prometheus-client, which the 'metrics' extra installs: "
            f"{EXTRA_HINT}") from err
    return prometheus_client


class _Metrics:
    """The metric families, registered once per registry."""

    def __init__(self, prom: Any, registry: Any) -> None:
        labels = ("role", "task")
        self.duration = prom.Histogram(
            "flowengine_atom_duration_seconds", "Seconds atoms took to execute or revert.",
            (*labels, "action"), registry=registry)
        self.outcomes = prom.Counter(
            "flowengine_atom_outcomes", "Atoms that ended, by end state.",
            (*labels, "state"), registry=registry)
        self.in_flight = prom.Gauge(
            "flowengine_atoms_in_flight", "Atoms running now.", ("role",), registry=registry)
        self.lapsed = prom.Counter(
            "flowengine_leases_lapsed", "Remote attempts lost (lease lapsed, worker gone).",
            labels, registry=registry)
        self.dead_letters = prom.Counter(
            "flowengine_dead_letters", "Requests parked as dead letters after their last attempt.",
            labels, registry=registry)
        self.flows = prom.Counter(
            "flowengine_flows", "Flows that ended, by end state.", ("state",), registry=registry)
        # Locks and limits (flowengine.coordination): "name" is a limit's key; locks, whose
        # names are as many as the resources, are counted together under "".
        coordination = ("kind", "name")
        self.waiting = prom.Gauge(
            "flowengine_coordination_waiting",
            "Flows and tasks waiting for a lock or a concurrency limit now (not running).",
            coordination, registry=registry)
        self.holding = prom.Gauge(
            "flowengine_coordination_held", "Locks and limit slots held now.", coordination,
            registry=registry)
        self.wait_seconds = prom.Histogram(
            "flowengine_coordination_wait_seconds",
            "Seconds from asking for a lock or limit slot to holding it.", coordination,
            registry=registry)
        self.lost = prom.Counter(
            "flowengine_coordination_lost", "Locks and limit slots whose lease was lost.",
            coordination, registry=registry)


# Keyed by the registry itself, weakly: an id outlives its object and may be reused by the next.
_FAMILIES: weakref.WeakKeyDictionary[Any, _Metrics] = weakref.WeakKeyDictionary()
_FAMILIES_LOCK = threading.Lock()
_SERVERS: dict[tuple[str, int, int], Any] = {}
_SERVERS_LOCK = threading.Lock()


def _families(registry: Any) -> _Metrics:
    prom = _prometheus()
    registry = prom.REGISTRY if registry is None else registry
    with _FAMILIES_LOCK:
        found = _FAMILIES.get(registry)
        if found is None:
            found = _FAMILIES[registry] = _Metrics(prom, registry)
        return found


class MetricsSink(ext.EventSink):
    """Updates the Prometheus metrics from events.

    Args:
        role: ``worker`` or ``engine``: the ``role`` label, so a process running both counts
            each atom once per side.
        registry: A ``prometheus_client.CollectorRegistry`` (default: the global one).

    Raises:
        ImportError: prometheus-client is not installed (names the extra to install).
    """

    def __init__(self, role: str = "worker", registry: Any = None) -> None:
        self._role = role
        self._m = _families(registry)

    def emit(self, event_type: str, **fields: object) -> None:
        try:
            self._update(event_type, fields)
        except Exception:  # metrics must never break the hook that feeds them
            pass

    def _update(self, event_type: str, fields: dict[str, object]) -> None:
        if event_type.startswith("lock-"):
            self._coordination(event_type, fields)
            return
        task = str(fields.get("task_name") or "")
        if event_type == "task-started":
            self._m.in_flight.labels(self._role).inc()
            return
        if event_type == "task-lost":
            self._m.lapsed.labels(self._role, task).inc()
            return
        if event_type in _FLOW_STATES:
            self._m.flows.labels(_FLOW_STATES[event_type]).inc()
            return
        state = _OUTCOMES.get(event_type)
        if state is None:
            return
        origin_engine = fields.get("origin") == "engine"
        if event_type in _FINISHED and not origin_engine:
            self._m.in_flight.labels(self._role).dec()
            if fields.get("action") == "revert":  # workers report a revert as they do work
                state = _REVERT_OUTCOMES[event_type]
        self._m.outcomes.labels(self._role, task, state).inc()
        runtime = fields.get("runtime")
        if isinstance(runtime, (int, float)):
            action = str(fields.get("action") or "execute")
            self._m.duration.labels(self._role, task, action).observe(runtime)
        if str(fields.get("exc_type") or "").endswith(_WORKER_LOST):
            self._m.dead_letters.labels(self._role, task).inc()


    def _coordination(self, event_type: str, fields: dict[str, object]) -> None:
        kind = str(fields.get("kind") or "lock")
        labels = (kind, "" if kind == "lock" else str(fields.get("key") or ""))
        if event_type == "lock-waiting":
            self._m.waiting.labels(*labels).inc()
        elif event_type == "lock-acquired":
            waited = fields.get("waited")
            if isinstance(waited, (int, float)):
                self._m.wait_seconds.labels(*labels).observe(waited)
            if fields.get("had_waited"):
                self._m.waiting.labels(*labels).dec()
            self._m.holding.labels(*labels).inc()
        elif event_type == "lock-released":
            self._m.holding.labels(*labels).dec()
        elif event_type == "lock-lost":
            self._m.holding.labels(*labels).dec()
            self._m.lost.labels(*labels).inc()
        elif event_type == "lock-abandoned":
            self._m.waiting.labels(*labels).dec()


def start_metrics_server(port: int, addr: str = "127.0.0.1", registry: Any = None) -> Any:
    """Serve ``/metrics`` over HTTP on ``addr:port`` from a daemon thread.

    Engines and workers of one process that ask for the same port share its endpoint: asking
    again for a port this process already serves (the same registry) returns that server.

    Args:
        port: TCP port (0: any free port, a new one each call; read it from the returned
            server's ``server_port``).
        addr: Address to bind; the default keeps the endpoint on this host.
        registry: What to serve (default: the global registry).

    Returns:
        The HTTP server (``server_port``, ``shutdown()``).

    Raises:
        ImportError: prometheus-client is not installed (names the extra to install).
        OSError: the port cannot be bound (another process has it).
    """
    prom = _prometheus()
    registry = prom.REGISTRY if registry is None else registry
    key = (addr, port, id(registry))
    with _SERVERS_LOCK:
        server = _SERVERS.get(key) if port else None
        if server is None:
            started = prom.start_http_server(port, addr=addr, registry=registry)
            server = started[0] if isinstance(started, tuple) else started
            if port:
                _SERVERS[key] = server
        return server
