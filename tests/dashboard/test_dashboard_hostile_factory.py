"""A stored flow whose saved factory is hostile, opened in a real browser: it never runs.

Each record (see ``hostile_records``) would write a marker file if the dashboard imported and
called its factory: ``os.system``, ``subprocess.call``, ``os.system`` re-exported from another
module, and ``flowengine run``'s rebuilder made to name ``os:system``. Real ``flowengine
dashboard`` processes serve them: read-only (also with factories allowed in the environment),
without factories (the default), and with every module involved named in
``--allow-factories``. Chromium opens every flow's page, and presses Resume where the page has
it; the page draws the stored atoms and says why, and the marker never appears.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from dashboard_site import chromium, click, close_chromium, screenshot, wait_for
from hostile_records import hostile_factories, store_hostile
from test_dashboard_cli import serving

from flowengine.cli.main import cli
from flowengine.persistence import base

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parents[1]
#: Modules named in --allow-factories: flowengine refuses the stdlib ones whatever it is told.
EVERY_MODULE = "dashboard_flows,hostile_reexports,os,subprocess,flowengine"


def test_a_hostile_stored_factory_never_runs_when_its_page_is_opened(
        store: base.Backend, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    flows = {name: next(iter(store_hostile(store, name, factory))).uuid
             for name, factory in hostile_factories(marker).items()}
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    dashboards = (("read-only", ["--read-only"], {}),
                  ("read-only, factories in the environment", ["--read-only"],
                   {"FLOWENGINE_ALLOW_FACTORIES": EVERY_MODULE}),
                  ("default", [], {}),
                  ("allowed", ["--allow-factories", EVERY_MODULE], {}))
    driver = chromium()
    try:
        for label, options, env in dashboards:
            with serving(store, tmp_path, *options, env={"PYTHONPATH": path, **env}) as (url,
                                                                                         log):
                for name, flow in flows.items():
                    driver.get(f"{url}/flows/{flow}")
                    wait_for(lambda: "innocent-looking" in driver.page_source,
                             f"{name}'s stored atom on the {label} dashboard")
                    assert not marker.exists(), f"{name} ran on the {label} dashboard"
                    assert "its graph is not rebuilt" in driver.page_source, (label, name)
                    if "read-only" not in label:
                        click(driver, "#resume", f"Resume of {name} on the {label} dashboard")
                        notice = wait_for(lambda: _notice(driver),
                                          f"the answer to resuming {name} on the {label} "
                                          f"dashboard")
                        assert notice.startswith("refused:"), (label, name, notice)
                    assert not marker.exists(), f"{name} ran on the {label} dashboard"
                if label == "allowed":
                    screenshot(driver, "hostile-factory")
            assert not marker.exists(), log.read_text()
    finally:
        close_chromium(driver)
    assert not marker.exists()


def _notice(driver: Any) -> str | None:
    """The page's notice, if it has one (read again if the live part was just replaced)."""
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        found = driver.find_elements("css selector", "#notice")
        return str(found[0].text) if found else None
    except StaleElementReferenceException:
        return None


def test_read_only_refuses_allowed_factories_on_the_command_line() -> None:
    result = CliRunner().invoke(cli, ["dashboard", "--backend", "sqlite:///unused.db",
                                      "--read-only", "--allow-factories", "myapp"])
    assert result.exit_code == 2
    assert "--allow-factories" in result.output and "--read-only" in result.output
