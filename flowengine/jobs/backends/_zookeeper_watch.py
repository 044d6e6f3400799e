"""Following a ZooKeeper board's jobs: a children watch, a cache, and the announcements.

kazoo calls watches on its own event thread, which must never block, so :class:`JobWatch`
hands every change to one thread of its own. That thread lists the folder, reads the new job
nodes, updates the cache, announces :data:`~flowengine.jobs.base.POSTED` and
:data:`~flowengine.jobs.base.REMOVAL` and wakes the board's waiters.

Listings reach the cache from two threads (that one, and a reader asking for a fresh listing),
so each carries the folder's version (its creation and its count of child changes) and one
older than the last applied is not applied: a listing read before a post or a consume and
applied after a newer one would otherwise take the posted job out again, or bring the consumed
one back. A lost session (its watches and ephemeral nodes are gone) is
followed, once kazoo has a new one, by a full re-read; ``ChildrenWatch`` sets itself again.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from flowengine import exceptions as exc
from flowengine.jobs import base
from flowengine.types import notifier as notifier_mod

from kazoo import exceptions as k_exc  # isort: skip  (the board imports kazoo_utils first)
from kazoo.client import KazooClient, KazooState
from kazoo.recipe.watchers import ChildrenWatch

from flowengine.jobs.backends import _zookeeper_records as rec

__all__ = ["JobWatch"]

LOG = logging.getLogger(__name__)

_CHANGED = object()
_RESYNC = object()
_STOP = object()

J = TypeVar("J", bound=base.Job)

#: A listing's place in the folder's history: the folder's ``czxid`` (a folder deleted and made
#: again starts a new history) and its ``cversion`` (one more at each child created or deleted).
Version = tuple[int, int]


def listing_version(stat: Any) -> Version:
    """The :data:`Version` of a listing read with ``include_data=True`` (kazoo's ZnodeStat)."""
    return (stat.czxid, stat.cversion)


class JobWatch(Generic[J]):
    """The jobs under ``path``, kept current by a watch.

    Args:
        client: The board's client.
        path: The board's job folder.
        is_job: Whether a child's name is a job node.
        make_job: The job a node's (path, raw data, stat) describes (None: not a posting).
        notifier: Where POSTED and REMOVAL are announced.
        changed: Called after every change seen (wakes the board's waiters).
        new_session: Called on the watch's thread when a lost session was replaced.
        name: The board's name (for logs and the thread's name).
    """

    def __init__(self, client: KazooClient, path: str, is_job: Callable[[str], bool],
                 make_job: Callable[[str, bytes, Any], J | None],
                 notifier: notifier_mod.Notifier, changed: Callable[[], None],
                 new_session: Callable[[], None], name: str) -> None:
        self._client, self._path, self._is_job, self._make_job = client, path, is_job, make_job
        self._notifier, self._changed, self._new_session = notifier, changed, new_session
        self._name = name
        self._lock = threading.Lock()
        self._known: dict[str, J] = {}
        #: Jobs this board posted that no listing has shown yet. The watch's thread may still
        #: hold a listing read before the post: one that lacks them must not drop them.
        self._unlisted: set[str] = set()
        #: Held for a whole :meth:`sync`, so listings are applied one at a time, in order.
        self._syncing = threading.Lock()
        self._applied: Version | None = None
        self._events: queue.Queue[object] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._watching = False
        self._session_lost = False

    def start(self) -> None:
        """Start following (the watch's thread applies the first listing)."""
        self._watching = True
        self._client.add_listener(self._on_session_state)
        self._thread = threading.Thread(target=self._follow, daemon=True,
                                        name=f"jobboard-{self._name}")
        self._thread.start()
        ChildrenWatch(self._client, self._path, self._on_children, allow_session_lost=True)

    def stop(self) -> None:
        """Stop following and forget the cache."""
        self._watching = False
        self._client.remove_listener(self._on_session_state)
        self._events.put(_STOP)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        with self._lock:
            self._known.clear()
        with self._syncing:
            self._applied = None

    def jobs(self) -> list[J]:
        """The cached jobs."""
        with self._lock:
            return list(self._known.values())

    def add(self, path: str, job: J) -> None:
        """A job this board just posted (announced unless the watch was quicker)."""
        with self._lock:
            fresh = path not in self._known
            self._known.setdefault(path, job)
            self._unlisted.add(path)
        if fresh:
            self._notifier.notify(base.POSTED, {"job": job})

    def forget(self, path: str) -> None:
        """A job this board just removed (announced unless the watch was quicker)."""
        with self._lock:
            job = self._known.pop(path, None)
            self._unlisted.discard(path)
        if job is not None:
            self._notifier.notify(base.REMOVAL, {"job": job})

    def _on_children(self, _children: list[str]) -> bool | None:
        if not self._watching:
            return False  # ends the ChildrenWatch
        # The watch's listing has no version: the watch's thread lists again with one.
        self._events.put(_CHANGED)
        return None

    def _on_session_state(self, state: str) -> None:
        # On kazoo's connection thread: only note it.
        if state == KazooState.LOST:
            self._session_lost = True
            LOG.warning("Jobboard %s lost its ZooKeeper session: its claims and registrations"
                        " are gone", self._name)
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            self._events.put(_RESYNC)

    def _follow(self) -> None:
        while True:
            item = self._events.get()
            with contextlib.suppress(queue.Empty):
                while item is not _STOP:  # only the latest listing matters
                    following = self._events.get_nowait()
                    item = _RESYNC if _RESYNC in (item, following) else following
            if item is _STOP:
                return
            try:
                if item is _RESYNC:
                    self._new_session()
                children, stat = self._client.get_children(self._path, include_data=True)
                self.sync(children, listing_version(stat))
            except (exc.TaskFlowException, k_exc.KazooException,
                    self._client.handler.timeout_exception) as err:
                LOG.warning("Jobboard %s could not follow a change: %s", self._name, err)
            self._changed()

    def sync(self, children: list[str], version: Version) -> list[J]:
        """Bring the cache in line with a listing of the folder at ``version``, announce what
        changed, and return the cached jobs (as they were, for a listing older than the last
        applied)."""
        with self._syncing:
            if self._applied is not None and version < self._applied:
                return self.jobs()
            self._applied = version
            return self._apply(children)

    def _apply(self, children: list[str]) -> list[J]:
        paths = {posixpath.join(self._path, c) for c in children if self._is_job(c)}
        with self._lock:
            self._unlisted -= paths
            unlisted = list(self._unlisted)
        # Posted here and missing from the listing: the listing may predate the post (it is
        # dropped only if its node is really gone: consumed before any listing showed it).
        checks = [(p, self._client.exists_async(p)) for p in unlisted]  # one round trip
        kept = {p for p, check in checks if check.get() is not None}
        with self._lock:
            self._unlisted -= set(unlisted) - kept
            # What is still unlisted now includes what this board posted while the check ran
            # (the listing predates those too).
            gone = [self._known.pop(p) for p in list(self._known)
                    if p not in paths and p not in self._unlisted]
            new = [p for p in paths if p not in self._known]
        requests = [(p, self._client.get_async(p)) for p in new]
        posted = []
        for path, request in requests:
            raw, stat = rec.read_raw(request)
            job = None if raw is None else self._make_job(path, raw, stat)
            if job is None:
                continue
            with self._lock:
                if path in self._known:
                    continue
                self._known[path] = job
            posted.append(job)
        for job in gone:
            self._notifier.notify(base.REMOVAL, {"job": job})
        for job in posted:
            self._notifier.notify(base.POSTED, {"job": job})
        return self.jobs()
