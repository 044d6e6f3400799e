"""``flowengine dashboard`` as a user starts it: a process serving the pages on its port."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from dashboard_site import free_port, wait_for

from flowengine.persistence import base


def _get(url: str, token: str | None = None, host: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if host:
        headers["Host"] = host
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


@contextlib.contextmanager
def serving(store: base.Backend, tmp_path: Path, *options: str,
            env: dict[str, str] | None = None) -> Iterator[tuple[str, Path]]:
    """``flowengine dashboard`` on the store, in its own process (``env`` added to its
    environment); its URL and log."""
    port = free_port()
    # The store's own URL (SQLite file or MariaDB database), password included.
    database = store.engine.url.render_as_string(hide_password=False)  # type: ignore[attr-defined]
    queues = tmp_path / f"queues-{port}"
    queues.mkdir()
    command = [sys.executable, "-m", "flowengine.cli.main", "dashboard", "--backend",
               database, "--port", str(port), "--transport", "flowengine-fs",
               "--transport-option", f"data_folder={queues}", *options]
    log = tmp_path / f"dashboard-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   env=dict(os.environ, NO_COLOR="1", **(env or {})))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _get(f"{url}/static/dashboard.css")[0] in (200, 401),
                 "the dashboard to answer")
        yield url, log
    finally:
        process.terminate()
        process.wait(15.0)


def test_the_command_serves_the_stored_flows(store: base.Backend, stored: dict[str, str],
                                             tmp_path: Path) -> None:
    with serving(store, tmp_path, "--read-only", "--token", "t0ken-for-the-test") as (url, log):
        assert _get(f"{url}/flows")[0] == 401
        status, page = _get(f"{url}/flows", token="t0ken-for-the-test")
        assert status == 200 and stored["provisioning"] in page and "read-only" in page
        # A link carrying the token: the request line holds it, so no access log may.
        assert _get(f"{url}/flows?token=t0ken-for-the-test")[0] != 0, "no answer"
    output = log.read_text()
    assert f"{url}/" in output and "t0ken-for-the-test" not in output


def test_without_a_token_only_local_host_names_are_answered(
        store: base.Backend, stored: dict[str, str], tmp_path: Path) -> None:
    with serving(store, tmp_path) as (url, _log):
        status, page = _get(f"{url}/flows")
        assert status == 200 and stored["exploding"] in page
        assert _get(f"{url}/flows", host="rebound.example")[0] == 400
