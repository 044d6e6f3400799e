"""Cancelling a running flow: its running task is asked to stop, and what it did is undone.

Provisioning a volume creates it, attaches it, then copies data into it, which takes a while.
While the copy runs, an operator cancels the order (from another thread here; ``flowengine
cancel`` or the dashboard do the same from another process). The copy task sees it through its
context (``flowengine.context``) and stops; the engine then reverts the copy, the attachment and
the volume, in that order, and the flow ends REVERTED with who cancelled it and why.

A second run bounds the same flow with a deadline: when it expires, the engine cancels the flow
itself, with reason "deadline".

Run: python examples/cancel_flow.py
"""

import threading
from typing import Any

from flowengine import context, engines, exceptions, task
from flowengine.flows import linear_flow

#: Set by the copy task once it runs, so the operator cancels while it does.
COPYING = threading.Event()
REVERTED: list[str] = []


class CreateVolume(task.Task):
    def execute(self) -> str:
        print("create_volume: created vol-1")
        return "vol-1"

    def revert(self, result: Any, **kwargs: Any) -> None:
        REVERTED.append(self.name)
        print(f"revert create_volume: deleted {result}")


class Attach(task.Task):
    def execute(self, volume: str) -> str:
        print(f"attach: attached {volume}")
        return f"{volume}@server-7"

    def revert(self, result: Any, **kwargs: Any) -> None:
        REVERTED.append(self.name)
        print(f"revert attach: detached {result}")


class CopyData(task.Task):
    """Copies chunk after chunk, looking at its context between two."""

    def execute(self, volume: str) -> int:
        ctx = context.current()
        print(f"copy_data: copying into {volume} (flow {ctx.flow_name}, attempt {ctx.attempt})")
        COPYING.set()
        copied = 0
        # ctx.wait(s) pauses like time.sleep(s), but wakes at once when the flow is cancelled.
        while not ctx.wait(0.05):
            copied += 1  # a chunk copied
        print(f"copy_data: asked to stop ({ctx.cancel_reason})")
        ctx.raise_if_cancelled()  # stop here: the task fails, and is reverted with the rest
        return copied

    def revert(self, **kwargs: Any) -> None:
        REVERTED.append(self.name)
        print("revert copy_data: wiped the partial copy")


def provision() -> linear_flow.Flow:
    return linear_flow.Flow("provision").add(
        CreateVolume("create_volume", provides="volume"), Attach("attach"),
        CopyData("copy_data"))


def main() -> None:
    engine = engines.load(provision())

    def operator() -> None:
        COPYING.wait()
        print("operator: cancel it (the customer deleted the order)")
        engine.cancel("the customer deleted the order", by="operator")

    threading.Thread(target=operator).start()
    try:
        engine.run()
    except exceptions.FlowCancelled as err:
        print(f"run raised FlowCancelled: {err.reason} (asked by {err.by})")
    print("revert order: " + " -> ".join(REVERTED))
    record = engine.storage.flow_meta["cancelled"]
    print(f"flow state: {engine.storage.get_flow_state()}; cancelled by {record['by']}: "
          f"{record['reason']}")

    REVERTED.clear()
    bounded = engines.load(provision(), deadline=0.5)  # seconds from when it first runs
    try:
        bounded.run()
    except exceptions.FlowCancelled as err:
        print(f"with a 0.5s deadline: {bounded.storage.get_flow_state()} ({err.reason}); "
              f"revert order: {' -> '.join(REVERTED)}")


if __name__ == "__main__":
    main()
