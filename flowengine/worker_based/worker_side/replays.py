"""Signed requests a worker already ran: an exact copy pushed back is refused, across restarts.

A signature covers a request's body, ids and signing time, and is accepted for the replay
window (:data:`~flowengine.worker_based.signing.DEFAULT_REPLAY_WINDOW`) either side of the
receiver's clock. Within that window an exact copy of a signed request, captured off the wire
and published again, passes every check. So a worker with a signing key *claims* each signed
request's signature before it runs it: it creates one empty file named after the signature,
exclusively, in a folder that every worker of the same broker, exchange and topic on the host
shares. A claim that already exists means the request ran (here, in a sibling process, or
before this worker restarted): the copy is acknowledged unrun, with one ``reason=replayed``
line. A request sent again on purpose (a new attempt, a dead letter requeued) is signed afresh,
so its signature is new.

A redelivery (the broker hands a request out again because its holder died before
acknowledging it) is marked redelivered by every transport and handed back to its engine before
the claim is looked at, so that path works as without a key.

Claims are kept in one sub-folder per minute of signing time; a sub-folder is removed once the
newest signature it can hold is past the window. A folder that cannot be written is logged once
and the claims are kept in memory instead (they then last only as long as the process).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flowengine.worker_based import signing as sg

LOG = logging.getLogger("flowengine.worker_based.server")

#: Seconds of signing time one claims sub-folder covers.
BUCKET_SECONDS = 60
#: Seconds between looks for claims sub-folders past the window.
PURGE_PERIOD = 60.0
#: Reason code of a refused copy (the worker's ``reason=`` log field).
REASON_REPLAYED = "replayed"


def default_folder(broker_uri: str, exchange: str, topic: str) -> str:
    """Where the workers of ``topic`` on this host keep their claims (the temporary directory,
    one folder per user and per broker, exchange and topic)."""
    name = hashlib.sha256(f"{broker_uri}\0{exchange}\0{topic}".encode()).hexdigest()[:32]
    return os.path.join(tempfile.gettempdir(), f"flowengine-replays-{os.getuid()}", name)


class RunRequests:
    """The signatures of the requests the workers of one topic on this host have run.

    Args:
        folder: Where claims are kept (see :func:`default_folder`).
        window: The signing replay window, in seconds: how long a copy could pass its check.
        clock: UNIX time (injected by tests).
    """

    def __init__(self, folder: str, window: float = sg.DEFAULT_REPLAY_WINDOW,
                 clock: Callable[[], float] = time.time) -> None:
        self.folder, self._window, self._clock = folder, window, clock
        self._lock = threading.Lock()
        self._next_purge = 0.0
        self._in_memory: dict[str, int] | None = None  # once the folder failed

    def claim(self, headers: Mapping[str, Any]) -> bool:
        """Record the signed request with these headers as run; False if it was already.

        A request without a signature (or a malformed one, which its signature check refused
        before) is never claimed: True.
        """
        signature, signed_at = headers.get(sg.HEADER_SIGNATURE), headers.get(sg.HEADER_SIGNED_AT)
        if (not isinstance(signature, str) or not isinstance(signed_at, (int, float))
                or isinstance(signed_at, bool)):
            return True
        # The signature is checked before this, but a file name takes no chances.
        name = hashlib.sha256(signature.encode()).hexdigest()
        bucket = int(signed_at // BUCKET_SECONDS)
        self._purge()
        if self._in_memory is None:
            try:
                return self._claim_file(str(bucket), name)
            except OSError as err:
                LOG.warning("Cannot keep the signatures of requests run in %s (%s): they are "
                            "kept in memory, so a request replayed after this worker restarts "
                            "may run again", self.folder, err.strerror or err)
                self._in_memory = {}
        return self._claim_memory(f"{bucket}/{name}", bucket)

    def _claim_file(self, bucket: str, name: str) -> bool:
        path = os.path.join(self.folder, bucket, name)
        for _ in range(2):
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                return True
            except FileExistsError:
                return False
            except FileNotFoundError:  # the minute's folder is not there yet
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        raise OSError(f"cannot create {path}")

    def _claim_memory(self, key: str, bucket: int) -> bool:
        assert self._in_memory is not None
        with self._lock:
            if key in self._in_memory:
                return False
            self._in_memory[key] = bucket
            return True

    def _expired(self, bucket: int, now: float) -> bool:
        """Whether every signature of ``bucket`` is past the window (by ``now``)."""
        return (bucket + 1) * BUCKET_SECONDS + self._window < now

    def _purge(self) -> None:
        now = self._clock()
        with self._lock:
            if now < self._next_purge:
                return
            self._next_purge = now + PURGE_PERIOD
            if self._in_memory is not None:
                for key in [k for k, b in self._in_memory.items() if self._expired(b, now)]:
                    del self._in_memory[key]
                return
        try:
            buckets = os.listdir(self.folder)
        except OSError:
            return  # nothing claimed yet
        for bucket in buckets:
            if bucket.isdigit() and self._expired(int(bucket), now):
                shutil.rmtree(os.path.join(self.folder, bucket), ignore_errors=True)
