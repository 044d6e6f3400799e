"""Tasks of the test kit's own tests (importable by name, as workers build them)."""

from __future__ import annotations

import threading
from typing import Any

from flowengine import retry, task
from flowengine.flows import linear_flow, unordered_flow
from flowengine.testing import effects
from flowengine.types.failure import Failure

#: Opened by a test to let :class:`Blocked` tasks finish (after their time limit passed).
RELEASE = threading.Event()


class Reserve(task.Task):
    """Holds a seat; releases it on revert (idempotent: a delete)."""

    def execute(self, seat: str) -> str:
        effects.put(f"seat/{seat}", "held")
        return f"reserved {seat}"

    def revert(self, seat: str, result: Any = None, **kwargs: Any) -> None:
        effects.delete(f"seat/{seat}")


class Charge(task.Task):
    """Takes 100 from the balance; refunds it on revert, once (keyed by the seat)."""

    def execute(self, seat: str) -> str:
        effects.add("balance", -100)
        return f"charged for {seat}"

    def revert(self, seat: str, result: Any = None, **kwargs: Any) -> None:
        if isinstance(result, Failure) or effects.get(f"refund/{seat}") is not None:
            return
        effects.add("balance", 100)
        effects.put(f"refund/{seat}", 100)


class SloppyCharge(task.Task):
    """Charges, and refunds on every revert call (not idempotent), even when it never charged."""

    def execute(self, seat: str) -> str:
        effects.add("balance", -100)
        return f"charged for {seat}"

    def revert(self, seat: str, result: Any = None, **kwargs: Any) -> None:
        effects.add("balance", 100)


class Ticket(task.Task):
    """Sends a ticket (a note: nothing to undo)."""

    def execute(self, seat: str) -> str:
        effects.note("ticket sent", seat=seat)
        return f"ticket {seat}"


class Mail(task.Task):
    """Sends a mail once per seat, however often it runs (its effect is keyed)."""

    def execute(self, seat: str) -> str:
        if effects.get(f"mail/{seat}") is None:
            effects.put(f"mail/{seat}", "sent")
        return "mailed"


class Flaky(task.Task):
    """Fails attempts before ``succeed_at`` (the retry controller's ``attempt``)."""

    def execute(self, attempt: int, succeed_at: int = 2) -> int:
        if attempt < succeed_at:
            raise RuntimeError(f"busy on attempt {attempt}")
        return attempt


class Blocked(task.Task):
    """Waits until the test opens :data:`RELEASE` (up to a minute); time limit one hour."""

    time_limit = 3600.0

    def execute(self) -> str:
        RELEASE.wait(60)
        return "unblocked"


class Later(task.Task):
    """Starts an hour after it is ready."""

    start_delay = 3600.0

    def execute(self) -> str:
        return "late"


class NeedsConfig(task.Task):
    """Cannot be built from its name alone (a worker could not run it)."""

    def __init__(self, config: dict[str, Any], name: str | None = None) -> None:
        super().__init__(name=name)
        self.config = config

    def execute(self) -> str:
        return "configured"


def booking(charge: type[task.Task] = Charge) -> linear_flow.Flow:
    return linear_flow.Flow("booking").add(Reserve("reserve"), charge("charge"),
                                           Ticket("ticket"))


def retried(delay: float = 3600.0, succeed_at: int = 2) -> linear_flow.Flow:
    flow = linear_flow.Flow("retried", retry=retry.Times(
        3, name="again", provides="attempt", delay=delay))
    return flow.add(Flaky("flaky", inject={"succeed_at": succeed_at}))


def fanout() -> unordered_flow.Flow:
    return unordered_flow.Flow("fanout").add(Reserve("reserve"), Mail("mail"))
