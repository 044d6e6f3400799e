"""The worker-based engine's options as one typed, frozen record, validated where it is built.

``engines.load(flow, engine="worker-based", **options)`` hands the engine every option the
action engine does not know itself; :meth:`WorkerEngineOptions.from_mapping` turns them into
this record. A misspelt or wrongly typed option is an error naming it; ``None`` means the
default, as in TaskFlow.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from flowengine.engines.options import as_bool, unknown_options
from flowengine.worker_based import backoff as bo
from flowengine.worker_based import client as bc
from flowengine.worker_based import dead_letter_keeping as keeping
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker.connection import TransportSpec, check_transport

_WHAT = "Worker-based engine option"


def _error(name: str, value: Any, wanted: str) -> ValueError:
    return ValueError(f"{_WHAT} {name!r} must be {wanted}, not {value!r}")


def _seconds(name: str, value: Any, optional: bool) -> float | None:
    if value in ("", "none", "None") and optional:
        return None
    if isinstance(value, bool):
        raise _error(name, value, "a number of seconds")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise _error(name, value, "a number of seconds") from None
    if seconds <= 0:
        raise _error(name, value, "a positive number of seconds")
    return seconds


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise _error(name, value, "a whole number of at least 1")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise _error(name, value, "a whole number of at least 1") from None
    if number < 1 or number != float(value):
        raise _error(name, value, "a whole number of at least 1")
    return number


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _error(name, value, "a non-empty string")
    return value


def _secret_text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:  # the value is a secret: never echoed
        raise ValueError(f"{_WHAT} {name!r} must be a non-empty string, not a "
                         f"{type(value).__name__}")
    return value


def _topics(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(t for t in value.split(",") if t)
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(
            isinstance(t, str) and t for t in value):
        raise _error(name, value, "a list of topic names (or one comma-separated string)")
    return tuple(value)


def _mapping(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _error(name, value, "a mapping")
    return dict(value)


def _port(name: str, value: Any) -> int | None:
    if value == "":
        return None
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise _error(name, value, "a port number") from None
    if not 0 <= port <= 65535:
        raise _error(name, value, "a port number from 0 to 65535")
    return port


def _time_limits(name: str, value: Any) -> dict[str, float]:
    limits = _mapping(name, value)
    return {str(task): float(_seconds(f"{name}[{task!r}]", seconds, optional=False) or 0)
            for task, seconds in limits.items()}


def _callable(name: str, value: Any) -> Any:
    if not callable(value):
        raise ValueError(f"{_WHAT} {name!r} must be callable (got {type(value).__name__})")
    return value


def _transport(name: str, value: Any) -> TransportSpec | None:
    try:
        return check_transport(value)
    except TypeError:
        raise _error(name, value, "a transport name or a kombu Transport class") from None


def _retry(name: str, value: Any) -> bo.RetryOptions:
    try:
        return bo.RetryOptions.from_options(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{_WHAT} {name!r}: {err}") from err


@dataclasses.dataclass(frozen=True)
class WorkerEngineOptions:
    """What a worker-based engine is configured with (see :doc:`workers`)."""

    exchange: str = "default"
    url: str | None = None
    topics: tuple[str, ...] = ()
    transport: TransportSpec | None = None
    transport_options: Mapping[str, Any] | None = None
    retry_options: bo.RetryOptions | None = None
    transition_timeout: float | None = pr.REQUEST_TIMEOUT
    worker_expiry: float | None = pr.EXPIRES_AFTER
    taskflow_compat: bool = False
    lease_timeout: float | None = ext.DEFAULT_LEASE_TIMEOUT
    heartbeat_interval: float = ext.DEFAULT_HEARTBEAT_INTERVAL
    max_attempts: int = ext.DEFAULT_MAX_ATTEMPTS
    time_limits: Mapping[str, float] | None = None
    unserved_timeout: float | None = ext.DEFAULT_UNSERVED_TIMEOUT
    pickup_timeout: float | None = ext.DEFAULT_PICKUP_TIMEOUT
    #: Short tasks reply with their outcome alone (None: where the broker hands back at once
    #: what a dead or frozen worker held, see the executor).
    quiet_start: bool | None = None
    dead_letter_ttl: float = keeping.DEFAULT_TTL
    connect_timeout: float = bc.CONSUMER_START_TIMEOUT
    events: bool = True
    metrics: bool = False
    metrics_port: int | None = None
    #: Monotonic seconds of request expiries, leases, time limits and silent workers (the
    #: executor's clock); tests inject one to move them along without sleeping.
    clock: Callable[[], float] = time.monotonic
    # Secrets: kept out of the repr (and so out of logs and errors).
    signing_key: str | None = dataclasses.field(default=None, repr=False)
    signing_key_file: str | None = None

    def __post_init__(self) -> None:
        if self.lease_timeout is not None and self.lease_timeout <= self.heartbeat_interval:
            raise ValueError(f"{_WHAT} 'lease_timeout' ({self.lease_timeout}s) must be longer "
                             f"than 'heartbeat_interval' ({self.heartbeat_interval}s)")

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> WorkerEngineOptions:
        """Validate ``options``; ``None`` values mean the default.

        Raises:
            ValueError: An unknown option (with the nearest known name), or a bad value;
                the message names the option.
        """
        unknown = set(options) - OPTION_NAMES
        if unknown:
            raise unknown_options("worker-based", unknown, OPTION_NAMES)
        values: dict[str, Any] = {}
        for name, value in options.items():
            if value is None and name not in _NONE_MEANS_NONE:
                continue  # the default, as in TaskFlow
            values[name] = _CONVERT[name](name, value) if value is not None else None
        return cls(**values)


#: The names of :class:`WorkerEngineOptions`' fields.
OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(WorkerEngineOptions))


_NONE_MEANS_NONE = frozenset({"transition_timeout", "worker_expiry", "lease_timeout",
                              "unserved_timeout", "pickup_timeout", "quiet_start"})
_CONVERT: dict[str, Callable[[str, Any], Any]] = {
    "exchange": _text,
    "url": _text,
    "topics": _topics,
    "transport": _transport,
    "transport_options": _mapping,
    "retry_options": _retry,
    "transition_timeout": lambda n, v: _seconds(n, v, optional=True),
    "worker_expiry": lambda n, v: _seconds(n, v, optional=True),
    "taskflow_compat": as_bool,
    "lease_timeout": lambda n, v: _seconds(n, v, optional=True),
    "heartbeat_interval": lambda n, v: _seconds(n, v, optional=False),
    "max_attempts": _positive_int,
    "time_limits": _time_limits,
    "unserved_timeout": lambda n, v: _seconds(n, v, optional=True),
    "pickup_timeout": lambda n, v: _seconds(n, v, optional=True),
    "quiet_start": as_bool,
    "dead_letter_ttl": lambda n, v: _seconds(n, v, optional=False),
    "connect_timeout": lambda n, v: _seconds(n, v, optional=False),
    "events": as_bool,
    "metrics": as_bool,
    "metrics_port": _port,
    "clock": _callable,
    "signing_key": _secret_text,
    "signing_key_file": _text,
}
