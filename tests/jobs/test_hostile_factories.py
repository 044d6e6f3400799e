"""A stored flow whose saved factory is hostile never runs: conductors, ``run --resume``, the API.

Every record (see ``hostile_records``) would write a marker file if its factory were imported
and called. A real ``flowengine conductor`` process given jobs naming them trashes each one,
saying why, and runs the good job beside them; ``flowengine run --resume`` refuses each in one
line; ``engines.flow_from_detail`` and ``load_from_detail`` raise ``FactoryRefused``, and still
rebuild a flow whose factory is a function of the program's own. The marker never appears.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import jobs_flows
import pytest
from board_stage import BoardStage
from boards import wipe_redis
from conductor_procs import conductors
from hostile_records import hostile_factories, store_hostile

from flowengine import engines, states
from flowengine.engines.factory_policy import FactoryPolicy, FactoryRefused, applying
from flowengine.persistence import models
from flowengine.persistence.backends import impl_memory

__all__ = ["conductors"]  # a fixture, imported for pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


@pytest.fixture
def stage(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
          ) -> Iterator[BoardStage]:
    # Conductor processes can import hostile_reexports, so that case is refused, not missing.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    namespace = f"fe-hostile-{uuid.uuid4().hex[:10]}"
    made = BoardStage(redis_url, {"namespace": namespace, "claim_ttl": 5.0}, tmp_path,
                      lambda: wipe_redis(redis_url, namespace))
    yield made
    made.close()


@pytest.mark.integration
def test_a_conductor_trashes_jobs_naming_hostile_factories_and_runs_the_good_one(
        stage: BoardStage, conductors: list) -> None:  # type: ignore[type-arg]
    marker = stage.workdir / "MARKER"
    posted = {}
    for name, factory in hostile_factories(marker).items():
        book = store_hostile(stage.persistence, name, factory, state=states.PENDING)
        posted[name] = stage.board.post(name, book, details={"flow_uuid": next(iter(book)).uuid})
    good = stage.post(jobs_flows.steps)
    conductor = stage.conductor(conductors, "careful")
    for job in (*posted.values(), good):
        assert job.wait(timeout=60), conductor.output()
    assert not marker.exists(), conductor.output()
    assert jobs_flows.ledger_lines(stage.ledger) == ["step-1", "step-2", "step-3"]
    trashed = {t.name: t.reason for t in stage.board.iter_trash()}
    assert set(trashed) == set(posted), conductor.output()
    for name, reason in trashed.items():
        assert "Refused to rebuild flow" in reason, (name, reason)
    assert "part of Python itself" in trashed["os-system"]
    assert "is a builtin_function_or_method" in trashed["re-exported"]
    assert conductor.process.poll() is None


def test_run_resume_refuses_hostile_factories_in_one_line(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    uri = f"sqlite:///{tmp_path / 'flows.db'}"
    from flowengine.persistence import backends

    backend = backends.fetch(uri)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
    flows = {name: next(iter(store_hostile(backend, name, factory))).uuid
             for name, factory in hostile_factories(marker).items()}
    backend.close()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        str(TESTS), str(ROOT), os.environ.get("PYTHONPATH")])), NO_COLOR="1")
    for name, flow in flows.items():
        for extra in ([], ["--allow-factories", "hostile_reexports,os,subprocess"]):
            done = subprocess.run([sys.executable, "-m", "flowengine.cli.main", "run",
                                   "--resume", flow, "--backend", uri, "--plain", *extra],
                                  env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 1, (name, done.stdout, done.stderr)
            [line] = done.stderr.strip().splitlines()
            assert "Refused to rebuild flow" in line, (name, line)
            assert not marker.exists(), f"{name} ran under run --resume {extra}"


def test_the_api_refuses_hostile_factories_and_rebuilds_legitimate_ones(
        tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    sys.path.insert(0, str(TESTS))
    try:
        for name, factory in hostile_factories(marker).items():
            detail = models.FlowDetail(name, str(uuid.uuid4()))
            detail.meta = {"factory": factory}
            for policy in (None, FactoryPolicy.from_names("hostile_reexports,os,subprocess")):
                with pytest.raises(FactoryRefused, match=f"Refused to rebuild flow {name}"):
                    engines.flow_from_detail(detail, policy=policy)
            with pytest.raises(FactoryRefused), applying(FactoryPolicy()):
                engines.load_from_detail(detail)
            assert not marker.exists(), name
    finally:
        sys.path.remove(str(TESTS))
    # TaskFlow's way with a factory of the program's own keeps working, allowed by name or not.
    backend = impl_memory.MemoryBackend()
    engine = engines.load_from_factory(jobs_flows.steps, factory_args=[2],
                                       book=models.LogBook("legit"), backend=backend)
    stored = engine.storage.flow_detail
    assert [atom.name for atom in engines.flow_from_detail(stored)] == ["step-1", "step-2"]
    with applying(FactoryPolicy.from_names("jobs_flows")):
        engines.load_from_detail(stored, backend=backend).run()
    with pytest.raises(FactoryRefused, match="allows factories from the modules billing"):
        engines.flow_from_detail(stored, policy=FactoryPolicy.from_names("billing"))
