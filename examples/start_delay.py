"""A task that waits after it is ready: ``start_delay``, while everything else goes on.

``notify_customer`` must not start until 1.5 s after the order is placed (give the customer a
moment to cancel); ``reserve_stock`` and ``schedule_courier`` run meanwhile. On a local engine,
as here, the task stays PENDING with its due time stored (``flowengine show``: DELAYED UNTIL),
``engine.retry_waits`` (the ``task-delayed`` event, ``kind`` ``task``) says when it starts, and a
suspended and resumed flow waits only what is left. On the worker-based engine the request is
sent at once as a delayed dispatch instead (doc/priorities.rst).

Run: python examples/start_delay.py
"""

from __future__ import annotations

import sys
import threading
import time

from flowengine import engines, task
from flowengine.engines import RetryWait
from flowengine.flows import graph_flow

DELAY = 1.5
#: When each step ran (monotonic seconds).
RAN_AT: dict[str, float] = {}
_OUTPUT = threading.Lock()


def say(text: str) -> None:
    """Print one whole line (steps run on several threads at once)."""
    with _OUTPUT:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


class PlaceOrder(task.Task):
    """Places the order the other steps work on."""

    def execute(self) -> str:
        say(f"{self.name} runs")
        return "order-17"


class Step(task.Task):
    """Says when it ran (seconds since the example started)."""

    def execute(self, order: str) -> str:
        say(f"{self.name} runs for {order}")
        RAN_AT[self.name] = time.monotonic()
        return self.name


class NotifyCustomer(Step):
    """Tells the customer, once they had a moment to cancel."""

    start_delay = DELAY


def main() -> None:
    flow = graph_flow.Flow("order").add(
        PlaceOrder("place_order", provides="order"),
        NotifyCustomer("notify_customer"),
        Step("reserve_stock"),
        Step("schedule_courier"),
    )
    engine = engines.load(flow, engine="parallel")

    ready_at: list[float] = []

    def on_wait(wait: RetryWait) -> None:
        if wait.due is not None:
            ready_at.append(time.monotonic())
            say(f"{wait.retry_name} waits {wait.seconds:.1f}s before it starts "
                f"({wait.kind} delay)")

    engine.retry_waits.subscribe(on_wait)
    engine.run()
    # The wait was armed a moment before it was announced: allow that moment.
    waited = RAN_AT["notify_customer"] - ready_at[0]
    print(f"notify_customer waited its {DELAY}s: {waited >= DELAY - 0.05}")
    print(f"the others did not wait for it: "
          f"{max(RAN_AT['reserve_stock'], RAN_AT['schedule_courier']) < ready_at[0] + DELAY}")
    print(f"flow {engine.storage.get_flow_state()}")


if __name__ == "__main__":
    main()
