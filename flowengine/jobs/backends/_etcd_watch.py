"""Following a key prefix on etcd through the gateway's streaming ``/watch``.

etcd3gw's own watcher gives no sign when its stream ends (a restarted server, a dropped
connection), so :class:`PrefixWatch` reads the stream itself: on its end it waits a capped
backoff, re-reads everything (``reload``), and watches again from the revision that read saw,
so no change made meanwhile is missed, compaction included.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from flowengine.jobs.backends import _etcd_keys as keys

__all__ = ["PrefixWatch"]

LOG = logging.getLogger(__name__)

_RECONNECT_DELAYS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
#: Seconds a watch stream may stay silent before it is taken for dead.
QUIET_LIMIT = 11 * 60.0

#: A batch of events: ("PUT" or "DELETE", the key as changed).
Events = list[tuple[str, keys.KV]]


class _StreamEnded(Exception):
    """The server ended or refused the watch."""


class PrefixWatch:
    """Calls ``on_events`` for every change under ``prefix``, from a thread of its own.

    Args:
        client: The board's etcd3gw client (its URL, TLS settings and timeout are used).
        prefix: The keys to follow.
        reload: Re-reads everything under ``prefix``; returns the revision it read at.
        on_events: Called with each batch of events, in order.
        name: For logs and the thread's name.
    """

    def __init__(self, client: Any, prefix: str, reload: Callable[[], int],
                 on_events: Callable[[Events], None], name: str) -> None:
        import requests

        self._client, self._prefix, self._reload, self._on_events = client, prefix, reload, \
            on_events
        self._name = name
        self._session = requests.Session()
        self._session.verify = client.session.verify
        self._session.cert = client.session.cert
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._response: Any = None
        self._revision = 0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Read everything once (before returning), then follow from there on a thread."""
        self._stopping.clear()
        self._revision = self._reload()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"jobboard-{self._name}")
        self._thread.start()

    def stop(self) -> None:
        """Stop following (interrupts the stream's blocking read)."""
        self._stopping.set()
        with self._lock:
            response = self._response
        if response is not None:
            _shutdown(response)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self._session.close()

    def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                self._follow()
                raise _StreamEnded("the watch stream ended")
            except Exception as err:  # any network or server error ends this stream
                if self._stopping.is_set():
                    return
                delay = _RECONNECT_DELAYS[min(failures, len(_RECONNECT_DELAYS) - 1)]
                failures += 1
                LOG.warning("Jobboard %s lost its etcd watch (%s); watching again in %.2fs",
                            self._name, err, delay)
            if self._stopping.wait(delay):
                return
            try:
                self._revision = self._reload()
                failures = 0
            except Exception as err:  # still unreachable: the next round waits longer
                LOG.warning("Jobboard %s could not re-read etcd: %s", self._name, err)

    def _follow(self) -> None:
        body: dict[str, Any] = {"create_request": {"key": keys.b64(self._prefix),
                                   "range_end": keys.b64(keys.prefix_end(self._prefix)),
                                   "start_revision": self._revision + 1,
                                   "progress_notify": True}}
        # etcd sends a progress message on a quiet watch every 10 minutes (its default), so a
        # stream silent for longer is dead (a partition that sent no reset): watch again.
        response = self._session.post(self._client.get_url("/watch"), json=body, stream=True,
                                      timeout=(self._client.timeout or 10.0, QUIET_LIMIT))
        with self._lock:
            self._response = response
        try:
            if self._stopping.is_set():
                return
            response.raise_for_status()
            pending = b""
            for chunk in response.iter_content(chunk_size=None):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._handle(json.loads(line))
        finally:
            with self._lock:
                self._response = None
            response.close()

    def _handle(self, message: dict[str, Any]) -> None:
        if "error" in message:
            raise _StreamEnded(f"etcd refused the watch: {message['error']}")
        result = message.get("result") or {}
        if result.get("canceled"):
            raise _StreamEnded(f"etcd cancelled the watch ({result.get('cancel_reason') or ''}"
                               f" compact revision {result.get('compact_revision', '-')})")
        events: Events = []
        for event in result.get("events") or ():
            kv = keys.KV.from_gateway(event["kv"])
            events.append((event.get("type") or "PUT", kv))
            self._revision = max(self._revision, kv.mod_revision)
        if events:
            self._on_events(events)


def _shutdown(response: Any) -> None:
    """Wake a thread blocked reading ``response``'s socket."""
    with contextlib.suppress(Exception):
        fileno = response.raw._fp.fileno()
        duplicate = socket.fromfd(fileno, socket.AF_INET, socket.SOCK_STREAM)
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        finally:
            duplicate.close()
