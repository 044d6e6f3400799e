"""A stage for conductor-process tests on any board: a board URI of the test's own, a SQLite
persistence file, a ledger and a gate (see :mod:`jobs_flows`), and conductor processes.

The Redis, ZooKeeper and etcd fault tests use it, and import the stories every backend must
tell from here.
"""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conductor_procs import Conductor, wait_for
from tcp_forwarder import Forwarder, forwarding

from flowengine import states
from flowengine.jobs import backends
from flowengine.jobs.base import Job, JobBoard
from flowengine.jobs.posting import post_flow
from flowengine.persistence import backends as backends_of_flows


class BoardStage:
    """One test's board, persistence and conductors.

    Args:
        board_uri: The board's URI (conductors get it with ``--board``).
        options: Board conf keys (``claim_ttl``...), given to conductors as ``--board-option``.
        workdir: The test's folder (persistence file, ledger, gate, conductor logs).
        wipe: Deletes what the board stored, at :meth:`close`.
        backend_uri: The persistence (a SQLite file in ``workdir`` if None).
    """

    def __init__(self, board_uri: str, options: dict[str, Any], workdir: Path,
                 wipe: Callable[[], None], backend_uri: str | None = None) -> None:
        self.board_uri, self.options, self.workdir, self._wipe = board_uri, options, workdir, wipe
        self.backend_uri = backend_uri or f"sqlite:///{workdir / 'flows.db'}"
        self.persistence = backends_of_flows.fetch(self.backend_uri)
        with contextlib.closing(self.persistence.get_connection()) as conn:
            conn.upgrade()
        self.board: JobBoard = backends.fetch("test", {"board": board_uri, **options})
        self.board.connect()
        self.ledger, self.gate = workdir / "ledger", workdir / "gate"

    def post(self, factory: Any, **store: Any) -> Job:
        """Post ``factory``'s flow as a job whose tasks write to the ledger."""
        return post_flow(self.board, self.persistence, factory,
                         store={"ledger": str(self.ledger), **store})

    def conductor(self, started: list[Conductor], name: str,
                  link: Forwarder | None = None) -> Conductor:
        """Start a conductor process on the board (appended to ``started``), reaching it
        through ``link`` if given (so the test can cut that conductor off). It keeps the
        logbooks of the jobs it finishes (the default), for :meth:`flow_states`."""
        board_uri = self.board_uri if link is None else link.via(self.board_uri)
        conductor = Conductor(name, board_uri, self.options, self.backend_uri, self.workdir)
        started.append(conductor)
        return conductor

    def wait_registered(self, conductor: Conductor, timeout: float = 30.0) -> None:
        """Return once ``conductor`` is registered on the board."""
        wait_for(lambda: any(e.name.startswith(f"{conductor.name}@")
                             for e in self.board.iter_entities("conductor")),
                 timeout, f"registration of {conductor.name}\n{conductor.output()}")

    def link(self) -> contextlib.AbstractContextManager[Forwarder]:
        """A forwarder to the board's server, for a conductor the test will cut off."""
        parts = urllib.parse.urlsplit(self.board_uri)
        assert parts.hostname is not None and parts.port is not None, self.board_uri
        return forwarding(parts.hostname, parts.port)

    def flow_states(self, job: Job) -> dict[str, str]:
        """The stored state of ``job``'s flow and of each of its atoms, by name."""
        assert job.book_uuid is not None
        with contextlib.closing(self.persistence.get_connection()) as conn:
            [flow_detail] = list(conn.get_logbook(job.book_uuid))
        return {"flow": flow_detail.state, **{ad.name: ad.state for ad in flow_detail
                                              if not ad.name.startswith("_")}}

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
    killed_at = time.time()  # the ledger's clock: the second conductor's step-2 is stamped
    first.kill()
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
    woken, runs no further atom of it and reverts nothing, quietly (no traceback)."""
    import jobs_flows

    first = stage.conductor(conductors, "frozen")
    stage.wait_registered(first)
    job = stage.post(jobs_flows.undoable_steps, gate=str(stage.gate), gated_step="step-2")
    jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=30)
    first.freeze()
    Path(f"{stage.gate}.waiting").unlink()
    second = stage.conductor(conductors, "rescuer")
    jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=30)  # took over
    stage.gate.touch()
    assert job.wait(timeout=30), second.output()
    first.thaw()
    wait_for(lambda: "lost the claim" in first.output(), 30, "the woken conductor giving up")
    entries = jobs_flows.ledger_entries(stage.ledger)
    assert _by(entries, first.pid) == ["step-1", "step-2"]
    assert _by(entries, second.pid) == ["step-2", "step-3"]
    assert first.process.poll() is None
    assert "Traceback" not in first.output(), first.output()
    assert stage.flow_states(job)["flow"] == states.SUCCESS


def _assert_nothing_reverted(stage: BoardStage, output: str) -> None:
    """No revert ran, by flowengine.testing's ledger (which prints its lines if one did)."""
    import jobs_flows

    reverts = jobs_flows.kit_ledger(stage.ledger).calls(action="revert")
    assert reverts == [], f"{output}\n{jobs_flows.kit_ledger(stage.ledger).dump()}"


