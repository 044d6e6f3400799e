"""A worker-based engine that can no longer record its progress sends no attempt again.

A conductor frozen past its claim wakes with its engines' leases on their running requests
lapsed: the executor sends each lost attempt again, storing the new request's id with its atom
first (so whoever resumes the flow can revoke it). The claim's fence refuses that write; the
attempt must then not be sent, or a worker runs an atom another conductor may have completed
already (``flowengine chaos --board`` found it: requests no engine recorded, started after
their atom was recorded done). The same holds for any engine told to halt (its store gone).

On the test kit: real in-process workers on the memory transport, a clock that skips the lost
worker's proof-of-life window, and the ledger of every call.
"""

from __future__ import annotations

import threading
from typing import Any

from test_storage_faults import ReadOnlyLater  # tests/unit is on sys.path

from flowengine import exceptions as exc
from flowengine import task
from flowengine.flows import linear_flow
from flowengine.testing import TestKit

#: Lets the charge finish once the test has halted its engine.
RELEASE = threading.Event()
#: A store that refuses every write once a task says so (as a claim's fence does once the
#: claim may have lapsed).
STORE = ReadOnlyLater(writes_allowed=10**6)


class Charge(task.Task):
    """Says it is under way (so its engine knows it runs), charges once the test says so."""

    def execute(self) -> str:
        self.update_progress(0.5)
        RELEASE.wait(10)
        return "charged"


def heard_under_way(atom: task.Task) -> threading.Event:
    """Set once the engine hears ``atom`` report progress from its worker: it heard the worker
    start it (a worker sends RUNNING before any progress, on the same queue). The engine's own
    0.0, as it dispatches the atom, does not count."""
    heard = threading.Event()

    def progress(_event: str, details: dict[str, Any]) -> None:
        if details.get("progress", 0.0) >= 0.5:
            heard.set()

    atom.notifier.register(task.EVENT_UPDATE_PROGRESS, progress)
    return heard


def test_a_halted_engine_does_not_send_a_lost_attempt_again() -> None:
    RELEASE.clear()
    with TestKit() as kit:
        # The worker is lost once the charge ran: its outcome never arrives, its lease lapses.
        kit.lose_worker("charge", after_effects=True)
        charge = Charge("charge")
        under_way = heard_under_way(charge)
        running = kit.launch(linear_flow.Flow("order").add(charge))
        assert under_way.wait(10), "charge never said it was under way"
        # What a conductor does when its claim is lost: nothing more may be written, or sent.
        running.engine.halt(exc.StorageFailure("the claim on the job was lost"))
        RELEASE.set()
        outcome = running.outcome()
    assert isinstance(outcome.error, exc.RunHalted), outcome.error
    kit.ledger.assert_ran_once("charge")


class ChargeAsTheStoreGoes(task.Task):
    """Charges; from then on the flow's store refuses every write."""

    def execute(self) -> str:
        STORE.budget[0] = 0
        return "charged"


def test_an_attempt_whose_id_cannot_be_stored_is_not_sent() -> None:
    STORE.budget[0] = 10**6
    with TestKit() as kit:
        kit.lose_worker("charge", after_effects=True)
        outcome = kit.run(linear_flow.Flow("order").add(ChargeAsTheStoreGoes("charge")),
                          backend=STORE)
    # Storing the new attempt's id was the first write refused: nothing was sent, the engine
    # halted on it.
    assert isinstance(outcome.error, exc.RunHalted), outcome.error
    kit.ledger.assert_ran_once("charge")
