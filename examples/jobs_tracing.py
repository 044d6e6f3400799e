"""A job's trace across two conductors: posted inside a request's span, resumed after a handover.

1. The "service" sets up the OpenTelemetry SDK and posts a three-step job to a Redis jobboard
   inside its ``POST /servers`` span: ``post_flow`` stores that span's context in the job.
2. Conductor ``alpha`` (a thread of this process) claims the job and runs it under a
   ``job provision-server`` span, a child of the request's span. It is stopped while ``install``
   runs: ``install`` finishes, the engine suspends and the job is handed back.
3. Conductor ``beta`` claims it and resumes the flow; its job span continues the same trace and
   is linked to ``alpha``'s run, so either run leads to the other.
4. Prints the trace as a tree: one trace id, both conductors' runs, each step once.

Needs Redis (FLOWENGINE_REDIS_URL, default redis://127.0.0.1:6379/0).
Run: python examples/jobs_tracing.py
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import uuid
from pathlib import Path

import tracing_setup
from opentelemetry import trace

from flowengine import task
from flowengine.conductors import backends as conductors
from flowengine.flows import linear_flow
from flowengine.jobs import backends as boards
from flowengine.jobs.posting import post_flow
from flowengine.persistence.backends import impl_memory

REDIS_URL = os.environ.get("FLOWENGINE_REDIS_URL", "redis://127.0.0.1:6379/0")
#: Set while ``install`` runs, and the signal for it to finish.
INSTALLING, RELEASE = threading.Event(), threading.Event()


class Step(task.Task):
    def execute(self) -> None:
        if self.name == "install":
            INSTALLING.set()
            RELEASE.wait(30)


def provision() -> linear_flow.Flow:
    """The flow factory the conductors import by name."""
    return linear_flow.Flow("provision-server").add(
        Step("allocate"), Step("install"), Step("configure"))


def main() -> None:
    spans = Path(tempfile.mkdtemp(prefix="flowengine-jobs-tracing-"))
    provider = tracing_setup.export_spans(spans, "service")
    persistence = impl_memory.MemoryBackend({})
    conf = {"board": REDIS_URL, "namespace": f"jobs-tracing-{uuid.uuid4().hex[:8]}"}
    with boards.backend("service", conf, persistence=persistence) as board:
        with trace.get_tracer("example-service").start_as_current_span("POST /servers"):
            job = post_flow(board, persistence, provision, name="provision-server")
        alpha = conductors.fetch("nonblocking", "alpha", board, persistence=persistence)
        runner = threading.Thread(target=alpha.run)
        runner.start()
        INSTALLING.wait(30)
        print("alpha is running install; stopping alpha")
        alpha.stop()  # running atoms finish; the job is handed back
        RELEASE.set()
        runner.join(30)
        beta = conductors.fetch("blocking", "beta", board, persistence=persistence)
        beta.run(max_dispatches=1)
        print(f"job {job.state} after beta resumed it")
    provider.shutdown()  # writes what the batch still holds
    tracing_setup.print_trace_tree(tracing_setup.read_spans(spans))
    with contextlib.suppress(OSError):
        for path in spans.iterdir():
            path.unlink()
        spans.rmdir()


if __name__ == "__main__":
    main()
