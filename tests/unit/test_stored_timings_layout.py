"""Where the stored times live: out of everything a TaskFlow program observes, in each backend's
own place, and read back from the older layout (``'<STATE>-timestamp'`` keys in ``meta``) too.

TaskFlow's ``dump_memory_backend``, ``persistence_example`` and ``switch_graph_flow`` examples
print stored atoms' meta and the memory backend's raw records: they must print on flowengine what
they print on TaskFlow (tests/conformance runs them). These tests pin the same on every backend,
and the upgrade of a SQL store written before the times had columns of their own.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import pathlib

import pytest
from click.testing import CliRunner
from taskflow.persistence import backends as tf_backends
from taskflow.persistence import models as tf_models
from timed_stores import ORDER, T0, TimedStore, assert_old_timings, old_layout_flow, open_store

from flowengine import states
from flowengine.cli import records
from flowengine.cli.main import cli
from flowengine.dashboard import DashboardData, EventHub

#: What TaskFlow's records hold: the keys of its models' to_dict().
TASKFLOW_ATOM_KEYS = set(tf_models.TaskDetail("t", "u").to_dict())
TASKFLOW_FLOW_KEYS = set(tf_models.FlowDetail("f", "u").to_dict())
#: The meta TaskFlow's engine writes for a task (its progress), and for a flow: nothing.
TASKFLOW_TASK_META = {"progress"}


def test_a_taskflow_program_sees_no_flowengine_keys(timed_store: TimedStore) -> None:
    flow_uuid = timed_store.run("serial", fail=True)
    with contextlib.closing(timed_store.backend.get_connection()) as conn:
        [book] = [b for b in conn.get_logbooks() if b.find(flow_uuid) is not None]
        fd = conn.get_flow_details(flow_uuid)
        atoms = list(conn.get_atoms_for_flow(flow_uuid))
    assert fd.meta == {}
    assert set(fd.to_dict()) == TASKFLOW_FLOW_KEYS
    assert len(atoms) == len(ORDER) + 1
    for ad in atoms:
        assert set(ad.to_dict()) == TASKFLOW_ATOM_KEYS
        assert set(ad.meta) <= TASKFLOW_TASK_META, ad.meta
        assert ad.times, "the times are kept, only elsewhere"
    printed = book.pformat()  # what TaskFlow's persistence example prints
    assert "timestamp" not in printed and "times" not in printed
    assert "progress = 100.00%" in printed


def test_the_memory_backends_tree_holds_taskflows_records_only(tmp_path: pathlib.Path,
                                                               request: pytest.FixtureRequest,
                                                               ) -> None:
    store = open_store("memory", request, tmp_path)
    flow_uuid = store.run("serial")
    tree = store.backend.memory  # type: ignore[attr-defined]
    flow = tree[f"/flow_details/{flow_uuid}"]
    assert flow == {"name": "timed", "meta": {}, "state": states.SUCCESS, "uuid": flow_uuid}
    for path in tree.ls(f"/flow_details/{flow_uuid}", absolute=True):
        record = tree[path]
        assert set(record) == {"atom", "type"}
        assert set(record["atom"]) == TASKFLOW_ATOM_KEYS
        assert set(record["atom"]["meta"]) == TASKFLOW_TASK_META
    assert set(store.stored(flow_uuid).times) == {states.RUNNING, states.SUCCESS}


def test_taskflow_reads_a_dir_store_flowengine_wrote(tmp_path: pathlib.Path,
                                                    request: pytest.FixtureRequest) -> None:
    store = open_store("dir", request, tmp_path)
    flow_uuid = store.run("serial")
    fd = store.stored(flow_uuid)
    # The times are in the record's own file, beside TaskFlow's keys.
    folder = tmp_path / "records"
    on_disk = json.loads((folder / "flow_details" / flow_uuid / "metadata").read_text())
    assert set(on_disk) == TASKFLOW_FLOW_KEYS | {"times"}
    atom = next(iter(fd))
    on_disk = json.loads((folder / "atom_details" / atom.uuid / "metadata").read_text())
    assert set(on_disk) == {"atom", "type", "times"}
    assert on_disk["times"] == pytest.approx(atom.times)
    # TaskFlow 6.5's own dir backend reads the store, and sees what its engine would write.
    tf_backend = tf_backends.fetch({"connection": "dir", "path": str(folder)})
    try:
        with contextlib.closing(tf_backend.get_connection()) as conn:
            tf_fd = conn.get_flow_details(flow_uuid)
            assert (tf_fd.name, tf_fd.state, tf_fd.meta) == ("timed", states.SUCCESS, {})
            assert sorted(ad.name for ad in tf_fd) == sorted(ORDER)
            assert all(ad.meta == {"progress": 1.0} and ad.state == states.SUCCESS
                       for ad in tf_fd)
    finally:
        tf_backend.close()


def test_damaged_times_lose_the_times_not_the_record(tmp_path: pathlib.Path,
                                                    request: pytest.FixtureRequest) -> None:
    store = open_store("dir", request, tmp_path)
    flow_uuid = store.run("serial")
    path = tmp_path / "records" / "flow_details" / flow_uuid / "metadata"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "times": {"RUNNING": "soon", "SUCCESS": 5}}))
    fd = store.stored(flow_uuid)
    assert (fd.state, fd.times) == (states.SUCCESS, {states.SUCCESS: 5.0})


# ---- records written before the times had a place of their own ---------------------------------

def test_records_of_the_older_layout_keep_their_timings(timed_store: TimedStore) -> None:
    book, _ = old_layout_flow()
    with contextlib.closing(timed_store.backend.get_connection()) as conn:
        conn.save_logbook(book)
    fd = timed_store.stored("old-flow")
    assert fd.times == {} and all(ad.times == {} for ad in fd)  # written as before
    assert_old_timings([records.atom_record(ad) for ad in records.atoms_of(fd)],
                        records.flow_summary(None, fd))
    view = DashboardData(timed_store.backend, EventHub(None)).flow("old-flow")
    assert view is not None and view.timeline is not None
    assert [(row.name, row.bars[0].start, row.bars[0].end) for row in view.timeline.rows] == [
        ("first", T0 + 1.0, T0 + 3.0), ("second", T0 + 5.0, T0 + 8.5)]


def test_a_flow_with_no_recorded_time_is_updated_when_its_logbook_was(
        timed_store: TimedStore) -> None:
    book, fd = old_layout_flow()
    fd.meta = {}  # as TaskFlow writes a flow no timing listener watched
    for ad in fd:
        ad.meta = {"progress": 1.0}
    with contextlib.closing(timed_store.backend.get_connection()) as conn:
        conn.save_logbook(book)
    written = datetime.datetime.fromtimestamp(  # as fmt.timestamp shows it
        timed_store.book_of("old-flow").updated_at.replace(  # type: ignore[union-attr]
            tzinfo=datetime.UTC).timestamp(), datetime.UTC)
    expected = written.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    fd = timed_store.stored("old-flow")
    with contextlib.closing(timed_store.backend.get_connection()) as conn:
        shown = records.flow_summary(None, fd, records.book_written(conn, fd))
    listed = records.flow_summary(timed_store.book_of("old-flow"), fd)
    page = DashboardData(timed_store.backend, EventHub(None)).flow("old-flow")
    assert page is not None
    assert listed["updated_at"] == shown["updated_at"] == page.summary["updated_at"] == expected
    if timed_store.shared:  # the command, as a user runs it
        out = CliRunner().invoke(cli, ["show", "old-flow", "--json", "--backend",
                                       timed_store.url]).output
        assert json.loads(out)["flow"]["updated_at"] == expected
