"""Notifications: watch a flow's and its atoms' state changes, and a task's progress.

- ``engine.notifier`` announces flow state changes (details: flow_name, flow_uuid, old_state).
- ``engine.atom_notifier`` announces atom state changes (details: task_name or retry_name, the
  uuid, old_state, and ``result`` once there is one).
- ``task.notifier`` carries a task's own events; ``update_progress`` publishes the
  ``update_progress`` event with ``{"progress": fraction}``.

Run: python examples/notifications.py
"""

from typing import Any

from flowengine import engines, task
from flowengine.flows import linear_flow
from flowengine.types import notifier


class Copy(task.Task):
    """Copies some files, reporting progress after each one."""

    def execute(self, files: list[str]) -> int:
        for done, _name in enumerate(files, start=1):
            self.update_progress(done / len(files))
        return len(files)


class Verify(task.Task):
    def execute(self, copied: int) -> bool:
        return copied > 0


def on_flow(state: str, details: dict[str, Any]) -> None:
    print(f"flow  {details['flow_name']}: {details['old_state']} -> {state}")


def on_atom(state: str, details: dict[str, Any]) -> None:
    result = f" result={details['result']!r}" if "result" in details else ""
    print(f"atom  {details['task_name']}: {details['old_state']} -> {state}{result}")


def on_progress(event: str, details: dict[str, Any]) -> None:
    print(f"progress copy: {details['progress']:.0%}")


def main() -> None:
    copy = Copy(name="copy", provides="copied")
    copy.notifier.register(task.EVENT_UPDATE_PROGRESS, on_progress)
    flow = linear_flow.Flow("backup").add(copy, Verify(name="verify", provides="verified"))
    engine = engines.load(flow, store={"files": ["a.txt", "b.txt", "c.txt", "d.txt"]})
    engine.notifier.register(notifier.Notifier.ANY, on_flow)
    engine.atom_notifier.register(notifier.Notifier.ANY, on_atom)
    engine.run()
    print(f"stored progress of copy: {engine.storage.get_task_progress('copy')}")


if __name__ == "__main__":
    main()
