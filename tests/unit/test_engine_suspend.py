"""Suspending a parallel engine whose pool holds queued atoms: they are dropped, not run.

With one thread, one atom runs and the others wait in the pool's queue. A suspension must cancel
those at once (not after the running atom ends) and end SUSPENDED, so a resumed run does them.
"""

from __future__ import annotations

import threading

from flowengine import engines, states, task
from flowengine.flows import unordered_flow as uf

WAIT = 10.0
RUNS: list[str] = []
GATE = threading.Event()
STARTED = threading.Event()


class Blocker(task.Task):
    def execute(self) -> str:
        RUNS.append(self.name)
        STARTED.set()
        assert GATE.wait(WAIT), "the test never opened the gate"
        return self.name


def test_suspending_a_parallel_engine_drops_queued_atoms_and_resumes_them() -> None:
    RUNS.clear()
    GATE.clear()
    STARTED.clear()
    flow = uf.Flow("f").add(Blocker("a"), Blocker("b"), Blocker("c"))
    engine = engines.load(flow, engine="parallel", max_workers=1)
    done = threading.Event()
    runner = threading.Thread(target=lambda: (engine.run(), done.set()), daemon=True)
    runner.start()
    assert STARTED.wait(WAIT)
    engine.suspend()
    # The queued atoms are cancelled while the first still runs: once the gate opens, the
    # freed thread has nothing left to take.
    assert _all_cancelled_but_one(engine)
    GATE.set()
    runner.join(WAIT)
    assert done.is_set()
    assert engine.storage.get_flow_state() == states.SUSPENDED
    assert len(RUNS) == 1, RUNS
    engine.run()
    assert engine.storage.get_flow_state() == states.SUCCESS
    assert sorted(RUNS) == ["a", "b", "c"], "each ran exactly once"


def _all_cancelled_but_one(engine: engines.ActionEngine) -> bool:
    waited = threading.Event()
    for _ in range(500):
        in_flight = engine.atoms_in_flight()
        if in_flight is None or in_flight == 1:  # None: the run is over
            return True
        waited.wait(0.01)
    return False
