"""``flowengine run`` loses its database mid-flow: it halts, fakes no rollback, and a resume is
right.

A real ``flowengine run`` process runs four steps that write an execution ledger; while step 3 runs
the database goes away (a private PostgreSQL server stopped, the cluster suite's MariaDB restarted,
or the tmpfs holding a SQLite file filled by a runaway writer), then step 3 ends. The run must halt
with exit code 6, say that its progress could not be recorded, revert nothing, and leave the stored
record as it was (the flow RUNNING, steps 1 and 2 SUCCESS, step 3 RUNNING). Once the database is
back, ``flowengine run --resume`` finishes the flow: step 3 again (its end was never recorded), then
step 4, and steps 1 and 2 never again.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import halt_flows
import pytest
from private_postgres import PrivatePostgres, private_postgres
from test_faults_disk import Tmpfs

from flowengine import states
from flowengine.cli import exits
from flowengine.persistence import backends

# Real server and conductor processes, a claim left to lapse: 10-40 s each on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
__all__ = ["private_postgres"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: Seconds a run gets to reach its gate or to end.
WAIT = 60.0


def _flowengine(*argv: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "flowengine.cli.main", *argv], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, stdin=subprocess.DEVNULL)


def _wait_for(path: Path, run: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + WAIT
    while not path.exists():
        if run.poll() is not None:
            raise AssertionError(f"the run ended first:\n{run.communicate()[0]}")
        assert time.monotonic() < deadline, f"{path} did not appear within {WAIT}s"
        time.sleep(0.02)  # another process writes it: nothing to wait on


def _stored(backend_uri: str, flow_uuid: str) -> dict[str, str | None]:
    with contextlib.closing(backends.fetch(backend_uri)) as backend, \
            contextlib.closing(backend.get_connection()) as conn:
        detail = conn.get_flow_details(flow_uuid)
        return {"flow": detail.state, **{ad.name: ad.state for ad in detail
                                         if not ad.name.startswith("_")}}


@contextlib.contextmanager
def _sqlite_on_tmpfs(tmp_path: Path) -> Iterator[tuple[str, Tmpfs]]:
    mounted = Tmpfs(tmp_path / "mnt", size="8m")
    try:
        yield f"sqlite:///{mounted.mountpoint / 'flows.db'}", mounted
    finally:
        mounted.unmount()


@pytest.fixture(params=["postgresql-stopped", "sqlite-disk-full",
                        pytest.param("mariadb-restarted", marks=pytest.mark.cluster)])
def lost_database(request: pytest.FixtureRequest,
                  tmp_path: Path) -> Iterator[tuple[str, contextlib.AbstractContextManager[None]]]:
    """``(backend URI, a context in which the database is gone)``."""
    if request.param == "postgresql-stopped":
        server: PrivatePostgres = request.getfixturevalue("private_postgres")

        @contextlib.contextmanager
        def stopped() -> Iterator[None]:
            server.stop()
            try:
                yield
            finally:
                server.start()

        yield server.url, stopped()
    elif request.param == "mariadb-restarted":
        import cluster_servers

        url = request.getfixturevalue("mariadb_database_url")
        yield url, cluster_servers.mariadb_restarted()
    else:
        with _sqlite_on_tmpfs(tmp_path) as (uri, mounted):
            yield uri, mounted.full()


def test_a_run_that_loses_its_database_halts_and_a_resume_finishes_it(
        lost_database: tuple[str, contextlib.AbstractContextManager[None]],
        tmp_path: Path) -> None:
    backend_uri, outage = lost_database
    ledger, gate = tmp_path / "ledger", tmp_path / "gate"
    stores = ["--store", f"ledger={ledger}", "--store", f"gate={gate}",
              "--store", "gated_step=step-3"]
    run = _flowengine("run", "halt_flows:steps", "--backend", backend_uri, "--plain", *stores,
                      cwd=tmp_path)
    _wait_for(Path(f"{gate}.waiting"), run)
    with outage:
        gate.touch()
        output = run.communicate(timeout=WAIT)[0]
    assert run.returncode == exits.HALTED, output
    assert "halted" in output and "could not be recorded" in output, output
    assert "nothing was reverted" in output and "resume with: flowengine run --resume" in output
    assert halt_flows.ledger(ledger) == ["execute step-1", "execute step-2", "execute step-3"]
    found = re.search(r"flow steps \(([0-9a-f-]{36})\)", output)
    assert found is not None, output
    flow_uuid = found.group(1)
    assert _stored(backend_uri, flow_uuid) == {
        "flow": states.RUNNING, "step-1": states.SUCCESS, "step-2": states.SUCCESS,
        "step-3": states.RUNNING, "step-4": states.PENDING}

    resumed = _flowengine("run", "--resume", flow_uuid, "--backend", backend_uri, "--plain",
                          cwd=tmp_path)
    output = resumed.communicate(timeout=WAIT)[0]
    assert resumed.returncode == exits.OK, output
    assert halt_flows.ledger(ledger) == ["execute step-1", "execute step-2", "execute step-3",
                                         "execute step-3", "execute step-4"]
    assert _stored(backend_uri, flow_uuid) == {
        "flow": states.SUCCESS, "step-1": states.SUCCESS, "step-2": states.SUCCESS,
        "step-3": states.SUCCESS, "step-4": states.SUCCESS}
