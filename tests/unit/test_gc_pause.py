"""The engine pauses cyclic garbage collection around its bulk phases and resumes it as found."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from flowengine import engines, task
from flowengine.engines import setup_slots
from flowengine.flows import linear_flow as lf


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_pauses_nest_and_the_collector_comes_back_enabled() -> None:
    gc.enable()
    with setup_slots.gc_paused():
        assert not gc.isenabled()
        with setup_slots.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "the outer pause still holds"
    assert gc.isenabled()


def test_a_collector_the_application_disabled_stays_disabled() -> None:
    gc.disable()
    with setup_slots.gc_paused():
        pass
    assert not gc.isenabled()


def test_an_error_inside_still_resumes_collection() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), setup_slots.gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


class Seen(task.Task):
    def execute(self) -> bool:
        return gc.isenabled()


def test_an_engine_leaves_collection_on_and_tasks_run_with_it_on() -> None:
    gc.enable()
    engine = engines.load(lf.Flow("f").add(Seen("a", provides="on")))
    engine.run()
    assert engine.storage.fetch("on") is True
    assert gc.isenabled()
