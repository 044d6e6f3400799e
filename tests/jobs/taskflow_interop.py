"""One check, run on ZooKeeper and etcd: a TaskFlow board and a flowengine board on the same
path see, claim and consume each other's jobs."""

from __future__ import annotations

from typing import Any

from flowengine.jobs.base import JobBoard


def check_boards_share_jobs(theirs: Any, ours: JobBoard) -> None:
    """``theirs`` (TaskFlow's, connected) and ``ours`` (connected) work on each other's jobs."""
    mine = ours.post("from-flowengine", details={"store": {"x": 1}})
    their_view = {j.uuid: j for j in theirs.iterjobs(ensure_fresh=True)}
    assert their_view[mine.uuid].details == {"store": {"x": 1}}
    theirs.claim(their_view[mine.uuid], "taskflow-conductor")
    assert ours.find_owner(mine) == "taskflow-conductor"
    theirs.consume(their_view[mine.uuid], "taskflow-conductor")
    assert mine.wait(timeout=10)
    posted = theirs.post("from-taskflow", details={"k": "v"})
    [seen] = list(ours.iterjobs(ensure_fresh=True))
    assert (seen.uuid, seen.name, seen.details) == (posted.uuid, "from-taskflow", {"k": "v"})
    ours.claim(seen, "flowengine-conductor")
    assert theirs.find_owner(posted) == "flowengine-conductor"
    ours.consume(seen, "flowengine-conductor")
