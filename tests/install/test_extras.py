"""Each extra on its own: a fresh virtual environment per extra runs a real flow with it.

``pip install flowengine`` alone must run a worker-based flow on the embedded filesystem
transport (``make run``'s job) and say which extra a command needs; each extra must import and
do its job with nothing but what setup.cfg declares for it (see tests/fresh_venv.py for how
the environments are made from one wheelhouse). The checks themselves run inside each
environment: tests/install/extra_checks.py.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import fresh_venv
import pytest

HERE = pathlib.Path(__file__).resolve().parent
CHECKS = HERE / "extra_checks.py"

#: extra -> (what is installed besides flowengine[extra], the checks: fixture names in
#: braces stand for that server's URL).
CASES: dict[str, tuple[tuple[str, ...], list[list[str]]]] = {
    "base": ((), [["modules"], ["workers", "-"], ["missing"], ["demo", "{demo}"]]),
    "redis": ((), [["modules", "redis"], ["workers", "{redis_url}"], ["board", "{redis_url}"]]),
    "postgresql": ((), [["modules", "postgresql"], ["postgres", "{postgres_schema_url}"]]),
    "metrics": ((), [["modules", "metrics"], ["metrics", "-"]]),
    "zookeeper": ((), [["modules", "zookeeper"], ["board", "zookeeper://{zookeeper_hosts}"]]),
    "etcd": ((), [["modules", "etcd"], ["board", "etcd://{etcd_host}"]]),
    "beanstalk": ((), [["modules", "beanstalk"], ["workers", "{beanstalk_url}"]]),
    "dashboard": ((), [["modules", "dashboard"], ["dashboard"]]),
    "otel": (("opentelemetry-sdk",), [["modules", "otel"], ["otel"]]),
    "mysql": ((), [["modules", "mysql"], ["mysql"]]),
    "testing": ((), [["modules", "testing"], ["testkit"]]),
}
SERVER_FIXTURES = ("redis_url", "postgres_schema_url", "zookeeper_hosts", "beanstalk_url")


def test_every_extra_of_setup_cfg_is_checked() -> None:
    assert set(CASES) - {"base"} == set(fresh_venv.EXTRAS)


@pytest.mark.integration
@pytest.mark.parametrize("extra", list(CASES))
def test_an_install_with_one_extra_runs_a_flow(extra: str, wheelhouse: pathlib.Path,
                                               tmp_path: pathlib.Path,
                                               request: pytest.FixtureRequest) -> None:
    also, checks = CASES[extra]
    requirement = "flowengine" if extra == "base" else f"flowengine[{extra}]"
    python = fresh_venv.make_venv(tmp_path / "venv", wheelhouse, requirement, *also)
    servers = {name: request.getfixturevalue(name) for name in SERVER_FIXTURES
               if any(f"{{{name}}}" in arg for check in checks for arg in check)}
    if any("{etcd_host}" in arg for check in checks for arg in check):
        host, port = request.getfixturevalue("etcd_endpoint")
        servers["etcd_host"] = f"{host}:{port}"
    servers["demo"] = str(fresh_venv.ROOT / "examples" / "demo_workers.py")
    (tmp_path / "tmp").mkdir()
    env = fresh_venv.clean_env(PYTHONPATH=str(HERE), TMPDIR=str(tmp_path / "tmp"),
                               PYTHONUNBUFFERED="1")
    args = [[arg.format(**servers) for arg in check] for check in checks]
    proc = subprocess.run([str(python), str(CHECKS), json.dumps(args)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (
        f"{extra}: checks exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
