"""Find every unfinished flow in a database and resume them all, as a service does at start-up.

A first process handles five orders, each a flow in one logbook of a SQLite file: order-1
succeeds, order-2's card is declined (it reverts: finished too), order-3 is suspended by an
operator, order-4 is running when the process is killed (SIGKILL from inside its ``ship`` task),
and order-5 was created but never started. The script then lists the flow details whose state is
not SUCCESS or REVERTED, rebuilds each one's flow from the factory recorded in it, and resumes it;
only the tasks that had not finished run.

Run: python examples/resume_many.py
"""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from flowengine import engines, states, task
from flowengine.flows import linear_flow
from flowengine.persistence import backends, base, models

#: Flow states after which a flow is not resumed.
FINISHED = (states.SUCCESS, states.REVERTED)
ORDERS = ("order-1", "order-2", "order-3", "order-4", "order-5")
#: In the process that crashes: the order whose ``ship`` task kills it (None when resuming).
CRASH_IN: str | None = None


class CardDeclined(Exception):
    pass


class Step(task.Task):
    """One step of an order; prints what it does."""

    def __init__(self, name: str, order: str, declined: bool = False) -> None:
        super().__init__(name=name)
        self._order = order
        self._declined = declined

    def execute(self) -> str:
        print(f"{self._order}: {self.name}", flush=True)
        if self.name == "charge" and self._declined:
            raise CardDeclined(f"{self._order}: card declined")
        if self.name == "ship" and self._order == CRASH_IN:
            os.kill(os.getpid(), signal.SIGKILL)
        return f"{self.name} done"

    def revert(self, **kwargs: object) -> None:
        print(f"{self._order}: undo {self.name}", flush=True)


def make_order_flow(order: str, declined: bool = False) -> linear_flow.Flow:
    """The flow factory: its name and arguments are recorded in each flow detail."""
    return linear_flow.Flow(order).add(
        *(Step(name, order, declined) for name in ("reserve", "charge", "ship", "notify")))


def first_process(uri: str) -> None:
    """Create the five flows, then run them one by one until order-4 kills the process."""
    global CRASH_IN
    CRASH_IN = "order-4"
    with backends.backend(uri) as be, contextlib.closing(be.get_connection()) as conn:
        book = models.LogBook("orders")
        conn.save_logbook(book)
        # Each flow detail records "__main__.make_order_flow" and its arguments: importable by
        # this script when it resumes. In an application, keep factories in an importable module.
        loaded = {order: engines.load_from_factory(
            make_order_flow, factory_kwargs={"order": order, "declined": order == "order-2"},
            book=book, backend=be) for order in ORDERS}
        for order in ORDERS:
            engine = loaded[order]
            if order == "order-3":
                suspend_after_reserve(engine)
            try:
                engine.run()
            except CardDeclined as err:
                print(f"{err}: reverted", flush=True)


def suspend_after_reserve(engine: engines.ActionEngine) -> None:
    """What an operator's "pause this order" does: the engine stops once reserve is done."""

    def on_success(state: str, details: dict[str, object]) -> None:
        if details["task_name"] == "reserve":
            engine.suspend()

    engine.atom_notifier.register(states.SUCCESS, on_success)


def show(conn: base.Connection) -> list[models.FlowDetail]:
    """Print every flow detail's state; return the unfinished ones.

    A damaged record cannot stop this: ``get_logbooks()`` leaves out what it cannot load whole
    and logs an error naming it.
    """
    unfinished = []
    for book in conn.get_logbooks():
        for fd in sorted(book, key=lambda fd: fd.name):
            print(f"  {fd.name}  {fd.state or 'never started'}")
            if fd.state not in FINISHED:
                unfinished.append(fd)
    return unfinished


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{Path(tmp) / 'orders.db'}"
        print("== first process: handles five orders, and is killed during order-4")
        first = subprocess.run([sys.executable, __file__, "--first", uri],
                               capture_output=True, text=True, timeout=60)
        for line in first.stdout.splitlines():
            print(f"  | {line}")
        if first.returncode != -signal.SIGKILL:
            sys.exit(f"the first process was not killed (status {first.returncode}):\n"
                     f"{first.stderr}")
        print("first process ended by signal SIGKILL")

        with backends.backend(uri) as be, contextlib.closing(be.get_connection()) as conn:
            print("== stored flow states")
            unfinished = show(conn)
            print("unfinished flows: " + ", ".join(fd.name for fd in unfinished))
            for fd in unfinished:
                print(f"== resuming {fd.name} (was {fd.state or 'never started'})")
                try:
                    engines.load_from_detail(fd, backend=be).run()
                except Exception as err:
                    # One flow that fails again must not keep the others from resuming.
                    print(f"resuming {fd.name} failed: {type(err).__name__}: {err}")
            print("== stored flow states after resuming")
            left = show(conn)
            print(f"unfinished flows: {len(left)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--first"]:
        first_process(sys.argv[2])
    else:
        main()
