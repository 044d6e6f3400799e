"""A stage for conductor-process tests on any board: a board URI of the test's own, a SQLite
persistence file, a ledger and a gate (see :mod:`jobs_flows`), and conductor processes.

The Redis, ZooKeeper and etcd fault tests use it, and import the stories every backend must
tell from here.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conductor_procs import Conductor, wait_for

from flowengine.jobs import backends
from flowengine.jobs.base import Job, JobBoard
from flowengine.jobs.posting import post_flow
from flowengine.persistence.backends import impl_sqlalchemy


class BoardStage:
    """One test's board, persistence and conductors.

    Args:
        board_uri: The board's URI (conductors get it with ``--board``).
        options: Board conf keys (``claim_ttl``...), given to conductors as ``--board-option``.
        workdir: The test's folder (persistence file, ledger, gate, conductor logs).
        wipe: Deletes what the board stored, at :meth:`close`.
    """

    def __init__(self, board_uri: str, options: dict[str, Any], workdir: Path,
                 wipe: Callable[[], None]) -> None:
        self.board_uri, self.options, self.workdir, self._wipe = board_uri, options, workdir, wipe
        self.backend_uri = f"sqlite:///{workdir / 'flows.db'}"
        self.persistence = impl_sqlalchemy.SQLAlchemyBackend({"connection": self.backend_uri})
        with contextlib.closing(self.persistence.get_connection()) as conn:
            conn.upgrade()
        self.board: JobBoard = backends.fetch("test", {"board": board_uri, **options})
        self.board.connect()
        self.ledger, self.gate = workdir / "ledger", workdir / "gate"

    def post(self, factory: Any, **store: Any) -> Job:
        """Post ``factory``'s flow as a job whose tasks write to the ledger."""
        return post_flow(self.board, self.persistence, factory,
                         store={"ledger": str(self.ledger), **store})

    def conductor(self, started: list[Conductor], name: str) -> Conductor:
        """Start a conductor process on the board (appended to ``started``)."""
        conductor = Conductor(name, self.board_uri, self.options, self.backend_uri,
                              self.workdir)
        started.append(conductor)
        return conductor

    def wait_registered(self, conductor: Conductor, timeout: float = 30.0) -> None:
        """Return once ``conductor`` is registered on the board."""
        wait_for(lambda: any(e.name.startswith(f"{conductor.name}@")
                             for e in self.board.iter_entities("conductor")),
                 timeout, f"registration of {conductor.name}\n{conductor.output()}")

    def close(self) -> None:
        """Close the board and persistence, and delete what the board stored."""
        self.board.close()
        self.persistence.close()
        self._wipe()


# ---- the stories every backend must tell: a test module imports these and defines the ``stage``
# fixture (its board) ----------------------------------------------------------------------------

def _by(entries: list[tuple[str, int]], pid: int) -> list[str]:
    return [name for name, who in entries if who == pid]


def test_kill_9_mid_flow_another_conductor_finishes_without_rerunning(
        stage: BoardStage, conductors: list[Conductor]) -> None:
    """A conductor killed mid-flow: another takes the job over within ``claim_ttl`` + 2 s (the
    promise of doc/reliability.rst: it has run the interrupted atom by then), and no atom that
    completed runs again."""
    import jobs_flows

    first = stage.conductor(conductors, "first")
    stage.wait_registered(first)
    job = stage.post(jobs_flows.steps, gate=str(stage.gate), gated_step="step-2")
    jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=30)
    second = stage.conductor(conductors, "second")
    stage.wait_registered(second)
    first.signal(signal.SIGKILL)
    killed_at = time.time()  # the ledger's clock: the second conductor's step-2 is stamped
    stage.gate.touch()
    assert job.wait(timeout=30), second.output()
    entries = jobs_flows.ledger_entries(stage.ledger)
    assert [name for name, _ in entries] == ["step-1", "step-2", "step-3"]
    assert _by(entries, first.pid) == ["step-1"]
    assert _by(entries, second.pid) == ["step-2", "step-3"]
    took = jobs_flows.recorded_at(stage.ledger, "step-2", second.pid) - killed_at
    assert took < float(stage.options["claim_ttl"]) + 2.0, f"took over after {took:.2f}s"


def test_a_conductor_frozen_past_its_claim_runs_no_further_atom(
        stage: BoardStage, conductors: list[Conductor]) -> None:
    """A conductor frozen (SIGSTOP) past its claim: another takes the job over, and the first,
    woken, runs no further atom of it."""
    import jobs_flows

    first = stage.conductor(conductors, "frozen")
    stage.wait_registered(first)
    job = stage.post(jobs_flows.steps, gate=str(stage.gate), gated_step="step-2")
    jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=30)
    first.signal(signal.SIGSTOP)
    Path(f"{stage.gate}.waiting").unlink()
    second = stage.conductor(conductors, "rescuer")
    jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=30)  # took over
    stage.gate.touch()
    assert job.wait(timeout=30), second.output()
    first.signal(signal.SIGCONT)
    wait_for(lambda: "lost the claim" in first.output(), 30, "the woken conductor giving up")
    entries = jobs_flows.ledger_entries(stage.ledger)
    assert _by(entries, first.pid) == ["step-1", "step-2"]
    assert _by(entries, second.pid) == ["step-2", "step-3"]
    assert first.process.poll() is None
