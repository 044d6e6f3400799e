"""What the worker executor tracks per submission: an atom's execute or revert over attempts."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from flowengine.context import TaskContext
from flowengine.types.failure import Failure
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.attempt import Attempt
from flowengine.worker_based.types import TopicWorker


class RemoteFuture(cf.Future):
    """The engine's handle on a submission.

    Before the request is published, :meth:`cancel` cancels it at once. After that a worker may
    already run it, and cancelling would let it run unobserved (a "ghost"): :meth:`cancel` then
    asks the workers to drop it (``on_revoke``) and returns False, and the future is cancelled
    later, by :meth:`revoked`, only once it is certain the request never ran.
    """

    def __init__(self) -> None:
        super().__init__()
        self.published = False
        self.on_cancel: Callable[[], None] | None = None
        self.on_revoke: Callable[[], None] | None = None

    def cancel(self) -> bool:
        if self.published:
            if self.on_revoke is not None and not self.done():
                self.on_revoke()
            return False
        cancelled = super().cancel()
        if cancelled and self.on_cancel is not None:
            self.on_cancel()
        return cancelled

    def revoked(self) -> bool:
        """Cancel a published submission that is known never to have run."""
        return super().cancel()


@dataclasses.dataclass(eq=False)
class Submission:
    """One atom's execute or revert, across all of its attempts."""

    task: Any
    uuid: str
    action: str
    arguments: Mapping[str, Any]
    result: Any
    failures: Mapping[str, Failure] | None
    future: RemoteFuture
    attempts: int = 0
    resent: int = 0  # attempts sent again because their first holder never started them
    not_served: int = 0  # attempts handed back by a worker that does not run the class
    rerouted: int = 0  # attempts sent elsewhere because nobody took them from their topic
    pickup_due: float | None = None  # executor clock: look whether it was taken by then
    other_version: int = 0  # of those, by one running another version while a right one lived
    revoking: str | None = None  # the request id workers were asked not to start
    not_before: float | None = None  # executor clock: no worker may take it before (a delay)
    delayed_job: str | None = None  # the broker's handle of its delayed job (beanstalkd)
    on_delayed_job: Callable[[str], None] | None = None  # told that handle once it is put
    suspect: str | None = None  # why the running attempt may be lost, until a heartbeat says not
    request: pr.Request | None = None
    worker: TopicWorker | None = None
    workers: list[str] = dataclasses.field(default_factory=list)
    topic: str = ""  # where the last attempt was published, for parking it as a dead letter
    attempt: Attempt | None = None  # the current attempt's lifecycle (leases, time limits)
    running_by: tuple[str, str | None] | None = None  # (request id, worker) that said RUNNING
    context: TaskContext | None = None  # the call's context (its ids travel in headers)
    stopping: str | None = None  # why its running attempt was asked to stop (a cancel)

    @property
    def lease_until(self) -> float | None:
        """When the current attempt's lease ends (None: it holds none)."""
        return None if self.attempt is None else self.attempt.lease_until
