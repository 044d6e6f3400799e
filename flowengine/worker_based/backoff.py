"""Retrying broker operations: capped, jittered exponential backoff with bounded logging."""

from __future__ import annotations

import dataclasses
import logging
import random
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from flowengine.exceptions import ExecutionFailure

LOG = logging.getLogger(__name__)

#: Retry log lines: the first few attempts, then every Nth.
_LOG_FIRST, _LOG_EVERY = 3, 10
#: AMQP reply codes of a refused login, permission or virtual host (ACCESS_REFUSED, NOT_ALLOWED).
_AMQP_REFUSED = frozenset({403, 530})
#: Resolver answers that a name does not exist (EAI_NODATA is not on every platform).
_NO_SUCH_HOST = frozenset(code for code in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None))
                          if code is not None)
#: Seconds between two looks at the broker while a retry sleeps (see :class:`Backoff`'s probe).
PROBE_EVERY = 1.0


class RetryAbandoned(Exception):
    """A retry sequence was abandoned because its owner is stopping."""


class RetryDeadline(Exception):
    """Waiting for the next retry would pass the retry sequence's deadline."""


class BrokerRefused(Exception):
    """The broker refused the credentials (or the virtual host), or its host name does not
    exist: retrying cannot help.

    Not a ``ConnectionError``: kombu retries those, and this one must end the retrying.
    """


class BrokerUnreachable(ExecutionFailure):
    """No connection to the broker within the time an engine waits for one.

    Args:
        uri: The broker (password masked).
        timeout: Seconds waited.
        attempts: The consumer's connection attempts (their count and last error), if known.
    """

    def __init__(self, uri: str, timeout: float, attempts: Backoff | None) -> None:
        failed = attempts.attempt if attempts is not None else 0
        last = attempts.last_error if attempts is not None else None
        why = f"; the last attempt failed with {type(last).__name__}: {last}" if last else ""
        super().__init__(f"The broker {uri} is unreachable: no connection within {timeout:g}s "
                         f"({failed} failed attempt(s){why})")
        self.uri = uri


def refusal(err: BaseException | None) -> BaseException | None:
    """The error in ``err``'s chain saying the broker refused the credentials, if any.

    Kombu files both under its retried connection or channel errors: AMQP (py-amqp) raises
    ``AccessRefused`` (reply code 403; ``NotAllowed``, 530, for a virtual host), Redis
    (redis-py) ``AuthenticationError``. Matched by reply code and class name, since only
    ``proxy`` imports the transports.
    """
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if getattr(err, "reply_code", None) in _AMQP_REFUSED or any(
                cls.__name__ == "AuthenticationError" for cls in type(err).__mro__):
            return err
        err = err.__cause__ or err.__context__
    return None


def unknown_host(err: BaseException | None) -> socket.gaierror | None:
    """The error in ``err``'s chain saying the broker's host name does not exist, if any.

    Only the resolver's definite answers (no such name, no address for it): a temporary
    failure (``EAI_AGAIN``, the DNS server did not answer) is an outage like any other.
    """
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, socket.gaierror) and err.errno in _NO_SUCH_HOST:
            return err
        err = err.__cause__ or err.__context__
    return None


def _host(where: str) -> str:
    """The host name in a (masked) broker URL, or the URL itself if it has none."""
    try:
        return urllib.parse.urlsplit(where.split(";")[0]).hostname or where
    except ValueError:
        return where


