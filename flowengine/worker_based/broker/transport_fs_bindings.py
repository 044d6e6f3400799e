"""Exchanges and bindings of the flowengine-fs transport, kept on disk.

Each exchange is one JSON file under ``exchanges/`` holding its type and binding table, so
every process routes alike whoever declared what. Writers serialise on a lock file and replace
the table whole; readers cache it by inode, mtime and size (every write is a new file).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from kombu.exceptions import ChannelError
from kombu.transport import virtual

from flowengine.worker_based.broker import transport_fs_disk as fsdisk
from flowengine.worker_based.broker import transport_fs_files as files

__all__ = ["BindingChannel", "safe_name"]


@functools.lru_cache(maxsize=1024)  # called several times per message, for a few names
def safe_name(name: str) -> str:
    """``name`` as a file name (percent-quoted; a leading dot quoted too)."""
    if not name:
        raise ChannelError("flowengine-fs: queue and exchange names must not be empty")
    quoted = quote(name, safe="-_.@")
    return "%2E" + quoted[1:] if quoted.startswith(".") else quoted


class BindingChannel(virtual.Channel):
    """The binding-table half of the flowengine-fs channel (the channel sets the folders)."""

    _root: str
    _tmp: str
    _disk: Any
    _tables: dict[str, tuple[tuple[int, int, int], dict[str, Any]]]

    def _table_path(self, exchange: str) -> str:
        return os.path.join(self._root, "exchanges", f"{safe_name(exchange)}.json")

    def _read_table(self, exchange: str) -> dict[str, Any]:
        path = self._table_path(exchange)
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return {"type": None, "table": []}
        key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)  # every write is a new file
        cached = self._tables.get(exchange)
        if cached is not None and cached[0] == key:
            return cached[1]
        data = json.loads(files.read(path))
        self._tables[exchange] = (key, data)
        return data

    def _update_table(
        self,
        exchange: str,
        add: tuple[str, str, str] | None,
        remove: Any = None,
        exchange_type: str | None = None,
    ) -> None:
        path = self._table_path(exchange)
        # On a read-only disk redeclaring what is there already (consumers do, every few
        # seconds) reads the table under the lock and goes on working.
        with self._disk.guard(), fsdisk.open_lock(path[: -len(".json")] + ".lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # writers serialise; readers see whole files
            self._write_table(exchange, path, add, remove, exchange_type)

    def _write_table(self, exchange: str, path: str, add: tuple[str, str, str] | None,
                     remove: Any, exchange_type: str | None) -> None:
        data = self._read_table(exchange)
        rows = [list(row) for row in data["table"]]
        if remove is not None and list(remove) in rows:
            rows.remove(list(remove))
        if add is not None and list(add) not in rows:
            rows.append(list(add))
        new = {"type": data["type"] or exchange_type, "table": rows}
        if new == data:
            return
        tmp = Path(self._tmp, f"{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}")
        try:
            tmp.write_text(json.dumps(new))
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):  # no half-written table left in tmp/
                tmp.unlink()
            raise

    def exchange_declare(
        self,
        exchange: Any = None,
        type: Any = "direct",
        durable: Any = False,
        auto_delete: Any = False,
        arguments: Any = None,
        nowait: Any = False,
        passive: Any = False,
    ) -> Any:
        super().exchange_declare(
            exchange, type, durable, auto_delete, arguments, nowait=nowait, passive=passive
        )
        if exchange and not passive:
            # Recorded on disk so a process that never declared it still routes by its type.
            self._update_table(exchange, None, exchange_type=type or "direct")

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        self._update_table(exchange, (routing_key or "", pattern or "", queue or ""))

    def queue_unbind(
        self,
        queue: str,
        exchange: str | None = None,
        routing_key: str = "",
        arguments: Any = None,
        **kwargs: Any,
    ) -> None:
        super().queue_unbind(queue, exchange, routing_key, arguments, **kwargs)
        if exchange:
            meta = self.typeof(exchange).prepare_bind(queue, exchange, routing_key, arguments)
            self._update_table(exchange, None, remove=[m or "" for m in meta])

    def queues(self, prefix: str = "") -> list[str]:
        """The queues bound to any exchange whose names start with ``prefix`` (from the
        exchanges' tables): what ``flowengine topics`` lists, and where an engine that finds
        no worker looks for its topics on other exchanges."""
        try:
            entries = os.listdir(os.path.join(self._root, "exchanges"))
        except FileNotFoundError:
            return []
        names = {row[2] for entry in entries if entry.endswith(".json")
                 for row in self.get_table(unquote(entry[: -len(".json")]))}
        return sorted(name for name in names if name.startswith(prefix))

    def get_table(self, exchange: str) -> list[tuple[str, str, str]]:
        return [tuple(row) for row in self._read_table(exchange)["table"]]  # type: ignore[misc]

    def typeof(self, exchange: str, default: str = "direct") -> Any:
        if exchange not in self.state.exchanges:
            stored = None
            if exchange:
                # A declared type never changes, so a table read before will do (bindings do
                # change: get_table reads those afresh for every message).
                cached = self._tables.get(exchange)
                stored = cached[1]["type"] if cached else None
                stored = stored or self._read_table(exchange)["type"]
            return self.exchange_types[stored or default]
        return super().typeof(exchange, default)
