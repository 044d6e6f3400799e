"""Provision a server with a graph flow on the local parallel engine, then watch a failure get
undone (the in-process version of the `make run` demo, which is examples/demo_workers.py).

Part 1 runs the flow on the parallel engine and prints each atom's progress as it happens.
Part 2 runs the same flow with a health check that fails: the engine reverts the completed
tasks in the reverse of the order they ran in, and the run re-raises the failure.

Run: python examples/main_job.py
"""

import time
from typing import Any

from rich.console import Console
from rich.table import Table

from flowengine import engines, task
from flowengine.flows import graph_flow
from flowengine.types import notifier

console = Console(highlight=False, soft_wrap=True)
MARKS = {
    "RUNNING": "[cyan]▶ started[/]",
    "SUCCESS": "[green]✔ done[/]",
    "FAILURE": "[red]✘ failed[/]",
    "REVERTING": "[yellow]↶ reverting[/]",
    "REVERTED": "[yellow]↩ reverted[/]",
}


class Step(task.Task):
    """A provisioning step: takes a moment, reports progress, returns the resource it made."""

    def __init__(self, name: str, provides: str, resource: str,
                 requires: tuple[str, ...] = (), fail: bool = False) -> None:
        super().__init__(name=name, provides=provides, requires=requires)
        self._resource = resource
        self._fail = fail

    def execute(self, **inputs: Any) -> str:
        time.sleep(0.02)
        self.update_progress(0.5)
        time.sleep(0.02)
        if self._fail:
            raise RuntimeError("server did not answer on port 22")
        return self._resource

    def revert(self, **kwargs: Any) -> None:
        time.sleep(0.01)


def build_flow(broken: bool) -> graph_flow.Flow:
    """No links are declared: the order follows from what each step requires and provides."""
    return graph_flow.Flow("provision-server").add(
        Step("allocate_ip", "ip", "10.0.0.7"),
        Step("create_volume", "volume", "vol-3f2a"),
        Step("fetch_image", "image", "debian-12"),
        Step("boot_server", "server", "srv-81c4", requires=("ip", "image")),
        Step("attach_volume", "attachment", "vol-3f2a@srv-81c4", requires=("server", "volume")),
        Step("health_check", "health", "ok", requires=("attachment",), fail=broken),
    )


def on_atom(state: str, details: dict[str, Any]) -> None:
    if state not in MARKS:
        return
    result = details.get("result")
    extra = ""
    if state == "SUCCESS":
        extra = f" -> {result}"
    elif state == "FAILURE":
        extra = f": {result.exception_str}"
    console.print(f"  {details['task_name']:<14} {MARKS[state]}{extra}")


def on_progress(event: str, name: str, details: dict[str, Any]) -> None:
    if 0.0 < details["progress"] < 1.0:  # the engine itself reports 0% and 100%
        console.print(f"  {name:<14} [dim]… {details['progress']:.0%}[/]")


def run(broken: bool) -> list[str]:
    """Run the flow; return the names of the atoms that were reverted, in order."""
    flow = build_flow(broken)
    for step in flow:
        step.notifier.register(task.EVENT_UPDATE_PROGRESS, on_progress, args=(step.name,))
    engine = engines.load(flow, engine="parallel", max_workers=3)
    engine.atom_notifier.register(notifier.Notifier.ANY, on_atom)
    reverted: list[str] = []
    engine.atom_notifier.register(
        "REVERTED", lambda state, details: reverted.append(details["task_name"]))
    try:
        engine.run()
    except RuntimeError as err:
        console.print(f"  [red]engine.run() raised RuntimeError: {err}[/]")
    table = Table("atom", "state")
    for atom in engine.compilation.iter_atoms():
        table.add_row(atom.name, engine.storage.get_atom_state(atom.name))
    console.print(table)
    console.print(f"flow state: [bold]{engine.storage.get_flow_state()}[/]")
    return reverted


def main() -> None:
    console.rule("[bold]1. provisioning a server")
    run(broken=False)
    console.rule("[bold]2. the same flow with a failing health check")
    reverted = run(broken=True)
    console.print("revert order: " + " -> ".join(reverted))


if __name__ == "__main__":
    main()
