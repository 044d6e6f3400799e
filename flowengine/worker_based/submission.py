"""What the worker executor tracks per submission: an atom's execute or revert over attempts."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from flowengine.types.failure import Failure
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.types import TopicWorker


class RemoteFuture(cf.Future):
    """The engine's handle on a submission; it can be cancelled only before it is published.

    Once a worker may have the request, cancelling would let it run unobserved (a "ghost"), so
    the engine waits for it instead.
    """

    def __init__(self) -> None:
        super().__init__()
        self.published = False
        self.on_cancel: Callable[[], None] | None = None

    def cancel(self) -> bool:
        if self.published:
            return False
        cancelled = super().cancel()
        if cancelled and self.on_cancel is not None:
            self.on_cancel()
        return cancelled


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
    request: pr.Request | None = None
    worker: TopicWorker | None = None
    workers: list[str] = dataclasses.field(default_factory=list)
    topic: str = ""  # where the last attempt was published, for parking it as a dead letter
    started: float | None = None
    lease_until: float | None = None
