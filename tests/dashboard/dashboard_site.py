"""A dashboard served by uvicorn on a free port, worker processes, and a headless Chromium.

Chromium and chromedriver are Debian's (``/usr/bin/chromium``, ``/usr/bin/chromedriver``),
given to Selenium explicitly so its manager never downloads anything; the browser runs with a
fresh profile and without background networking (this machine has no outside network).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servers import unavailable  # tests/ is on sys.path (rootdir conftest)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: Where the screenshots are written: the docs' folder when FLOWENGINE_DOC_SCREENSHOTS=1 (to refresh
#: the pictures doc/dashboard.rst shows), else a scratch folder: a test run leaves the tree clean.
SCREENSHOTS = (REPO / "doc" / "_static" if os.environ.get("FLOWENGINE_DOC_SCREENSHOTS") == "1"
               else Path(tempfile.gettempdir()) / "flowengine-dashboard-screenshots")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
WAIT = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Site:
    """An ASGI app served by uvicorn from a thread, on 127.0.0.1 and a free port."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                     access_log=False, log_level="warning",
                                                     timeout_graceful_shutdown=1))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> Site:
        self._thread.start()
        wait_for(lambda: self._server.started, "uvicorn to start")
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10.0)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll ``condition`` until it is truthy (what a browser shows has no event to wait on)."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def click(driver: Any, selector: str, what: str) -> None:
    """Click the first element ``selector`` matches, finding it again if the live part of the
    page was replaced between finding and clicking it (the handle goes stale then)."""
    from selenium.common.exceptions import StaleElementReferenceException

    def clicked() -> bool:
        found = driver.find_elements("css selector", selector)
        if not found:
            return False
        try:
            found[0].click()
        except StaleElementReferenceException:
            return False
        return True

    wait_for(clicked, what)


def chromium() -> Any:
    """A headless Chromium driven by Selenium (fails under CI=true when it is missing)."""
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        unavailable(f"{CHROMIUM} and {CHROMEDRIVER} are needed (Debian: chromium, "
                    "chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="flowengine-chromium-")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1280,900", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.profile_dir = profile  # removed by close_chromium
    return driver


def close_chromium(driver: Any) -> None:
    try:
        driver.quit()
    finally:
        shutil.rmtree(driver.profile_dir, ignore_errors=True)


def screenshot(driver: Any, name: str) -> None:
    """Write the page as ``dashboard-<name>.png`` in :data:`SCREENSHOTS`; it must not be empty."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"dashboard-{name}.png"
    assert driver.save_screenshot(str(path)), f"Chromium wrote no screenshot of {name}"
    assert path.stat().st_size > 1000, f"screenshot {path} is nearly empty"


def start_worker(name: str, exchange: str, topic: str, data_folder: Path, log_dir: Path,
                 env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A ``flowengine worker`` process serving :mod:`dashboard_flows` on ``flowengine-fs``."""
    command = [sys.executable, "-m", "flowengine.cli.main", "worker", "--exchange", exchange,
               "--topic", topic, "--threads", "2", "--grace", "5", "--task", "dashboard_flows",
               "--transport", "flowengine-fs", "--transport-option",
               f"data_folder={data_folder}"]
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), str(REPO),
                                                       full.get("PYTHONPATH")]))
    with open(log_dir / f"{name}.log", "wb") as out:
        return subprocess.Popen(command, env=full, stdout=out, stderr=subprocess.STDOUT)


def stop_workers(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(15.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
