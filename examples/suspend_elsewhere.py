"""Suspend a flow that another process runs, through the store they share, then resume it.

This script starts a second copy of itself that runs a five-step flow on the serial engine,
stored in a SQLite file. Once the flow runs, this process asks for it to be suspended, as
``flowengine suspend FLOW_UUID --backend sqlite:///...`` and the dashboard's Suspend button do:
the request is a mark on the stored flow, which the engine reads between its steps. The running
step finishes, nothing after it starts, and the engine process ends with the flow SUSPENDED.
This process then resumes it; only the steps that did not run, run.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from flowengine import engines, states, task
from flowengine.engines import suspend_requests
from flowengine.flows import linear_flow
from flowengine.persistence import backends, models

STEPS = 5


class Step(task.Task):
    """A step that takes a while; the first one lasts until this script has asked to suspend
    (a file it creates then), so the request always lands while it runs."""

    def execute(self, asked: str) -> str:
        deadline = time.monotonic() + 60  # never outlive a parent that died before asking
        while self.name == "step-0" and not Path(asked).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.1)
        return self.name


def make_flow() -> linear_flow.Flow:
    return linear_flow.Flow("copy-files").add(*[Step(f"step-{n}") for n in range(STEPS)])


def run_elsewhere(url: str, flow_uuid: str, asked: str) -> None:
    """What the second process does: run the flow, stored under ``flow_uuid``."""
    with backends.backend(url) as backend:
        book = models.LogBook("example")
        detail = models.FlowDetail("copy-files", flow_uuid)
        book.add(detail)
        with contextlib.closing(backend.get_connection()) as conn:
            conn.save_logbook(book)
        engine = engines.load(make_flow(), flow_detail=detail, book=book, backend=backend,
                              store={"asked": asked})
        engine.run()


def stored(url: str, flow_uuid: str) -> models.FlowDetail | None:
    with backends.backend(url) as backend, contextlib.closing(backend.get_connection()) as conn:
        try:
            return conn.get_flow_details(flow_uuid)
        except Exception:
            return None  # not stored yet


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'flows.db'}"
        with backends.backend(url):
            pass  # create the store before two processes use it
        flow_uuid = str(uuid.uuid4())
        asked = Path(tmp) / "asked"
        other = subprocess.Popen([sys.executable, __file__, "--run", url, flow_uuid,
                                  str(asked)])
        detail = stored(url, flow_uuid)
        while detail is None or suspend_requests.META_RUNNING_ON not in detail.meta:
            time.sleep(0.05)  # the other process is starting and storing its flow
            detail = stored(url, flow_uuid)
        where = detail.meta[suspend_requests.META_RUNNING_ON]
        print(f"flow {detail.name} is {detail.state} in another process: "
              f"{where['pid'] == other.pid}")
        with backends.backend(url) as backend:
            answer = suspend_requests.request_suspend(backend, flow_uuid, by="example")
        print("asked, and acknowledged:", answer.text.startswith("suspend requested"))
        asked.touch()
        print("the engine process exited with", other.wait(60))
        detail = stored(url, flow_uuid)
        assert detail is not None
        done = [ad.name for ad in detail if ad.state == states.SUCCESS]
        print(f"flow state: {detail.state}; the last step ran: {f'step-{STEPS - 1}' in done}")
        with backends.backend(url) as backend:
            engine = engines.load(make_flow(), flow_detail=detail, backend=backend)
            engine.run()
            ran = [ad for ad in engine.storage.flow_detail
                   if ad.name.startswith("step-") and ad.state == states.SUCCESS]
            print(f"resumed here: {engine.storage.get_flow_state()}, {len(ran)} steps done")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--run":
        run_elsewhere(*sys.argv[2:])
    else:
        main()
