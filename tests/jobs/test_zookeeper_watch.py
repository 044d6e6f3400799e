"""The ZooKeeper board's job cache against listings applied out of the order they were read.

Listings reach the cache from the watch's own thread and from readers asking for a fresh one,
so a listing read before the board posted (or consumed) a job may be applied after the post
added that job to the cache, or after a newer listing: it must not drop the posted job (a
board would not list its own job at once, and would announce it removed and posted again), nor
bring a consumed one back. Driven here by calling ``sync`` with listings read at chosen
moments, on the real ZooKeeper.
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from flowengine.jobs import base
from flowengine.jobs.backends._zookeeper_watch import JobWatch, Version, listing_version
from flowengine.types.notifier import Notifier

pytestmark = pytest.mark.integration

Listing = tuple[list[str], Version]


@pytest.fixture
def folder(zookeeper_hosts: str) -> Iterator[tuple[KazooClient, str]]:
    client = KazooClient(hosts=zookeeper_hosts)
    client.start(timeout=10)
    root = f"/fe-test-{uuid.uuid4().hex[:12]}"
    path = f"{root}/jobs"
    client.ensure_path(path)
    yield client, path
    client.delete(root, recursive=True)
    client.stop()
    client.close()


def read_listing(client: KazooClient, path: str) -> Listing:
    """The folder's children now, with the version ``sync`` orders listings by."""
    children, stat = client.get_children(path, include_data=True)
    return children, listing_version(stat)


def new_watch(client: Any, path: str, notifier: Notifier, name: str) -> JobWatch[Any]:
    """A watch that is not started (the test hands it the listings) and whose jobs are their
    node paths."""
    return JobWatch(client, path, lambda child: child.startswith("job"),
                    lambda node, _raw, _stat: node, notifier, lambda: None, lambda: None, name)


class Posted:
    """A job node this board posted, with the watch that holds it, what it announced, and the
    listing read just before the post."""

    def __init__(self, client: KazooClient, path: str) -> None:
        self.client, self.path = client, path
        self.seen: list[tuple[str, Any]] = []
        notifier = Notifier()
        notifier.register(Notifier.ANY,
                          lambda event, details: self.seen.append((event, details["job"])))
        self.watch = new_watch(client, path, notifier, "stale-listings")
        self.before = read_listing(client, path)
        self.node = client.create(f"{path}/job", b"{}", sequence=True)
        self.watch.add(self.node, self.node)

    def listing(self) -> Listing:
        return read_listing(self.client, self.path)


@pytest.fixture
def posted(folder: tuple[KazooClient, str]) -> Posted:
    return Posted(*folder)


def test_a_listing_read_before_a_post_keeps_the_posted_job(posted: Posted) -> None:
    watch, node = posted.watch, posted.node
    assert watch.sync(*posted.before) == [node], "a listing older than the post dropped it"
    listed = posted.listing()
    assert listed[0] == [posixpath.basename(node)]
    assert watch.sync(*listed) == [node]
    assert posted.seen == [(base.POSTED, node)], "announced removed and posted again"
    posted.client.delete(node)
    assert watch.sync(*posted.listing()) == []  # listed once: now missing means gone
    assert posted.seen[-1] == (base.REMOVAL, node)


def test_a_listing_older_than_one_applied_is_not_applied(posted: Posted) -> None:
    # The reader's fresh listing (with the post) is applied before the watch's thread gets to
    # its own, read before the post.
    watch, node = posted.watch, posted.node
    assert watch.sync(*posted.listing()) == [node]
    assert watch.sync(*posted.before) == [node], "an older listing took the posted job out"
    assert posted.seen == [(base.POSTED, node)]


def test_a_listing_read_before_a_consume_does_not_bring_the_job_back(posted: Posted) -> None:
    watch, node = posted.watch, posted.node
    with_job = posted.listing()
    assert watch.sync(*with_job) == [node]
    posted.client.delete(node)
    watch.forget(node)  # consumed by this board
    assert watch.sync(*posted.listing()) == []
    assert watch.sync(*with_job) == [], "a listing read before the consume brought it back"
    assert posted.seen == [(base.POSTED, node), (base.REMOVAL, node)]


class PostsDuringCheck:
    """The board's client, through which the board posts a job while the watch checks which
    of its earlier posts still exist (between the two moments ``sync`` holds the cache)."""

    def __init__(self, client: KazooClient, post: Callable[[], None]) -> None:
        self._client, self._post = client, post

    def exists_async(self, path: str) -> Any:
        post, self._post = self._post, lambda: None
        post()
        return self._client.exists_async(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_job_posted_while_a_stale_listing_is_checked_is_kept(
        folder: tuple[KazooClient, str]) -> None:
    client, path = folder
    later: list[str] = []

    def post_later() -> None:
        later.append(client.create(f"{path}/job", b"{}", sequence=True))
        watch.add(later[0], later[0])

    watch = new_watch(PostsDuringCheck(client, post_later), path, Notifier(),
                      "post-during-check")
    before = read_listing(client, path)
    first = client.create(f"{path}/job", b"{}", sequence=True)
    watch.add(first, first)
    assert sorted(watch.sync(*before)) == sorted([first, *later]), "the later post was dropped"
    assert sorted(watch.sync(*read_listing(client, path))) == sorted([first, *later])


def test_a_posted_job_removed_before_any_listing_showed_it_is_dropped(posted: Posted) -> None:
    posted.client.delete(posted.node)  # consumed by another board before this one listed it
    assert posted.watch.sync(*posted.listing()) == []
    assert posted.seen == [(base.POSTED, posted.node), (base.REMOVAL, posted.node)]
