"""What a coordination service must do for locks and limits: one FIFO queue of leases per key.

Every lock and every concurrency limit is the same thing on the service: a *queue* named by its
key (``lb:1234``, ``RebootHost``) whose *entries* are leases. Whoever wants the key joins the
queue's tail; the first ``limit`` live entries hold it (a lock is a limit of one), the others
wait, in the order they joined. An entry lives while its holder renews it: a holder killed,
frozen or cut off stops renewing, the service ends the entry by itself, and the entries behind
it move up. Waiters are therefore served in order (FIFO) and nobody can hold a key past the
lease of an entry that the service still counts.

Each backend keeps this on the service its users already run for jobboards:

* Redis (:mod:`._redis`): a sorted set per key ordered by a counter, entries that expire by the
  server's clock, changes published on a channel.
* ZooKeeper (:mod:`._zookeeper`): ephemeral sequential nodes, which end with their session;
  children watches wake the waiters.
* etcd (:mod:`._etcd`): keys bound to leases, ordered by revision; one watch wakes the waiters.
"""

from __future__ import annotations

import abc
import dataclasses
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from flowengine.jobs.records import ClaimLost

__all__ = ["Entry", "LeaseLost", "Place", "Service", "check_key", "node_name"]

#: Longest key accepted (it becomes a Redis key, a ZooKeeper node name, an etcd key).
MAX_KEY_LENGTH = 200


class LeaseLost(ClaimLost):
    """An entry's lease ended (expired, or removed) while its holder thought it alive."""


def check_key(key: object) -> str:
    """``key`` if it can name a lock or limit; else a ValueError saying what is wrong."""
    if not isinstance(key, str) or not key.strip():
        raise ValueError(f"A lock or limit key must be a non-empty string, not {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"Lock or limit key {key[:40]!r}... is {len(key)} characters long; "
                         f"at most {MAX_KEY_LENGTH} are allowed")
    if any(ord(c) < 32 for c in key):
        raise ValueError(f"Lock or limit key {key!r} holds control characters")
    return key


def node_name(key: str) -> str:
    """``key`` as one path segment (ZooKeeper node, etcd key part): quoted, never ``.``."""
    return urllib.parse.quote(key, safe=":@-_+=,;~") or "%00"


def key_of(node: str) -> str:
    """The key :func:`node_name` made ``node`` of."""
    return urllib.parse.unquote(node)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry of a key's queue, as listed.

    Attributes:
        key: The lock or limit it is for.
        entry: Its id in the queue.
        position: Its place in the queue, from 0 (FIFO).
        limit: How many may hold the key at once, as its holder asked.
        info: Who holds or waits and for what (owner, flow, job, task, host, pid, since).
        expires_in: Seconds until its lease ends unless renewed (None: while its holder's
            session lives, on ZooKeeper).
    """

    key: str
    entry: str
    position: int
    limit: int
    info: Mapping[str, Any]
    expires_in: float | None = None

    @property
    def holding(self) -> bool:
        """Whether it holds the key (it is among the first ``limit``)."""
        return self.position < self.limit


@dataclasses.dataclass(frozen=True)
class Place:
    """Where an entry stands in its queue now.

    Attributes:
        position: Its place, from 0.
        holding: Whether it holds the key.
        holders: The info of the entries ahead of it that hold the key (whom it waits for).
        wake_in: Seconds until an entry ahead of it may end by expiry without the service
            announcing it (None: the service announces every end).
    """

    position: int
    holding: bool
    holders: tuple[Mapping[str, Any], ...] = ()
    wake_in: float | None = None


class Service(metaclass=abc.ABCMeta):
    """Queues of leased entries on one coordination service (see the module).

    Args:
        where: The service's address, for messages (never with a password).
        ttl: Seconds an entry lives without renewal.
    """

    def __init__(self, where: str, ttl: float) -> None:
        self.where = where
        self.ttl = ttl

    @abc.abstractmethod
    def connect(self, on_change: Callable[[str | None], None]) -> None:
        """Connect and start calling ``on_change(key)`` (from a thread of the service's) when
        a key's queue changed; ``on_change(None)`` when any may have (after a reconnection).

        Raises:
            flowengine.exceptions.JobFailure: If the service cannot be reached.
        """

    @abc.abstractmethod
    def join(self, key: str, limit: int, info: Mapping[str, Any]) -> str:
        """Add an entry with a fresh lease at the tail of ``key``'s queue; return its id."""

    @abc.abstractmethod
    def look(self, key: str, entry: str, limit: int) -> Place:
        """Where ``entry`` stands now.

        Raises:
            LeaseLost: If the entry is gone (its lease ended).
        """

    @abc.abstractmethod
    def renew(self, key: str, entry: str) -> None:
        """Renew ``entry``'s lease for another ``ttl`` seconds.

        Raises:
            LeaseLost: If the entry is gone.
            flowengine.exceptions.JobFailure: If the service cannot be asked.
        """

    @abc.abstractmethod
    def leave(self, key: str, entry: str) -> None:
        """Remove ``entry`` (whether it holds or waits); the entries behind move up."""

    @abc.abstractmethod
    def listing(self) -> list[Entry]:
        """Every live entry of every key, by key and then position."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop following changes and disconnect (entries still held then end by lease)."""
