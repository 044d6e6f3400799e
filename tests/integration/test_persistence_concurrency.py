"""Two processes writing flows into one logbook of one store at the same time lose nothing, and a
third process reading meanwhile never sees half of a save."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flowengine import states
from flowengine.persistence import backends, models

pytestmark = pytest.mark.integration

WRITER = Path(__file__).with_name("_persistence_writer.py")
FLOWS_PER_WRITER = 20
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["dir", "sqlite", "postgresql"])
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "dir":
        return f"dir://{tmp_path}/records"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/records.db"
    url: str = request.getfixturevalue("postgres_schema_url")
    return url


def _start(uri: str, book_uuid: str, name: str, *extra: str) -> subprocess.Popen[str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, str(WRITER), uri, book_uuid, name, str(FLOWS_PER_WRITER), *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )


def test_two_processes_share_one_store(uri: str) -> None:
    with backends.backend(uri) as be, contextlib.closing(be.get_connection()) as conn:
        book = models.LogBook("shared")
        conn.save_logbook(book)

    writers = ("alpha", "beta")
    procs = {name: _start(uri, book.uuid, name) for name in writers}
    procs["reader"] = _start(uri, book.uuid, "reader", str(len(writers)))
    try:
        for proc in procs.values():
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"  # all connected: start together
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"{name} failed:\n{err}"
            assert out.startswith("done")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    with backends.backend(uri) as be, contextlib.closing(be.get_connection()) as conn:
        stored = conn.get_logbook(book.uuid)
    expected = {f"{w}-flow-{i}" for w in writers for i in range(FLOWS_PER_WRITER)}
    assert {fd.uuid for fd in stored} == expected
    for fd in stored:
        writer, _, index = fd.name.partition("-")
        assert fd.state == states.SUCCESS
        assert {ad.name: ad.results for ad in fd} == {
            f"t{n}": {"writer": writer, "flow": int(index), "task": f"t{n}"} for n in range(3)
        }
