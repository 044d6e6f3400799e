"""Lock and limit queues on etcd (through etcd3gw): keys bound to leases, one watch.

For a jobboard ``path`` (``jobboard`` by default) the queues live under
``/taskflow/.coordination/<path>/``, beside the board's trash and entities: key ``lb:1234`` is the
prefix ``.../lb:1234/`` and each entry a key there named after its own lease (hex), holding who
holds or waits (JSON). Entries are never rewritten, so their revision is the order they were
made in (FIFO); etcd deletes an entry when its lease runs out, so a killed, frozen or cut-off
holder loses it ``ttl`` seconds after its last renewal (a lease keep-alive). One watch on the
whole prefix wakes the waiters.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.coordination.service import Entry, LeaseLost, Place, Service, key_of, node_name
from flowengine.jobs.backends import _etcd_keys as keys
from flowengine.jobs.backends._etcd_store import EtcdStore, make_client
from flowengine.jobs.backends._etcd_watch import Events, PrefixWatch

__all__ = ["EtcdService"]

LOG = logging.getLogger(__name__)

ROOT = "/taskflow/.coordination"
#: etcd refuses shorter leases (one and a half election timeouts, by default).
MIN_TTL = 2


class EtcdService(Service):
    """Queues of leased entries on etcd (see the module).

    Args:
        conf: A jobboard conf (``host``, ``port``, ``protocol``, TLS keys, ``timeout``,
            ``api_path``, ``path``).
        ttl: Seconds an entry lives without renewal (whole seconds, rounded up, at least 2).
    """

    def __init__(self, conf: Mapping[str, Any], ttl: float) -> None:
        super().__init__(f"etcd at {conf.get('host') or 'localhost'}:{conf.get('port') or 2379}",
                         float(max(MIN_TTL, math.ceil(ttl))))
        path = str(conf.get("path") or "jobboard").strip("/")
        self._prefix = f"{ROOT}/{path}/"
        self._conf = dict(conf)
        self._store: EtcdStore | None = None
        self._watch: PrefixWatch | None = None
        self._on_change: Callable[[str | None], None] = lambda key: None

    def _folder(self, key: str) -> str:
        return f"{self._prefix}{node_name(key)}/"

    def connect(self, on_change: Callable[[str | None], None]) -> None:
        """Check etcd answers and start the watch."""
        self._on_change = on_change
        client = make_client(self._conf)
        self._store = EtcdStore(client, f"locks on {self.where}")
        self._watch = PrefixWatch(client, self._prefix, self._reload, self._on_events,
                                  "coordination")
        try:
            self._watch.start()
        except exc.JobFailure:
            self._store, self._watch = None, None
            raise

    def _require(self) -> EtcdStore:
        if self._store is None:
            raise exc.JobFailure(f"Locks and limits on {self.where} are not connected")
        return self._store

    def _reload(self) -> int:
        _, revision = self._require().range(self._prefix, "read the queues", keys_only=True)
        self._on_change(None)
        return revision

    def _on_events(self, events: Events) -> None:
        for key in {kv.key[len(self._prefix):].partition("/")[0] for _kind, kv in events}:
            self._on_change(key_of(key))

    def _queue(self, key: str) -> list[keys.KV]:
        found, _ = self._require().range(self._folder(key), f"read the queue of {key!r}")
        return sorted(found, key=lambda kv: kv.mod_revision)

    def join(self, key: str, limit: int, info: Mapping[str, Any]) -> str:
        """Put an entry bound to a new lease at the tail of ``key``'s queue; its id."""
        store = self._require()
        what = f"join the queue of {key!r}"
        lease = store.grant(self.ttl, what)
        entry = f"{lease:x}"
        value = json.dumps({**info, "limit": limit, "key": key}).encode("utf-8")
        store.txn([], [keys.put(self._folder(key) + entry, value, lease)], what)
        return entry

    def look(self, key: str, entry: str, limit: int) -> Place:
        """Where ``entry`` stands (raises LeaseLost if it is gone)."""
        queue = self._queue(key)
        names = [kv.key.rpartition("/")[2] for kv in queue]
        if entry not in names:
            raise LeaseLost(f"The entry of {key!r} on {self.where} ended: its lease expired")
        position = names.index(entry)
        holders = tuple(_decode(kv.value) for kv in queue[:min(position, limit)])
        return Place(position, position < limit, holders)

    def renew(self, key: str, entry: str) -> None:
        """Keep the entry's lease alive (raises LeaseLost if it had run out)."""
        if self._require().refresh(int(entry, 16), f"renew the entry of {key!r}") <= 0:
            raise LeaseLost(f"The entry of {key!r} on {self.where} ended: its lease expired")

    def leave(self, key: str, entry: str) -> None:
        """Delete the entry by ending its lease."""
        store = self._require()
        store.txn([], [keys.delete(self._folder(key) + entry)], f"leave the queue of {key!r}")
        store.revoke(int(entry, 16))

    def listing(self) -> list[Entry]:
        """Every live entry, by key and position."""
        found, _ = self._require().range(self._prefix, "list the queues")
        by_key: dict[str, list[keys.KV]] = {}
        for kv in found:
            folder, _, _name = kv.key[len(self._prefix):].partition("/")
            by_key.setdefault(key_of(folder), []).append(kv)
        entries: list[Entry] = []
        for key in sorted(by_key):
            queue = sorted(by_key[key], key=lambda kv: kv.mod_revision)
            for position, kv in enumerate(queue):
                info = _decode(kv.value)
                entries.append(Entry(key, kv.key.rpartition("/")[2], position,
                                     int(info.get("limit") or 1), info,
                                     float(self._require().time_to_live(kv.lease, "list"))
                                     if kv.lease else None))
        return entries

    def close(self) -> None:
        """Stop the watch (entries still held end with their leases)."""
        watch, self._watch, store, self._store = self._watch, None, self._store, None
        if watch is not None:
            watch.stop()
        if store is not None:
            store.client.session.close()


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
