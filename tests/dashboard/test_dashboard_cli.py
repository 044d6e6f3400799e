"""``flowengine dashboard`` as a user starts it: a process serving the pages on its port."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from dashboard_site import free_port, wait_for

from flowengine.persistence import base


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


def test_the_command_serves_the_stored_flows(store: base.Backend, stored: dict[str, str],
                                             tmp_path: Path) -> None:
    port = free_port()
    database = store.engine.url.database  # type: ignore[attr-defined]
    command = [sys.executable, "-m", "flowengine.cli.main", "dashboard", "--backend",
               f"sqlite:///{database}", "--port", str(port), "--read-only",
               "--transport", "flowengine-fs", "--transport-option",
               f"data_folder={tmp_path / 'queues'}", "--token", "t0ken-for-the-test"]
    (tmp_path / "queues").mkdir()
    log = tmp_path / "dashboard.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   env=dict(os.environ, NO_COLOR="1"))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _get(f"{url}/flows")[0] == 401, "the dashboard to answer")
        status, page = _get(f"{url}/flows", token="t0ken-for-the-test")
        assert status == 200 and stored["provisioning"] in page and "read-only" in page
    finally:
        process.terminate()
        process.wait(15.0)
    output = log.read_text()
    assert f"http://127.0.0.1:{port}/" in output and "t0ken-for-the-test" not in output
