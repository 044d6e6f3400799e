"""flowengine's filesystem transport for kombu: processes on one machine, no server.

URL ``flowengine-fs://`` (import this module first, which registers it with kombu); transport
options ``data_folder`` (default: a per-user folder in the system temp directory),
``polling_interval`` (seconds, default 0.005), ``fsync`` (default False) and ``recover_interval``
(seconds between scans for messages claimed by dead processes, default 30).

Layout under ``data_folder``::

    queues/<queue>/<stamp>.msg           ready messages, oldest name first
    claimed/<pid>/<queue>/<stamp>.msg    delivered to process <pid>, not yet acknowledged
    exchanges/<exchange>.json            the exchange's type and bindings (shared by all processes)
    tmp/                                 messages being written
    bad/<queue>/                         files that could not be decoded, kept for inspection

Unlike kombu's stock ``filesystem`` transport: a message is written to ``tmp/`` and renamed into its
queue, so a reader never sees half a file; names sort in send order (a per-process strictly
increasing nanosecond stamp plus a sequence number), so FIFO holds within a sender even in one
millisecond; a consumer claims a message by renaming it into its own ``claimed/`` folder, which
exactly one of several competing processes can do, and deletes it only on ack (a reject with
requeue, a closed channel or a dead owner renames it back, marked redelivered as AMQP brokers
mark it); an undecodable file is moved to ``bad/`` and logged instead of stopping the consumer.
A message published with ``expiration`` is dropped once that many seconds have passed, as AMQP
brokers do. POSIX only (rename, ``flock``).
Queues, claims and the on-disk binding table make this a whole transport, so the module is
longer than most (kombu's stock filesystem transport is the same size).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import itertools
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from queue import Empty
from typing import Any
from urllib.parse import quote, unquote

import kombu.transport
from kombu.exceptions import ChannelError
from kombu.transport import virtual
from kombu.utils import json as kombu_json

import flowengine

LOG = logging.getLogger(__name__)

TRANSPORT_NAME = "flowengine-fs"
DEFAULT_POLLING_INTERVAL = 0.005
#: Seconds between scans for messages claimed by processes that have died.
DEFAULT_RECOVER_INTERVAL = 30.0
kombu.transport.TRANSPORT_ALIASES.setdefault(TRANSPORT_NAME, f"{__name__}:Transport")


def default_data_folder() -> str:
    """Where processes that give no ``data_folder`` meet: one folder per user."""
    return os.path.join(tempfile.gettempdir(), f"flowengine-fs-{os.getuid()}")


def _safe_name(name: str) -> str:
    if not name:
        raise ChannelError("flowengine-fs: queue and exchange names must not be empty")
    quoted = quote(name, safe="-_.@")
    return "%2E" + quoted[1:] if quoted.startswith(".") else quoted


class _Stamper:
    """File names that sort in send order within a process, whatever the clock does."""

    def __init__(self, clock: Any = time.time_ns) -> None:
        self._clock = clock
        self._last = 0
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def next_name(self) -> str:
        with self._lock:
            self._last = max(self._clock(), self._last + 1)
            return f"{self._last:020d}.{os.getpid()}.{next(self._seq):010d}.msg"


_STAMPER = _Stamper()


def _expired(name: str, expiration: Any) -> bool:
    # Per-message TTL as AMQP has it: milliseconds from publication, which the name records.
    try:
        published, ttl_ms = int(name.split(".", 1)[0]), int(expiration or 0)
    except ValueError:  # a file this transport did not name: no TTL to apply
        return False
    return ttl_ms > 0 and time.time_ns() > published + ttl_ms * 1_000_000


#: A message given back to its queue keeps its name (its FIFO place) plus this mark, which
#: deliveries report as ``delivery_info["redelivered"]``, as AMQP brokers do.
REDELIVERED_MARK = ".redelivered"


def _returned_name(name: str) -> str:
    stem = name[: -len(".msg")]
    return name if stem.endswith(REDELIVERED_MARK) else f"{stem}{REDELIVERED_MARK}.msg"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


class QoS(virtual.QoS):
    """Settles claimed files: ack deletes, requeue renames back, close restores."""

    def ack(self, delivery_tag: str) -> None:
        self.channel.drop_claim(delivery_tag)
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue:
            self.channel.unclaim(delivery_tag)
        else:
            self.channel.drop_claim(delivery_tag)
        self._quick_ack(delivery_tag)

    def restore_unacked(self) -> list[Any]:
        self._flush()
        for delivery_tag in list(self._delivered):
            self.channel.unclaim(delivery_tag)
        self._delivered.clear()
        return []


class Channel(virtual.Channel):
    """A virtual channel whose queues are directories of message files."""

    QoS = QoS
    supports_fanout = True

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        options = connection.client.transport_options
        self.root = Path(options.get("data_folder") or default_data_folder())
        self.fsync = bool(options.get("fsync", False))
        self.recover_interval = float(options.get("recover_interval", DEFAULT_RECOVER_INTERVAL))
        self._next_recovery = 0.0
        self._claim_root = self.root / "claimed" / str(os.getpid())
        self._claimed: dict[str, Path] = {}
        # Names listed but not yet claimed, per queue: one listdir serves many gets.
        self._pending: dict[str, collections.deque[str]] = {}
        self._tables: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}
        for sub in ("queues", "tmp", "exchanges", "bad"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    # -- queues --------------------------------------------------------------------------------

    def _queue_dir(self, queue: str) -> Path:
        return self.root / "queues" / _safe_name(queue)

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        self._queue_dir(queue).mkdir(exist_ok=True)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return self._queue_dir(queue).is_dir()

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        name = _STAMPER.next_name()
        tmp = self.root / "tmp" / name
        self._write_file(tmp, kombu_json.dumps(message).encode("utf-8"))
        target = self._queue_dir(queue) / name
        try:
            os.rename(tmp, target)
        except FileNotFoundError:  # queue folder removed meanwhile: recreate it
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, target)

    def _write_file(self, path: Path, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        pending = self._pending.get(queue)
        if not pending:
            if time.monotonic() >= self._next_recovery:
                self._recover_dead_claims()
            pending = self._pending[queue] = collections.deque(self._list(queue))
        while pending:
            name = pending.popleft()
            claimed = self._claim(queue, name)
            if claimed is None:
                continue  # another consumer won it
            payload = self._load(queue, claimed)
            if payload is None:
                continue
            if _expired(name, payload["properties"].get("expiration")):
                claimed.unlink(missing_ok=True)
                continue
            if name.endswith(f"{REDELIVERED_MARK}.msg"):
                payload["properties"].setdefault("delivery_info", {})["redelivered"] = True
            self._claimed[payload["properties"]["delivery_tag"]] = claimed
            return payload
        raise Empty()

    def _list(self, queue: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self._queue_dir(queue)) if n.endswith(".msg"))
        except FileNotFoundError:
            return []

    def _claim(self, queue: str, name: str) -> Path | None:
        target = self._claim_root / _safe_name(queue) / name
        try:
            os.rename(self._queue_dir(queue) / name, target)
        except FileNotFoundError:
            if target.parent.is_dir():
                return None
            target.parent.mkdir(parents=True, exist_ok=True)
            return self._claim(queue, name)
        return target

    def _load(self, queue: str, path: Path) -> Any:
        try:
            payload = kombu_json.loads(path.read_bytes())
            self.Message(payload, channel=self)  # proves the envelope and body decode
            return payload
        except Exception as err:
            bad = self.root / "bad" / _safe_name(queue)
            bad.mkdir(exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.rename(path, bad / path.name)
            LOG.warning(
                "flowengine-fs: moved undecodable message %s of queue %r to %s:"
                " reason=decode-error %s",
                path.name,
                queue,
                bad,
                str(err)[:200],
            )
            return None

    def drop_claim(self, delivery_tag: str) -> None:
        """Forget a settled message: delete its claimed file."""
        path = self._claimed.pop(delivery_tag, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def unclaim(self, delivery_tag: str) -> None:
        """Give a message back to its queue under its original name (its FIFO place)."""
        path = self._claimed.pop(delivery_tag, None)
        if path is None:
            return
        queue_dir = self.root / "queues" / path.parent.name
        try:
            os.rename(path, queue_dir / _returned_name(path.name))
        except FileNotFoundError:
            return  # already acknowledged by another thread
        self._pending.pop(unquote(path.parent.name), None)

    def _size(self, queue: str) -> int:
        return len(self._list(queue))

    def _purge(self, queue: str) -> int:
        count = 0
        for name in self._list(queue):
            try:
                (self._queue_dir(queue) / name).unlink()
                count += 1
            except FileNotFoundError:
                pass
        self._pending.pop(queue, None)
        return count

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        exchange, routing_key, pattern = (list(args) + [None, None, None])[:3]
        self._purge(queue)
        if exchange:
            self._update_table(exchange, None, remove=(routing_key or "", pattern or "", queue))
        try:
            self._queue_dir(queue).rmdir()
        except OSError:
            pass

    def _recover_dead_claims(self) -> None:
        """Requeue what processes that died had claimed but not acknowledged."""
        self._next_recovery = time.monotonic() + self.recover_interval
        for owner in (self.root / "claimed").glob("*"):
            if not owner.name.isdigit() or _pid_alive(int(owner.name)):
                continue
            requeued = 0
            for path in owner.glob("*/*.msg"):
                with contextlib.suppress(FileNotFoundError):  # a racing recoverer won
                    target = self.root / "queues" / path.parent.name / _returned_name(path.name)
                    os.rename(path, target)
                    requeued += 1
            for folder in (*owner.glob("*"), owner):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            if requeued:
                LOG.warning(
                    "flowengine-fs: requeued %d message(s) claimed by dead pid %s",
                    requeued, owner.name,
                )  # fmt: skip

    # -- exchanges and bindings (on disk, so every process routes alike) --------------------

    def _table_path(self, exchange: str) -> Path:
        return self.root / "exchanges" / f"{_safe_name(exchange)}.json"

    def _read_table(self, exchange: str) -> dict[str, Any]:
        path = self._table_path(exchange)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return {"type": None, "table": []}
        key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)  # every write is a new file
        cached = self._tables.get(exchange)
        if cached is not None and cached[0] == key:
            return cached[1]
        data = json.loads(path.read_bytes())
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
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # writers serialise; readers see whole files
            data = self._read_table(exchange)
            rows = [list(row) for row in data["table"]]
            if remove is not None and list(remove) in rows:
                rows.remove(list(remove))
            if add is not None and list(add) not in rows:
                rows.append(list(add))
            new = {"type": data["type"] or exchange_type, "table": rows}
            if new == data:
                return
            tmp = self.root / "tmp" / f"{path.name}.{os.getpid()}.{threading.get_ident()}"
            tmp.write_text(json.dumps(new))
            os.replace(tmp, path)

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

    def get_table(self, exchange: str) -> list[tuple[str, str, str]]:
        return [tuple(row) for row in self._read_table(exchange)["table"]]  # type: ignore[misc]

    def typeof(self, exchange: str, default: str = "direct") -> Any:
        if exchange not in self.state.exchanges:
            stored = self._read_table(exchange)["type"] if exchange else None
            return self.exchange_types[stored or default]
        return super().typeof(exchange, default)

    def _put_fanout(self, exchange: str, message: Any, routing_key: str, **kwargs: Any) -> None:
        for _, _, queue in self.get_table(exchange):
            self._put(queue, message, **kwargs)


class Transport(virtual.Transport):
    """The ``flowengine-fs`` kombu transport."""

    Channel = Channel
    polling_interval = DEFAULT_POLLING_INTERVAL
    driver_type = TRANSPORT_NAME
    driver_name = TRANSPORT_NAME
    # A vanished or unwritable data folder is worth a reconnect, not a dead consumer.
    channel_errors = virtual.Transport.channel_errors + (OSError,)  # type: ignore[assignment]
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct", "topic", "fanout"])
    )

    def driver_version(self) -> str:
        return flowengine.__version__
