"""Locks per resource and concurrency limits, on the service that already holds the jobboards.

>>> coordinator = coordination.connect("redis://127.0.0.1:6379?namespace=app")  # doctest: +SKIP
>>> with coordinator.acquire("lb:1234") as ticket:  # doctest: +SKIP
...     ...

Engines use it through their options (``locks=``, ``concurrency=``, ``coordination=``); a
conductor through the locks of a job (``flowengine jobs post --lock``); a worker through
``limits=`` (``flowengine worker --limit``). ``flowengine locks`` lists who holds and who waits.
See doc/coordination.rst.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from flowengine.coordination.coordinator import (
    Clock,
    Coordinator,
    LockHeld,
    Ticket,
    describe_holder,
)
from flowengine.coordination.service import Entry, LeaseLost, Service, check_key
from flowengine.jobs.lease_clock import lease_clock

__all__ = [
    # connecting
    "connect", "shared", "service_for", "for_board", "board_conf", "DEFAULT_TTL",
    # jobs posted with locks
    "job_locks", "JOB_LOCKS", "JOB_ON_CONFLICT",
    # using
    "Coordinator", "Ticket", "Entry",
    # errors
    "LockHeld", "LeaseLost",
    # showing
    "describe_holder",
]

#: Seconds a lock or limit's lease lasts without renewal, unless the conf says (``lock_ttl``).
DEFAULT_TTL = 30.0

_SHARED: dict[tuple[str, ...], Coordinator] = {}
_SHARED_LOCK = threading.Lock()


def _split(conf: str | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    from flowengine.jobs.backends import split_conf

    return split_conf(conf if isinstance(conf, str) else dict(conf))


def service_for(conf: str | Mapping[str, Any], ttl: float | None = None) -> Service:
    """The (unconnected) queues on the service a jobboard conf or URI names.

    The conf is a jobboard's (``redis://...``, ``zookeeper://...``, ``etcd://...`` or a dict
    with ``board``): locks live beside that board's jobs, in its namespace or path. Key
    ``lock_ttl`` (or ``ttl``) sets the lease's length, :data:`DEFAULT_TTL` by default.

    Raises:
        ValueError: If the conf names no supported service.
        ImportError: If the service's client is missing (names the extra to install).
    """
    name, options = _split(conf)
    if ttl is None:
        given = options.get("lock_ttl")
        ttl = float(given) if given is not None else DEFAULT_TTL
    if not ttl > 0:
        raise ValueError(f"The lease of locks and limits (lock_ttl) must be > 0 s, not {ttl!r}")
    if name == "redis":
        from flowengine.coordination._redis import RedisService

        return RedisService(options, ttl)
    if name in ("zookeeper", "zk"):
        from flowengine.coordination._zookeeper import ZookeeperService

        return ZookeeperService(options, ttl)
    if name == "etcd":
        from flowengine.coordination._etcd import EtcdService

        return EtcdService(options, ttl)
    raise ValueError(f"Locks and limits need Redis, ZooKeeper or etcd; {name!r} is none of them")


def connect(conf: str | Mapping[str, Any], ttl: float | None = None, owner: str | None = None,
            events: Any = None, clock: Clock | None = None) -> Coordinator:
    """A connected :class:`Coordinator` on the service ``conf`` names (see
    :func:`service_for`); close it when done.

    Args:
        conf: A jobboard conf or URI.
        ttl: The lease's length in seconds (default: the conf's ``lock_ttl``, else 30).
        owner: Who this process is, as holders are shown.
        events: An :class:`~flowengine.worker_based.extensions.EventSink` told of waits,
            acquisitions, releases and losses (a metrics sink, the event stream).
        clock: The monotonic clock leases are timed by (default: the system's; tests inject
            one to move time by hand).
    """
    coordinator = Coordinator(service_for(conf, ttl), owner=owner,
                              events=events if events is not None else _default_events(),
                              clock=clock or lease_clock)
    return coordinator.connect()


def _default_events() -> Any:
    """Counts waits and holds in the process's Prometheus registry when prometheus-client is
    installed (the ``metrics`` extra); else reports nothing."""
    from flowengine.worker_based.extensions import NO_EVENTS

    try:
        import prometheus_client  # noqa: F401  (only whether it is there)
    except ImportError:
        return NO_EVENTS
    from flowengine.worker_based.metrics import MetricsSink

    return MetricsSink(role="coordination")


def shared(conf: str | Mapping[str, Any] | Coordinator) -> Coordinator:
    """The process's coordinator for ``conf`` (made and connected on first use, then shared by
    every engine of the process, as its broker client is); a coordinator passes through."""
    if isinstance(conf, Coordinator):
        return conf
    name, options = _split(conf)
    identity = (name, *sorted(f"{k}={v}" for k, v in options.items()))
    with _SHARED_LOCK:
        found = _SHARED.get(identity)
        if found is None:
            found = _SHARED[identity] = connect(conf)
        return found


#: Job details keys (``flowengine jobs post --lock ... --on-conflict ...``).
JOB_LOCKS = "locks"
JOB_ON_CONFLICT = "on_conflict"

_BOARD_KINDS = {"RedisJobBoard": "redis", "ZookeeperJobBoard": "zookeeper",
                "EtcdJobBoard": "etcd"}


def job_locks(details: Mapping[str, Any] | None) -> tuple[list[str], str]:
    """The locks a job's details ask for and what to do when one is held (``wait`` or
    ``reject``).

    Raises:
        ValueError: If the details' ``locks`` or ``on_conflict`` are malformed.
    """
    details = details or {}
    locks = details.get(JOB_LOCKS) or []
    if isinstance(locks, str) or not isinstance(locks, list) or not all(
            isinstance(k, str) and k for k in locks):
        raise ValueError(f"A job's 'locks' must be a list of lock names, not {locks!r}")
    on_conflict = str(details.get(JOB_ON_CONFLICT) or "wait").lower()
    if on_conflict not in ("wait", "reject"):
        raise ValueError(f"A job's 'on_conflict' must be 'wait' or 'reject', not "
                         f"{details.get(JOB_ON_CONFLICT)!r}")
    return [check_key(k) for k in locks], on_conflict


def board_conf(board: Any) -> dict[str, Any]:
    """The conf of the service a connected or unconnected jobboard lives on (its kind, and
    its conf keys: locks live in its namespace or path)."""
    kind = _BOARD_KINDS.get(type(board).__name__)
    if kind is None:
        raise ValueError(f"Locks and limits need a Redis, ZooKeeper or etcd jobboard, not "
                         f"{type(board).__name__}")
    # The board keeps the conf it was made from (with the URI's parts already read).
    conf = dict(getattr(board, "_conf", {}) or {})
    conf.pop("board", None)
    if conf.get("lock_ttl") is None:
        conf["lock_ttl"] = board.options.claim_ttl
    return {**conf, "board": kind}


def for_board(board: Any, owner: str | None = None, events: Any = None) -> Coordinator:
    """A connected coordinator on the service of ``board``, whose leases last the board's
    ``lock_ttl`` conf key, else its ``claim_ttl`` (what a conductor promises for its claims)."""
    return connect(board_conf(board), owner=owner, events=events)
