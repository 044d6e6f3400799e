"""A pool of kombu producers that stay bound to their connection and channel between uses.

Kombu's ``ProducerPool`` gives a producer's connection back to a second pool and drops its
channel on every release, so every acquire re-binds the producer (copying its exchange), takes a
connection from that pool again and resolves a new channel promise: about a tenth of an engine's
CPU per message. Here each producer keeps its own connection (a clone of the pool's) and channel
for as long as it works; one that raised is closed and replaced by a new one on a later acquire.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from types import TracebackType
from typing import Any

import kombu

LOG = logging.getLogger(__name__)

#: Every pool of this process, for the fork handler below.
_POOLS: weakref.WeakSet[ProducerPool] = weakref.WeakSet()


class ProducerPool:
    """At most ``limit`` producers at once, each on its own connection; thread-safe.

    A producer connects as it is made, trying each node of a failover list once, so a broker
    that is away fails :meth:`acquire` at once, inside the caller's retries (which decide how
    long to keep trying), not after retries of kombu's own.

    Args:
        connection: Each producer publishes over a clone of it.
        limit: Most producers in use at once; :meth:`acquire` blocks while all are.
    """

    def __init__(self, connection: kombu.Connection, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"A producer pool needs a limit of at least 1, not {limit}")
        self._connection, self._limit = connection, limit
        self._reset()
        self._closed = False
        _POOLS.add(self)

    def _reset(self) -> None:
        self._lock = threading.Condition(threading.Lock())
        self._idle: list[kombu.Producer] = []  # last given back is taken first: warm and alive
        self._count = 0  # producers that exist, idle or in use
        self._waiting = 0  # threads blocked in _take

    @property
    def size(self) -> int:
        """Producers that exist now, idle or in use."""
        return self._count

    @property
    def idle(self) -> int:
        """Producers waiting to be used."""
        return len(self._idle)

    def acquire(self) -> _Lease:
        """A producer for one ``with`` block, given back when it ends.

        A producer whose block raised is closed instead: its connection or channel may be
        broken (an AMQP channel error closes the channel), and a later acquire builds a new one.
        """
        return _Lease(self, self._take())

    def close(self) -> None:
        """Close the idle producers now and each producer in use when it is given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._lock.notify_all()
        for producer in idle:
            _close(producer)

    def _take(self) -> kombu.Producer:
        with self._lock:
            while not self._idle and self._count >= self._limit and not self._closed:
                self._waiting += 1
                try:
                    self._lock.wait()
                finally:
                    self._waiting -= 1
            if self._idle:
                return self._idle.pop()
            self._count += 1
        connection = self._connection.clone()
        try:
            # Connected here, each node of a failover list tried once. Left to itself, kombu
            # connects a producer's channel when first used, retrying on its own (about 6 s
            # against a broker that is away) beneath the caller's own retrying: a publish's
            # backoff (its retry_options), or a one-attempt publish that must fail at once.
            connection.ensure_connection(max_retries=max(0, len(connection.alt) - 1),
                                         interval_start=0, interval_step=0, interval_max=0)
            return kombu.Producer(connection)
        except BaseException:
            self._forget_one()
            with contextlib.suppress(Exception):
                connection.release()
            raise

    def _give_back(self, producer: kombu.Producer) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(producer)
                if self._waiting:
                    self._lock.notify()
                return
        self._discard(producer)

    def _discard(self, producer: kombu.Producer) -> None:
        self._forget_one()
        _close(producer)

    def _forget_one(self) -> None:
        with self._lock:
            self._count = max(0, self._count - 1)
            if self._waiting:
                self._lock.notify()


class _Lease:
    """The ``with`` block of :meth:`ProducerPool.acquire`."""

    __slots__ = ("_pool", "_producer")

    def __init__(self, pool: ProducerPool, producer: kombu.Producer) -> None:
        self._pool, self._producer = pool, producer

    def __enter__(self) -> kombu.Producer:
        return self._producer

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self._pool._give_back(self._producer)
        else:
            self._pool._discard(self._producer)


def _forget_after_fork() -> None:
    # A child must not talk over its parent's sockets (nor wait on a lock another parent thread
    # held at the fork): its pools start empty, and the parent's producers are dropped unclosed.
    for pool in list(_POOLS):
        pool._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _close(producer: kombu.Producer) -> None:
    connection: Any = producer.connection
    if connection is None:
        return
    try:
        connection.release()
    except Exception as err:  # closing a broken connection may fail; it is gone either way
        LOG.debug("Closing a publishing connection failed: %s", err)
