"""A store of each backend kind (memory, dir, SQLite, PostgreSQL) and flows run into it, for the
stored-timings tests (a module of its own: two test modules share it)."""

from __future__ import annotations

import contextlib
import pathlib
from typing import Any

import pytest

from flowengine import engines, states, task
from flowengine.flows import linear_flow
from flowengine.persistence import backends, models

BACKENDS = ["memory", "dir", "sqlite", "postgresql"]

#: Run order differs from the names' order, and from the order the atoms were added in none.
ORDER = ["zeta", "alpha", "mid"]


class Step(task.Task):
    def execute(self) -> str:
        return self.name


class Fails(task.Task):
    def execute(self) -> None:
        raise RuntimeError("no")


class TimedStore:
    """A backend under test: its URL (what ``flowengine`` commands are given) and the backend
    object engines write through (the only way into a memory store)."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url
        self.backend = backends.fetch(url)
        with contextlib.closing(self.backend.get_connection()) as conn:
            conn.upgrade()

    @property
    def shared(self) -> bool:
        """Whether a command opening :attr:`url` sees the records (all but memory)."""
        return self.kind != "memory"

    def run(self, engine: str = "serial", fail: bool = False) -> str:
        """Run the zeta-alpha-mid flow (then a failing task, if ``fail``); its flow uuid."""
        flow = linear_flow.Flow("timed").add(*(Step(name) for name in ORDER))
        if fail:
            flow.add(Fails("boom"))
        loaded = engines.load(flow, backend=self.backend, book=models.LogBook("timings"),
                              engine=engine)
        try:
            loaded.run()
        except RuntimeError:
            assert fail
        return str(loaded.storage.flow_uuid)

    def stored(self, flow_uuid: str) -> models.FlowDetail:
        """The flow detail as stored (read through a second backend object where there is
        one, as another process would)."""
        backend = self.backend if not self.shared else backends.fetch(self.url)
        try:
            with contextlib.closing(backend.get_connection()) as conn:
                return conn.get_flow_details(flow_uuid)
        finally:
            if backend is not self.backend:
                backend.close()

    def book_of(self, flow_uuid: str) -> models.LogBook:
        """The logbook holding the flow (what ``flowengine flows`` lists it with)."""
        with contextlib.closing(self.backend.get_connection()) as conn:
            return next(book for book in conn.get_logbooks()
                        if book.find(flow_uuid) is not None)


def open_store(kind: str, request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> TimedStore:
    if kind == "memory":
        return TimedStore(kind, "memory://")
    if kind == "dir":
        return TimedStore(kind, f"dir://{tmp_path}/records")
    if kind == "sqlite":
        return TimedStore(kind, f"sqlite:///{tmp_path}/records.db")
    url: str = request.getfixturevalue("postgres_schema_url")
    return TimedStore(kind, url)


# ---- records written before the times had a place of their own ---------------------------------

#: When the old-layout flow and its atoms entered each state (seconds since the epoch).
T0 = 1_700_000_000.0
OLD_FLOW_META = {"RUNNING-timestamp": T0, "SUCCESS-timestamp": T0 + 9.0}
#: The old layout's atoms, by name: their meta (progress, and the stamps the engine wrote).
OLD_ATOMS = {
    "second": {"progress": 1.0, "RUNNING-timestamp": T0 + 5.0, "SUCCESS-timestamp": T0 + 8.5},
    "first": {"progress": 1.0, "RUNNING-timestamp": T0 + 1.0, "SUCCESS-timestamp": T0 + 3.0},
}


def old_layout_flow() -> tuple[models.LogBook, models.FlowDetail]:
    """A flow as flowengine releases that kept the times in ``meta`` stored it."""
    book = models.LogBook("old", uuid="old-book")
    fd = models.FlowDetail("nightly", uuid="old-flow")
    fd.state, fd.meta = states.SUCCESS, dict(OLD_FLOW_META)
    for name, meta in OLD_ATOMS.items():
        ad = models.TaskDetail(name, uuid=f"old-{name}")
        ad.state, ad.results, ad.meta = states.SUCCESS, name, dict(meta)
        fd.add(ad)
    book.add(fd)
    return book, fd


def assert_old_timings(atoms: list[dict[str, Any]], flow: dict[str, Any]) -> None:
    """What show tells of the old-layout flow: its atoms in run order, started and durations."""
    assert [atom["name"] for atom in atoms] == ["first", "second"]
    assert [atom["started_at"] for atom in atoms] == ["2023-11-14T22:13:21.000Z",
                                                      "2023-11-14T22:13:25.000Z"]
    assert [atom["duration"] for atom in atoms] == [2.0, 3.5]
    assert flow["updated_at"] == "2023-11-14T22:13:29.000Z"  # its SUCCESS