def test_a_conductor_cut_off_from_its_board_mid_step_reverts_nothing(
        stage: BoardStage, conductors: list[Conductor]) -> None:
    """A conductor whose link to the board is cut (a partition: nothing passes, nothing is
    refused) while it runs step 3: another takes the job over and finishes it; when the cut-off
    conductor's step 3 ends it halts, reverting nothing and writing nothing."""
    import jobs_flows

    waiting = Path(f"{stage.gate}.waiting")
    with stage.link() as link:
        cut_off = stage.conductor(conductors, "cut-off", link)
        stage.wait_registered(cut_off)
        job = stage.post(jobs_flows.undoable_steps, gate=str(stage.gate), gated_step="step-3")
        jobs_flows.wait_for_file(waiting, timeout=30)
        link.blackhole()
        waiting.unlink()
        rescuer = stage.conductor(conductors, "rescuer")
        jobs_flows.wait_for_file(waiting, timeout=30)  # took the job over, waits in step-3
        stage.gate.touch()
        assert job.wait(timeout=30), rescuer.output()
        wait_for(lambda: "lost the claim" in cut_off.output(), 30,
                 f"the cut-off conductor halting\n{cut_off.output()}")
        _assert_nothing_reverted(stage, cut_off.output())
        entries = jobs_flows.ledger_entries(stage.ledger)
        assert _by(entries, cut_off.pid) == ["step-1", "step-2", "step-3"]
        assert _by(entries, rescuer.pid) == ["step-3"]
        stored = stage.flow_states(job)
        assert stored == {"flow": states.SUCCESS, "step-1": states.SUCCESS,
                          "step-2": states.SUCCESS, "step-3": states.SUCCESS}, stored
        assert "Traceback" not in cut_off.output(), cut_off.output()


def test_a_board_outage_longer_than_the_claim_reverts_nothing(
        stage: BoardStage, conductors: list[Conductor]) -> None:
    """The only conductor's board is unreachable (connections refused) for longer than its
    claim while it runs step 2: step 2's end is not recorded and nothing is reverted; when the
    board is back the conductor claims the job again and goes on from what is stored (step 2
    again, as after a crash), ending SUCCESS."""
    import jobs_flows

    with stage.link() as link:
        alone = stage.conductor(conductors, "alone", link)
        stage.wait_registered(alone)
        job = stage.post(jobs_flows.undoable_steps, gate=str(stage.gate), gated_step="step-2")
        jobs_flows.wait_for_file(Path(f"{stage.gate}.waiting"), timeout=30)
        link.refuse()
        # Seen from the board's side (this test's own connection), the claim has lapsed.
        wait_for(lambda: job.state == states.UNCLAIMED, 60, "the claim lapsing")
        stage.gate.touch()
        wait_for(lambda: "lost the claim" in alone.output(), 30,
                 f"the conductor halting\n{alone.output()}")
        _assert_nothing_reverted(stage, alone.output())
        link.restore()
        assert job.wait(timeout=60), alone.output()
    _assert_nothing_reverted(stage, alone.output())
    entries = jobs_flows.ledger_entries(stage.ledger)
    assert [name for name, _ in entries] == ["step-1", "step-2", "step-2", "step-3"]
    assert stage.flow_states(job)["flow"] == states.SUCCESS
