"""Lock and limit queues on ZooKeeper: ephemeral sequential nodes, children watches.

For a jobboard ``path`` (``/taskflow/jobs`` by default) the queues live beside its trash and
entities, under ``<parent>/.coordination``: key ``lb:1234`` is the folder
``<parent>/.coordination/lb:1234`` and each entry an ephemeral sequential node ``e-0000000007``
in it, holding who holds or waits (JSON). ZooKeeper numbers the nodes in the order they were
made (FIFO) and deletes them when their session ends, so an entry's lease is the client's
session: a killed, frozen or cut-off holder loses its entries once ZooKeeper ends the session
(the session timeout is the lease's length, ``ttl``). A renewal is a round trip that finds the
node still there. Waiters set a children watch on their key's folder each time they look.
"""

from __future__ import annotations

import json
import logging
import posixpath
import threading
from collections.abc import Callable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.coordination.service import Entry, LeaseLost, Place, Service, key_of, node_name
from flowengine.utils import kazoo_utils

from kazoo import exceptions as k_exc  # isort: skip  (kazoo_utils names the extra if missing)
from kazoo.client import KazooState

__all__ = ["ZookeeperService"]

LOG = logging.getLogger(__name__)

FOLDER = ".coordination"
PREFIX = "e-"


class ZookeeperService(Service):
    """Queues of leased entries on ZooKeeper (see the module).

    Args:
        conf: A jobboard conf (``hosts``, ``path``, TLS and retry keys).
        ttl: Seconds an entry lives without renewal: the session timeout asked for (the server
            may grant another within its own bounds; :attr:`ttl` is then the one granted).
    """

    def __init__(self, conf: Mapping[str, Any], ttl: float) -> None:
        hosts = str(conf.get("hosts") or kazoo_utils.DEFAULT_HOSTS)
        super().__init__(f"zookeeper at {hosts}", ttl)
        path = posixpath.normpath(str(conf.get("path") or "/taskflow/jobs"))
        self._root = posixpath.join(posixpath.dirname(path), FOLDER)
        self._client = kazoo_utils.make_client({**conf, "timeout": ttl})
        self._on_change: Callable[[str | None], None] = lambda key: None
        self._lost = False
        self._lock = threading.Lock()

    @property
    def root(self) -> str:
        """The folder every key's queue is in."""
        return self._root

    def _folder(self, key: str) -> str:
        return posixpath.join(self._root, node_name(key))

    def connect(self, on_change: Callable[[str | None], None]) -> None:
        """Start the session (its timeout is the entries' lease) and the folder."""
        self._on_change = on_change
        try:
            self._client.start(timeout=max(self.ttl, 10.0))
            self._client.ensure_path(self._root)
        except (self._client.handler.timeout_exception, k_exc.KazooException) as err:
            kazoo_utils.finalize_client(self._client)
            raise exc.JobFailure(f"Cannot reach {self.where} for locks and limits: "
                                 f"{type(err).__name__} {err}".rstrip()) from err
        granted = getattr(self._client, "_session_timeout", None)
        if granted:
            self.ttl = granted / 1000.0
        self._client.add_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        # On kazoo's event thread: never block here.
        if state == KazooState.LOST:
            self._lost = True
            LOG.warning("Locks and limits on %s lost their session: every entry of this "
                        "process ended with it", self.where)
        elif state == KazooState.CONNECTED and self._lost:
            self._lost = False
            self._on_change(None)

    def _watched(self, event: Any) -> None:
        path = getattr(event, "path", None) or ""
        self._on_change(key_of(posixpath.basename(path)) if path else None)

    def _failures(self, action: str, key: str) -> exc.JobFailure:
        return exc.JobFailure(f"Could not {action} the queue of {key!r} on {self.where}")

    def join(self, key: str, limit: int, info: Mapping[str, Any]) -> str:
        """Make an ephemeral sequential node at the tail of ``key``'s queue; its name."""
        data = json.dumps({**info, "limit": limit, "key": key}).encode("utf-8")
        try:
            made = self._client.create(posixpath.join(self._folder(key), PREFIX), data,
                                       ephemeral=True, sequence=True, makepath=True)
        except (self._client.handler.timeout_exception, k_exc.KazooException) as err:
            raise self._failures("join", key) from err
        return str(posixpath.basename(made))

    def _children(self, key: str, watch: bool) -> list[str]:
        try:
            children = self._client.get_children(self._folder(key),
                                                 watch=self._watched if watch else None)
        except k_exc.NoNodeError:
            return []
        return sorted(c for c in children if c.startswith(PREFIX))

    def look(self, key: str, entry: str, limit: int) -> Place:
        """Where ``entry`` stands; a watch on the queue wakes the next look."""
        try:
            queue = self._children(key, watch=True)
            if entry not in queue:
                raise LeaseLost(f"The entry of {key!r} on {self.where} ended: its session did")
            position = queue.index(entry)
            holders = []
            for ahead in queue[:min(position, limit)]:
                try:
                    raw, _stat = self._client.get(posixpath.join(self._folder(key), ahead))
                except k_exc.NoNodeError:
                    continue  # left meanwhile: the watch says so
                holders.append(_decode(raw))
        except (self._client.handler.timeout_exception, k_exc.KazooException) as err:
            raise self._failures("read", key) from err
        return Place(position, position < limit, tuple(holders))

    def renew(self, key: str, entry: str) -> None:
        """Ask the server whether the node is still there (a round trip keeps the session)."""
        try:
            found = self._client.exists(posixpath.join(self._folder(key), entry))
        except (self._client.handler.timeout_exception, k_exc.KazooException) as err:
            raise self._failures("renew", key) from err
        if found is None:
            raise LeaseLost(f"The entry of {key!r} on {self.where} ended: its session did")

    def leave(self, key: str, entry: str) -> None:
        """Delete the node, and the key's folder once it is empty."""
        try:
            self._client.delete(posixpath.join(self._folder(key), entry))
        except k_exc.NoNodeError:
            pass
        except (self._client.handler.timeout_exception, k_exc.KazooException) as err:
            raise self._failures("leave", key) from err
        try:
            self._client.delete(self._folder(key))
        except (k_exc.NotEmptyError, k_exc.NoNodeError):
            pass  # others still queue there, or another leaver deleted it
        except (self._client.handler.timeout_exception, k_exc.KazooException) as err:
            LOG.debug("Could not delete the empty queue of %r: %s", key, err)

    def listing(self) -> list[Entry]:
        """Every live entry, by key and position."""
        found: list[Entry] = []
        try:
            folders = sorted(self._client.get_children(self._root))
            for folder in folders:
                key = key_of(folder)
                for position, child in enumerate(self._children(key, watch=False)):
                    try:
                        raw, _stat = self._client.get(posixpath.join(self._root, folder, child))
                    except k_exc.NoNodeError:
                        continue
                    info = _decode(raw)
                    found.append(Entry(key, child, position, int(info.get("limit") or 1),
                                       info))
        except k_exc.NoNodeError:
            return found
        except (self._client.handler.timeout_exception, k_exc.KazooException) as err:
            raise exc.JobFailure(f"Could not list the locks on {self.where}: {err}") from err
        return found

    def close(self) -> None:
        """End the session: this process's entries go at once."""
        self._client.remove_listener(self._on_state)
        kazoo_utils.finalize_client(self._client)


def _decode(raw: bytes | None) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
