"""Flows the dashboard tests store and run (importable by worker processes: no test imports)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from flowengine import retry, task
from flowengine.flows import graph_flow, linear_flow, unordered_flow

#: A file whose existence lets the gated tasks finish (the browser test opens it).
GATE_ENV = "DASHBOARD_TEST_GATE"
#: Seconds each gated task works once the gate is open.
WORK = 0.2


class Connect(task.Task):
    """Logs in with a secret password and returns a session (the password must never show)."""

    secret_args = ("password",)
    default_provides = "session"

    def execute(self, user: str, password: str) -> dict[str, Any]:
        return {"user": user, "session": "s-1"}


class Provision(task.Task):
    """Returns what it was given, tagged with its own name."""

    def execute(self, session: dict[str, Any]) -> str:
        return f"{self.name} for {session['user']}"


class Explode(task.Task):
    """Fails, with the password in its message (masked by the engine before it is stored)."""

    secret_args = ("password",)

    def execute(self, password: str, session: dict[str, Any]) -> None:
        raise RuntimeError(f"cannot reach the API with {password}")


#: Values a task returns under secret-looking keys without naming them secret anywhere.
API_KEY, DB_PASSWORD = "ak-3f9c2d7e1b", "db-pw-7ad0c41e"


class Credentials(task.Task):
    """Returns credentials under secret-looking keys; nothing marks them secret (no
    ``secret_args``, no ``Secret``): only the dashboard's rule on key names hides them."""

    def execute(self, user: str) -> dict[str, Any]:
        return {"user": user, "api_key": API_KEY, "db": {"host": "db1", "password": DB_PASSWORD}}


class Gated(task.Task):
    """Waits (bounded) for the gate file, so a browser can watch it RUNNING, then works a
    moment (so the timeline has bars worth seeing).

    The gated atoms of a test share one deadline: the first to wait 30 s in vain leaves
    ``<gate>.gave-up``, and every later one goes on at once, so a gate a failed test never
    opens costs 30 s, not 30 s per atom.
    """

    def execute(self) -> str:
        gate = os.environ.get(GATE_ENV)
        deadline = time.monotonic() + 30.0
        gave_up = Path(f"{gate}.gave-up")
        while gate and not Path(gate).exists() and not gave_up.exists():
            if time.monotonic() >= deadline:
                gave_up.touch()
                break
            time.sleep(0.05)  # a polled file: the only signal a worker process shares here
        time.sleep(WORK)
        return self.name


def provisioning() -> linear_flow.Flow:
    """connect -> (disk, network) -> report; succeeds."""
    return linear_flow.Flow("provisioning").add(
        Connect("connect"),
        unordered_flow.Flow("resources").add(Provision("disk"), Provision("network")),
        Provision("report"))


def plain() -> linear_flow.Flow:
    """disk -> report, from a stored session: no secrets, so resumable from a page."""
    return linear_flow.Flow("plain").add(Provision("disk"), Provision("report"))


def retried() -> linear_flow.Flow:
    """disk under a retry controller ``again`` that waits a minute between attempts."""
    return linear_flow.Flow("retried", retry=retry.Times(3, name="again", delay=60.0)).add(
        Provision("disk"))


def exploding() -> linear_flow.Flow:
    """connect -> explode: fails and reverts."""
    return linear_flow.Flow("exploding").add(Connect("connect"), Explode("explode"))


def gated(width: int = 2) -> graph_flow.Flow:
    """``first`` then ``width`` gated atoms side by side, then ``last``: runs on workers."""
    flow = graph_flow.Flow("gated")
    first, last = Gated("first"), Gated("last")
    middle = [Gated(f"step-{i}") for i in range(width)]
    flow.add(first, *middle, last)
    for step in middle:
        flow.link(first, step)
        flow.link(step, last)
    return flow


def credentials() -> linear_flow.Flow:
    """One task returning credentials under secret-looking keys; succeeds."""
    return linear_flow.Flow("credentials").add(Credentials("issue"))