@dataclasses.dataclass(frozen=True)
class RetryOptions:
    """How to retry connecting, consuming and publishing.

    The n-th retry (from 0) sleeps ``min(interval_max, interval_start * multiplier**n)`` reduced
    by up to ``jitter`` (a fraction), so a fleet that lost its broker does not reconnect in step.
    ``max_retries=None`` retries until the owner stops.
    """

    interval_start: float = 0.2
    interval_max: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_retries: int | None = None

    def __post_init__(self) -> None:
        for name in ("interval_start", "interval_max", "multiplier", "jitter"):
            if getattr(self, name) < 0:
                raise ValueError(f"retry_options '{name}' must be >= 0, got {getattr(self, name)}")
        if self.jitter > 1 or self.multiplier < 1:
            raise ValueError(f"retry_options need 0 <= jitter <= 1 and multiplier >= 1: {self}")
        if self.max_retries is not None and self.max_retries < 0:
            raise ValueError(f"retry_options 'max_retries' must be >= 0, got {self.max_retries}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | RetryOptions | None) -> RetryOptions:
        """Build from a ``retry_options`` dict; TaskFlow's keys are accepted.

        TaskFlow's ``interval_step`` (a linear increment) is accepted and ignored: the interval
        grows by ``multiplier`` instead.

        Raises:
            ValueError: An unknown key, or a value out of range.
        """
        if isinstance(options, RetryOptions):
            return options
        values = dict(options or {})
        values.pop("interval_step", None)
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"Unknown retry_options: {', '.join(sorted(unknown))}")
        converted: dict[str, Any] = {k: float(v) for k, v in values.items() if k != "max_retries"}
        if values.get("max_retries") is not None:
            converted["max_retries"] = int(values["max_retries"])
        return cls(**converted)

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to sleep before retry number ``attempt`` (from 0)."""
        base = min(self.interval_max, self.interval_start * self.multiplier ** min(attempt, 64))
        return base * (1.0 - self.jitter * rand())


class Backoff:
    """One retry sequence; also callable as a kombu ``errback(exc, interval)``.

    Each call logs (the first attempts, then every tenth), then sleeps the next delay unless
    ``stop`` is set first.

    Args:
        options: The retry policy.
        what: What is being retried, for log lines ("Publishing").
        where: Where (a masked URL), for log lines.
        stop: Set when retrying should end.
        deadline: ``time.monotonic()`` past which no retry starts (None: no deadline).
        every: Log every failed attempt (a consumer that is not connected says so each time:
            nothing else shows it is not serving), not only the first few.
        probe: Whether the broker accepts connections again (see
            :func:`~flowengine.worker_based.broker.connection.reachability`; None: no look).
            A sleep longer than :data:`PROBE_EVERY` looks every :data:`PROBE_EVERY` seconds,
            and ends early when the broker, seen away by an earlier look, is back: the backoff
            spares a broker that is away, but once it returns the retry goes within about a
            second rather than after the rest of a sleep that may have grown to many seconds
            (a worker's outcome would then arrive after its engine's lease ran out). A broker
            that accepts connections but fails the attempts (never seen away) is not retried
            sooner than the backoff says, nor looked at again until the next sleep.
    """

    def __init__(self, options: RetryOptions, what: str, where: str, stop: threading.Event,
                 deadline: float | None = None, every: bool = False,
                 probe: Callable[[], bool] | None = None) -> None:
        self._options, self._what, self._where, self._stop = options, what, where, stop
        self._deadline, self._every, self._probe = deadline, every, probe
        #: An earlier look found the broker away (so finding it back ends a sleep).
        self._seen_away = False
        self.started = time.monotonic()
        self.attempt = 0
        #: The error of the last failed attempt (None: none failed yet).
        self.last_error: BaseException | None = None

    @property
    def elapsed(self) -> float:
        """Seconds since the sequence began."""
        return time.monotonic() - self.started

    @property
    def exhausted(self) -> bool:
        """Whether ``max_retries`` retries have been made."""
        limit = self._options.max_retries
        return limit is not None and self.attempt >= limit

    def __call__(self, exc: BaseException, _interval: float = 0.0) -> None:
        """Record a failed attempt and sleep before the next.

        Raises:
            BrokerRefused: The broker refused the credentials: no retry can succeed.
            RetryAbandoned: ``stop`` was set (before or while sleeping).
            RetryDeadline: The next retry would start past the deadline.
        """
        self.last_error = exc
        refused = refusal(exc)
        if refused is not None:
            raise BrokerRefused(f"{self._what} on {self._where} was refused by the broker "
                                f"({type(refused).__name__}: {refused}); not retrying") from exc
        unknown = unknown_host(exc)
        if unknown is not None:
            raise BrokerRefused(f"{self._what} on {self._where} failed: the host name "
                                f"{_host(self._where)!r} does not resolve ({unknown.strerror}); "
                                f"not retrying") from exc
        delay = self._options.delay(self.attempt)
        # A transport may know its outage better (flowengine-fs: a full or read-only disk, which
        # is cheap to look at again and which it has logged once already).
        delay = min(delay, getattr(exc, "retry_interval_max", delay))
        if self._deadline is not None and time.monotonic() + delay > self._deadline:
            outage = getattr(exc, "outage", "the broker is unreachable (outage)")
            raise RetryDeadline(
                f"{self._what} on {self._where} failed for {self.elapsed:.1f}s over "
                f"{self.attempt + 1} attempt(s), the most it may wait; {outage}: {exc}"
            ) from exc
        self.attempt += 1
        if getattr(exc, "reported", False):
            LOG.debug("%s on %s failed (attempt %d): %s; retrying in %.2fs",
                      self._what, self._where, self.attempt, exc, delay)
        elif self._every or self.attempt <= _LOG_FIRST or self.attempt % _LOG_EVERY == 0:
            LOG.warning(
                "%s on %s failed (attempt %d): %s; retrying in %.2fs",
                self._what, self._where, self.attempt, _reason(exc), delay,
            )  # fmt: skip
        if self._sleep(delay):
            raise RetryAbandoned(f"{self._what} on {self._where} abandoned: stopping")

    def _sleep(self, delay: float) -> bool:
        """Sleep ``delay`` seconds, less if the probe finds the broker back; True if ``stop``
        was set meanwhile."""
        if self._probe is None or delay <= PROBE_EVERY:
            return self._stop.wait(delay)
        end = time.monotonic() + delay
        while (left := end - time.monotonic()) > 0:
            if self._stop.wait(min(PROBE_EVERY, left)):
                return True
            if time.monotonic() >= end:
                break
            if not self._probe():
                self._seen_away = True
                continue
            if not self._seen_away:
                # It accepts connections yet failed the attempt (starting, refusing, nacking):
                # no more looks this sleep, which would only fill its log with closed
                # connections.
                return self._stop.wait(max(0.0, end - time.monotonic()))
            self._seen_away = False
            LOG.debug("%s on %s: the broker accepts connections again; retrying now",
                      self._what, self._where)
            break
        return self._stop.is_set()


def _reason(exc: BaseException) -> str:
    """``exc`` as a log line shows it: its text, or its type when it has none (a timeout)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
