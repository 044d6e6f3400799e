"""flowengine's filesystem transport for kombu: processes on one machine, no server.

URL ``flowengine-fs://`` (import this module first, which registers it with kombu); transport
options ``data_folder`` (default: a per-user folder in the system temp directory),
``polling_interval`` (seconds, default 0.005), ``fsync`` (default False), ``recover_interval``
(seconds between scans for messages claimed by dead processes, default 30) and
``relist_interval`` (see :mod:`~flowengine.worker_based.broker.transport_fs_order`, default 0.5).

Layout under ``data_folder``::

    queues/<queue>/<rank>-<stamp>.msg    ready messages, most urgent then oldest name first
    claimed/<pid>/<queue>/*.msg          delivered to process <pid>, not yet acknowledged
    exchanges/<exchange>.json            the exchange's type and bindings (shared by all processes)
    tmp/                                 messages being written (dead writers' swept)
    bad/<queue>/                         files that could not be decoded, kept for inspection
    spares/                              settled message files for reuse (transport_fs_files)
    bells/<queue>/<pid>.<token>          consumers waiting on the queue (transport_fs_doorbell)
    pidns/<namespace>.lock               held by its PID namespace (transport_fs_namespace)

Unlike kombu's stock ``filesystem`` transport: a message is written outside its queue (a new
file in ``tmp/``, or a spare) and renamed into it, so a reader never sees half a file; names sort
in send order (a per-process strictly increasing nanosecond stamp plus a sequence number), so
FIFO holds within a sender even in one millisecond; a consumer claims a message by renaming it
into its own ``claimed/`` folder, which exactly one of several competing processes can do, and
lets go of it only on ack, keeping the file for reuse (a reject with requeue, a closed channel
or a dead owner renames it back, marked redelivered as AMQP brokers mark it, as does a process
that finds its pid's claim folder holding what an earlier process with that pid left); an
undecodable file is moved to ``bad/`` and logged instead of stopping the consumer. A message
published with ``expiration`` is dropped once that many seconds have passed, as AMQP brokers
do. A publisher rings the doorbells of the queue's consumers, which wake at once instead of at
their next poll; polling every ``polling_interval`` remains, so a missed ring costs latency,
never a message.
A full or read-only data folder is an outage, not an error (see transport_fs_disk): writes are
retried, consumers wait, and consumed bodies are blanked before their files are reused.
Processes are told apart by pid, so a connection from another PID namespace than the folder's
live processes (another container) is refused (transport_fs_namespace).
POSIX only (rename, ``flock``); doorbells need Linux.
Queues, claims and the on-disk binding table make this a whole transport, so the module is
longer than most (kombu's stock filesystem transport is the same size).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import tempfile
import time
from pathlib import Path
from queue import Empty
from typing import Any
from urllib.parse import unquote

import kombu.transport
from kombu.transport import virtual
from kombu.utils import json as kombu_json

import flowengine
from flowengine.worker_based.broker import transport_fs_bindings as bindings
from flowengine.worker_based.broker import transport_fs_disk as fsdisk
from flowengine.worker_based.broker import transport_fs_doorbell as doorbell
from flowengine.worker_based.broker import transport_fs_files as files
from flowengine.worker_based.broker import transport_fs_namespace as pidns
from flowengine.worker_based.broker import transport_fs_order as order
from flowengine.worker_based.broker.transport_fs_bindings import safe_name as _safe_name

LOG = logging.getLogger(__name__)

TRANSPORT_NAME = "flowengine-fs"
DEFAULT_POLLING_INTERVAL = 0.005
#: Seconds between scans for messages claimed by processes that have died.
DEFAULT_RECOVER_INTERVAL = 30.0
kombu.transport.TRANSPORT_ALIASES.setdefault(TRANSPORT_NAME, f"{__name__}:Transport")


def default_data_folder() -> str:
    """Where processes that give no ``data_folder`` meet: one folder per user."""
    return os.path.join(tempfile.gettempdir(), f"flowengine-fs-{os.getuid()}")


_STAMPER = files.Stamper()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


class QoS(virtual.QoS):
    """Settles claimed files: ack recycles, requeue renames back, close restores."""

    def ack(self, delivery_tag: str) -> None:
        self.channel.drop_claim(delivery_tag)
        super().ack(delivery_tag)
        self._slot_freed()

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue:
            self.channel.unclaim(delivery_tag)
        else:
            self.channel.drop_claim(delivery_tag)
        self._quick_ack(delivery_tag)
        self._slot_freed()

    def _slot_freed(self) -> None:
        # Settled from a task thread while the consumer waits for a free prefetch slot: wake
        # it now rather than at its next poll. Only the settlement that frees a full consumer
        # wakes it, so one with room is not woken for nothing.
        limit = self.prefetch_count
        if limit and len(self._delivered) - len(self._dirty) == limit - 1:
            self.channel.wake_consumer()

    def restore_unacked(self) -> list[Any]:
        self._flush()
        for delivery_tag in list(self._delivered):
            self.channel.unclaim(delivery_tag)
        self._delivered.clear()
        return []


class Channel(bindings.BindingChannel):
    """A virtual channel whose queues are directories of message files."""

    QoS = QoS
    supports_fanout = True
    #: Monotonic clock of the relisting (tests replace it on an instance).
    clock: Any = staticmethod(time.monotonic)

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        options = connection.client.transport_options
        self.root = Path(options.get("data_folder") or default_data_folder())
        self.fsync = bool(options.get("fsync", False))
        self.recover_interval = float(options.get("recover_interval", DEFAULT_RECOVER_INTERVAL))
        self._next_recovery = 0.0
        self.relist_interval = float(options.get("relist_interval", order.RELIST_INTERVAL))
        self._listed_at: dict[str, float] = {}
        # Plain strings joined with "/" on the per-message paths: pathlib, and even
        # os.path.join, cost more than the system calls they name.
        self._root = os.path.abspath(self.root)
        # The folder whatever its spelling (a symbolic link): this process's claims in it are
        # adopted once, not once per spelling (the second would hand back the first's).
        self._real_root = os.path.realpath(self._root)
        self._queues = os.path.join(self._root, "queues")
        self._tmp = os.path.join(self._root, "tmp")
        self._claim_root = os.path.join(self._root, "claimed", str(os.getpid()))
        self._claimed: dict[str, tuple[str, int]] = {}  # delivery tag -> (file, its size)
        self._no_ack: set[str] = set()  # queues consumed without acknowledgements
        # Names listed but not yet claimed, per queue: one listdir serves many gets.
        self._pending: dict[str, collections.deque[str]] = {}
        self._tables: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}
        self._ringer = doorbell.Ringer(self._root)
        self._disk = fsdisk.disk(self._root)
        self._later = fsdisk.Later(self._disk)  # settlements a read-only disk refused
        with self._disk.guard():
            for sub in ("queues", "tmp", "exchanges", "bad", files.SHARED):
                (self.root / sub).mkdir(parents=True, exist_ok=True)

    # -- consumers and their doorbells ----------------------------------------------------------

    def basic_consume(self, queue: str, no_ack: bool, callback: Any, consumer_tag: str,
                      **kwargs: Any) -> Any:  # fmt: skip
        result = super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)
        if no_ack:  # settled on delivery: nothing acknowledges it later
            self._no_ack.add(queue)
        self.connection.bell.register(_safe_name(queue))
        return result

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        message = super().basic_get(queue, no_ack, **kwargs)
        if message is not None and no_ack:
            self.drop_claim(message.delivery_tag)
        return message

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        self._no_ack.discard(queue)  # type: ignore[arg-type]
        # Kombu keeps one callback per queue and connection; so does the doorbell.
        transport = self.connection
        if queue is not None and transport is not None and queue not in transport._callbacks:
            transport.bell.unregister(_safe_name(queue))
        return result

    def wake_consumer(self) -> None:
        """Wake this connection's consumer if it waits (a prefetch slot has been freed)."""
        if self.connection is not None:
            self.connection.bell.wake()

    def close(self) -> None:
        super().close()
        self._ringer.close()

    # -- queues --------------------------------------------------------------------------------

    def _queue_dir(self, queue: str) -> str:
        return os.path.join(self._queues, _safe_name(queue))

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        os.makedirs(self._queue_dir(queue), exist_ok=True)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return os.path.isdir(self._queue_dir(queue))

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        name = order.ranked(_STAMPER.next_name(), self._get_message_priority(message, reverse=True))
        data = kombu_json.dumps(message).encode("utf-8")
        queue_dir = _safe_name(queue)
        target = f"{self._queues}/{queue_dir}/{name}"
        source = None
        try:
            source = self._write_spare(data)
            if source is None:
                source = f"{self._tmp}/{name}"
                self._write_file(source, data)
            try:
                os.rename(source, target)
            except FileNotFoundError:  # queue folder removed meanwhile: recreate it
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.rename(source, target)
        except OSError as err:
            if source is not None:  # written, not renamed: no orphan in tmp/ or as a spare
                with contextlib.suppress(OSError):
                    os.unlink(source)
            if not fsdisk.is_disk_error(err):
                raise
            # Raised as a channel error: the proxy retries the publish as through an outage.
            raise self._disk.failed(err) from err
        self._disk.succeeded()
        self._ringer.ring(queue_dir)

    def _write_file(self, path: str, data: bytes) -> None:
        files.write(path, data, self.fsync)

    def _write_spare(self, data: bytes) -> str | None:
        spare = files.spares(self._root).take()
        if spare is None:
            return None
        try:
            files.write(spare[0], data, self.fsync, spare_size=spare[1])
        except FileNotFoundError:  # someone cleaned up the data folder
            return None
        except OSError as err:
            if fsdisk.is_disk_error(err) and os.path.exists(spare[0]):
                files.spares(self._root).put_back(*spare)  # not opened: kept for later
            raise
        return spare[0]

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        if self._later:
            self._later.retry()
        if not self._disk.check():
            # Whatever is taken now could not be answered, nor even given back: it waits.
            raise Empty()
        pending = self._pending.get(queue)
        now = self.clock()
        # Listed again when stale too: a more urgent message may have come in since.
        if not pending or now - self._listed_at.get(queue, now) >= self.relist_interval:
            if time.monotonic() >= self._next_recovery:
                self._recover_dead_claims()
            pending = self._pending[queue] = collections.deque(self._list(queue))
            self._listed_at[queue] = now
        while pending:
            name = pending.popleft()
            try:
                claimed = self._claim(queue, name)
            except OSError as err:
                if not self._disk.refused(err):
                    raise
                pending.appendleft(name)
                raise Empty() from err
            if claimed is None:
                continue  # another consumer won it
            loaded = self._load(queue, claimed)
            if loaded is None:
                continue
            payload, size = loaded
            if files.expired(name, payload["properties"].get("expiration")):
                files.spares(self._root).keep(claimed, size)
                continue
            if name.endswith(f"{files.REDELIVERED_MARK}.msg"):
                payload["properties"].setdefault("delivery_info", {})["redelivered"] = True
            if queue in self._no_ack:
                # Settled as it is delivered (AMQP's no_ack): a claim kept would outlive the
                # process and be requeued after it, as if work had been lost.
                self._later.attempt(files.spares(self._root).keep, claimed, size)
            else:
                self._claimed[payload["properties"]["delivery_tag"]] = (claimed, size)
            return payload
        raise Empty()

    def _list(self, queue: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self._queue_dir(queue)) if n.endswith(".msg"))
        except FileNotFoundError:
            return []

    def _claim(self, queue: str, name: str) -> str | None:
        # The first recovery scan adopts the claim folder already; a scan the disk refused
        # did not, and a claim made before adopting would be handed back with the rest.
        self._adopt_claims()
        queue_dir = _safe_name(queue)
        target = f"{self._claim_root}/{queue_dir}/{name}"
        try:
            os.rename(f"{self._queues}/{queue_dir}/{name}", target)
        except FileNotFoundError:
            if os.path.isdir(os.path.dirname(target)):
                return None
            os.makedirs(os.path.dirname(target), exist_ok=True)
            return self._claim(queue, name)
        return target

    def _load(self, queue: str, path: str) -> tuple[Any, int] | None:
        try:
            data = files.read(path)
            payload = kombu_json.loads(data)
            self.Message(payload, channel=self)  # proves the envelope and body decode
            return payload, len(data)
        except Exception as err:
            bad = os.path.join(self._root, "bad", _safe_name(queue))
            os.makedirs(bad, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.rename(path, os.path.join(bad, os.path.basename(path)))
            LOG.warning(
                "flowengine-fs: moved undecodable message %s of queue %r to %s:"
                " reason=decode-error %s",
                os.path.basename(path),
                queue,
                bad,
                str(err)[:200],
            )
            return None

    def drop_claim(self, delivery_tag: str) -> None:
        """Forget a settled message: recycle its claimed file (see transport_fs_files)."""
        claimed = self._claimed.pop(delivery_tag, None)
        if claimed is not None:
            self._later.attempt(files.spares(self._root).keep, *claimed)

    def unclaim(self, delivery_tag: str) -> None:
        """Give a message back to its queue under its original name (its FIFO place)."""
        claimed = self._claimed.pop(delivery_tag, None)
        if claimed is not None:
            self._later.attempt(self._return, claimed[0])

    def _return(self, claimed: str) -> None:
        folder, name = os.path.split(claimed)
        queue_dir = os.path.basename(folder)
        try:
            os.rename(claimed, os.path.join(self._queues, queue_dir, files.returned_name(name)))
        except FileNotFoundError:
            return  # already acknowledged by another thread
        self._pending.pop(unquote(queue_dir), None)
        self._ringer.ring(queue_dir)

    def _size(self, queue: str) -> int:
        return len(self._list(queue))

    def _purge(self, queue: str) -> int:
        count = 0
        for name in self._list(queue):
            try:
                os.unlink(os.path.join(self._queue_dir(queue), name))
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
            os.rmdir(self._queue_dir(queue))
        except OSError:
            pass

    def _recover_dead_claims(self) -> None:
        """Requeue what processes that died had claimed but not acknowledged."""
        self._next_recovery = time.monotonic() + self.recover_interval
        try:
            self._recover()
        except OSError as err:  # a disk that refuses: the next scan tries again
            if not self._disk.refused(err):
                raise

    def _adopt_claims(self) -> None:
        """Hand back what ``claimed/<our pid>`` holds before this process claimed anything in
        the folder: an earlier process with the same pid left it (pids are used again, and a
        restarted container's processes start from the same ones). Once per process."""
        if self._real_root not in files.CLAIMED_IN:
            files.adopt_claims(self._real_root, lambda: self._hand_back(
                Path(self._claim_root), f"an earlier process with pid {os.getpid()}"))

    def _recover(self) -> None:
        self._adopt_claims()
        doorbell.sweep(self._root, _pid_alive)
        files.sweep(self._root, _pid_alive)
        fsdisk.sweep_tmp(self._root, _pid_alive)
        for owner in (self.root / "claimed").glob("*"):
            if owner.name.isdigit() and not _pid_alive(int(owner.name)):
                self._hand_back(owner, f"process {owner.name}")

    def _hand_back(self, owner: Path, whose: str) -> int:
        """Put the messages in claim folder ``owner`` back in their queues (marked redelivered)
        and remove the folder; how many. ``whose`` names the process that left them."""
        requeued = 0
        for folder in owner.glob("*"):
            before = requeued
            for path in folder.glob("*.msg"):
                target = os.path.join(self._queues, folder.name, files.returned_name(path.name))
                try:
                    os.rename(path, target)
                    requeued += 1
                except FileNotFoundError:  # a racing recoverer won, or the queue is gone
                    if not os.path.isdir(os.path.dirname(target)):
                        files.unlink(str(path))  # deleted with its queue
            for path in folder.glob(f"{files.SPARE_PREFIX}*"):
                files.unlink(str(path))
            with contextlib.suppress(OSError):
                folder.rmdir()
            if requeued > before:
                self._ringer.ring(folder.name)
        with contextlib.suppress(OSError):
            owner.rmdir()
        if requeued:
            LOG.warning(
                "flowengine-fs: %s ended holding %d unsettled message(s); they are"
                " back in their queues, to be delivered again (nothing was lost)",
                whose, requeued,
            )  # fmt: skip
        return requeued

    def _put_fanout(self, exchange: str, message: Any, routing_key: str, **kwargs: Any) -> None:
        for _, _, queue in self.get_table(exchange):
            self._put(queue, message, **kwargs)


class Transport(virtual.Transport):
    """The ``flowengine-fs`` kombu transport."""

    Channel = Channel
    polling_interval = DEFAULT_POLLING_INTERVAL
    driver_type = TRANSPORT_NAME
    driver_name = TRANSPORT_NAME
    #: Message priority orders delivery (see transport_fs_order).
    orders_by_priority = True
    # A vanished or unwritable data folder is worth a reconnect, not a dead consumer.
    channel_errors = virtual.Transport.channel_errors + (OSError,)  # type: ignore[assignment]
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct", "topic", "fanout"])
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        root = client.transport_options.get("data_folder") or default_data_folder()
        self._root = os.path.abspath(root)
        self.bell = doorbell.Doorbell(self._root)
        self._membership: pidns.Membership | None = None

    def establish_connection(self) -> Any:
        """Open the connection once the folder is known to serve this PID namespace.

        Raises:
            ForeignNamespace: if live processes of another PID namespace use the folder.
        """
        if self._membership is None:
            self._membership = pidns.Membership(self._root)
        return super().establish_connection()

    def driver_version(self) -> str:
        return flowengine.__version__

    def drain_events(self, connection: Any, timeout: Any = None, **kwargs: Any) -> None:
        """Deliver one message, waking on a ring rather than sleeping the polling interval."""
        assert self.cycle is not None
        get = functools.partial(self.cycle.get, self._deliver, timeout=timeout)
        self.bell.drain(get, self._has_room, self.polling_interval, timeout)

    def _has_room(self) -> bool:
        return any(channel.qos.can_consume() for channel in self.channels if channel._consumers)

    def close_connection(self, connection: Any) -> None:
        super().close_connection(connection)
        self.bell.close()
        membership, self._membership = self._membership, None
        if membership is not None:
            membership.close()
