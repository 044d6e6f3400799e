"""Persistence in a SQLite file: run a flow, then read back what the engine stored.

An order flow runs with ``backend="sqlite:///<file>"``: the engine creates the tables, and writes
every state change of the flow and of each task to the file as it happens (the script prints each
one: the engine announces a change after storing it). The script then opens
the database with a new backend, as another process would, and prints the logbook, the flow
detail and every atom detail (state, intention, result); last, the same rows through plain SQL.

Run: python examples/persistence_sqlite.py [DATABASE]   (default: a file in a temporary directory)
"""

import contextlib
import sqlite3
import sys
import tempfile
from pathlib import Path

from flowengine import engines, task
from flowengine.flows import linear_flow
from flowengine.persistence import backends, models
from flowengine.types.notifier import Notifier


class Reserve(task.Task):
    def execute(self, item: str) -> str:
        return f"reservation-{item}"


class Charge(task.Task):
    def execute(self, amount: int) -> dict[str, object]:
        return {"charged": amount, "currency": "EUR"}


class Ship(task.Task):
    def execute(self, reservation: str) -> str:
        return f"parcel for {reservation}"


def make_flow() -> linear_flow.Flow:
    return linear_flow.Flow("place-order").add(
        Reserve("reserve", provides="reservation"),
        Charge("charge", provides="receipt"),
        Ship("ship", provides="parcel"),
    )


def run(uri: str) -> str:
    """Run the flow with the database as its backend; return the logbook's uuid."""
    book = models.LogBook("orders")
    # Given a URI, load() builds the backend and creates (or migrates) the tables itself.
    engine = engines.load(make_flow(), store={"item": "book", "amount": 30}, book=book,
                          backend=uri)

    def stored(state: str, details: dict[str, object]) -> None:
        name = details.get("task_name") or f"flow {details['flow_name']}"
        print(f"  stored {name}: {details['old_state']} -> {state}")

    engine.notifier.register(Notifier.ANY, stored)
    engine.atom_notifier.register(Notifier.ANY, stored)
    engine.run()
    engine.storage.backend.close()
    print(f"ran flow 'place-order': {engine.storage.get_flow_state()}")
    return book.uuid


def show(uri: str, book_uuid: str) -> None:
    """Print what the database holds, read through a new backend."""
    with backends.backend(uri) as be, contextlib.closing(be.get_connection()) as conn:
        book = conn.get_logbook(book_uuid)
        print(f"logbook {book.name!r}: {len(book)} flow detail(s)")
        for fd in book:
            print(f"  flow detail {fd.name!r}: state {fd.state}")
            by_name = {ad.name: ad for ad in fd}
            # The task details in flow order; values given with store= live in a detail of their
            # own (TaskFlow's injector), whose results are those values.
            for name in ("reserve", "charge", "ship", "_TaskFlow_INJECTOR"):
                ad = by_name[name]
                print(f"    {name:<18} {ad.state:<8} intention={ad.intention:<8} "
                      f"results={ad.results!r}")


def show_sql(path: Path) -> None:
    """The same atom details as rows of the ``atomdetails`` table (JSON text columns)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT name, state, results FROM atomdetails ORDER BY name")
        for name, state, results in rows:
            print(f"  {name:<18} {state:<8} {results}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(tmp) / "flows.db").resolve()
        uri = f"sqlite:///{path}"
        print(f"database: {path}")
        book_uuid = run(uri)
        print("== read back through a new backend")
        show(uri, book_uuid)
        print("== the atomdetails table")
        show_sql(path)


if __name__ == "__main__":
    main()
