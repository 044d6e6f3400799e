"""The ZooKeeper board's job cache against listings the watch's thread read before a post.

kazoo hands each children listing to the watch's own thread, which may still be working
through one read before the board posted a job when the post adds that job to the cache: that
stale listing must not drop the job (a board would not list its own job at once, and would
announce it removed and posted again). Driven here by calling ``sync`` with the listings, on
the real ZooKeeper.
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from flowengine.jobs import base
from flowengine.jobs.backends._zookeeper_watch import JobWatch
from flowengine.types.notifier import Notifier

pytestmark = pytest.mark.integration


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


class Posted:
    """A job node this board posted, with the watch that holds it and what it announced."""

    def __init__(self, client: KazooClient, path: str) -> None:
        self.client = client
        self.seen: list[tuple[str, Any]] = []
        notifier = Notifier()
        notifier.register(Notifier.ANY,
                          lambda event, details: self.seen.append((event, details["job"])))
        # Not started: the test hands it the listings.
        self.watch: JobWatch[Any] = JobWatch(
            client, path, lambda child: child.startswith("job"),
            lambda node, _raw, _stat: node, notifier, lambda: None, lambda: None,
            "stale-listings")
        self.node = client.create(f"{path}/job", b"{}", sequence=True)
        self.watch.add(self.node, self.node)


@pytest.fixture
def posted(folder: tuple[KazooClient, str]) -> Posted:
    return Posted(*folder)


def test_a_listing_read_before_a_post_keeps_the_posted_job(posted: Posted) -> None:
    watch, node = posted.watch, posted.node
    assert watch.sync([]) == [node], "a listing older than the post dropped the posted job"
    assert watch.sync([posixpath.basename(node)]) == [node]
    assert posted.seen == [(base.POSTED, node)], "announced removed and posted again"
    posted.client.delete(node)
    assert watch.sync([]) == []  # listed once: a listing without it now means it is gone
    assert posted.seen[-1] == (base.REMOVAL, node)


def test_a_posted_job_removed_before_any_listing_showed_it_is_dropped(posted: Posted) -> None:
    posted.client.delete(posted.node)  # consumed by another board before this one listed it
    assert posted.watch.sync([]) == []
    assert posted.seen == [(base.POSTED, posted.node), (base.REMOVAL, posted.node)]
