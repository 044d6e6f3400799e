"""Dispatch by liveness and class: the finder's silenced workers and the unserved-class error."""

from __future__ import annotations

from flowengine.worker_based.engine_side import unserved
from flowengine.worker_based.types import WorkerFinder


def test_a_silenced_worker_gets_nothing_until_it_is_heard_from_again() -> None:
    changes: list[str] = []
    finder = WorkerFinder(on_change=lambda: changes.append("change"))
    finder.add("t", ["a.B"], identity="w1")
    changes.clear()
    assert finder.silence("w1") is not None
    assert finder.get_worker_for_task("a.B") is None
    finder.seen("w1")
    assert changes == ["change"]  # requests that waited for it are dispatched
    picked = finder.get_worker_for_task("a.B")
    assert picked is not None and picked.identity == "w1"
    assert finder.silence("unknown") is None


def test_the_unserved_error_names_the_class_the_topics_and_what_they_serve() -> None:
    finder = WorkerFinder()
    finder.add("t1", ["m.A", "m.C"], identity="w1")
    finder.add("t1", ["m.A"], identity="w2")
    message = unserved.describe("m.B", "b", ["t1", "t2"], finder.workers(), 5.04)
    assert message.splitlines() == [
        "Task 'b': no live worker on topic(s) 't1', 't2' runs task class 'm.B' (waited 5.0s). "
        "Start a worker with --task m.B, or define the class in an importable module "
        "(not __main__).",
        "The 2 worker(s) on topic 't1' run: m.A, m.C"]
