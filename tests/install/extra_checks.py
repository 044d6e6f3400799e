"""What an install of flowengine with one extra must be able to do, run inside that install.

``tests/install/test_extras.py`` runs this script with the python of a fresh virtual
environment (no PYTHONPATH but this folder, so flowengine and everything else come from the
install): ``python extra_checks.py '[["CHECK", "ARG", ...], ...]'`` runs the checks in order,
in one process. Each check runs a real flow on real servers or processes and prints one line
saying what it saw; anything wrong exits non-zero with a message.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import pkgutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import install_tasks

import flowengine
from flowengine import engines

BIN = Path(sys.executable).parent
STORE = {"x": 2, "y": 3}
EXPECTED = 10
#: Seconds a check waits for a process or a server before giving up.
PATIENCE = 60.0


def fail(message: str) -> None:
    sys.exit(f"FAILED: {message}")


def modules(installed: list[str]) -> None:
    """Every public module imports, or refuses with an ImportError naming an extra to install
    that is not installed here."""
    needing: dict[str, str] = {}
    count = 0
    for info in pkgutil.walk_packages(flowengine.__path__, "flowengine."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        count += 1
        try:
            importlib.import_module(info.name)
        except ImportError as err:
            named = [extra for extra in _EXTRAS if f"flowengine[{extra}]" in str(err)]
            if not named or set(named) & set(installed):
                fail(f"{info.name}: {type(err).__name__}: {err}")
            needing[info.name] = named[0]
    print(f"modules: {count - len(needing)} of {count} import; the rest name their extra: "
          + ", ".join(sorted(set(needing.values()))))


_EXTRAS = ("redis", "postgresql", "mysql", "metrics", "zookeeper", "etcd", "beanstalk",
           "dashboard", "otel", "testing")


@contextlib.contextmanager
def worker(url: str | None, exchange: str, topic: str) -> Iterator[subprocess.Popen[str]]:
    """A ``flowengine worker`` process serving the install-check tasks; stopped with SIGTERM."""
    args = [str(BIN / "flowengine"), "worker", "--topic", topic, "--task", "install_tasks",
            "--exchange", exchange, "--log-level", "WARNING"]
    if url:
        args += ["--url", url]
    proc = subprocess.Popen(args, text=True, stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=PATIENCE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            fail("the worker did not stop within a minute of SIGTERM")
        if code != 0:
            fail(f"the worker exited with {code}")


def workers(url: str, metrics: bool = False) -> None:
    """A worker-based flow on a worker process (``-``: the embedded filesystem transport)."""
    broker = None if url == "-" else url
    exchange, topic = f"install-{uuid.uuid4().hex[:8]}", "install"
    options: dict[str, object] = {}
    port = free_port() if metrics else None
    if port is not None:
        options["metrics_port"] = port
    with worker(broker, exchange, topic):
        results = engines.run(install_tasks.make_flow(), store=STORE, engine="worker-based",
                              url=broker, exchange=exchange, topics=[topic],
                              transition_timeout=PATIENCE, **options)
        if results["doubled"] != EXPECTED:
            fail(f"the flow gave {results['doubled']}, not {EXPECTED}")
        if port is not None:
            page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
            text = page.read().decode()
            wanted = 'flowengine_flows_total{state="SUCCESS"} 1.0'
            if wanted not in text:
                fail(f"the engine's metrics have no {wanted!r}")
    print(f"worker-based flow on {url}: doubled={results['doubled']}"
          + (", metrics served" if port is not None else ""))


def board(url: str) -> None:
    """A job posted on a jobboard and run by a conductor, its flow saved in SQLite."""
    from flowengine.conductors import backends as conductors
    from flowengine.jobs import backends as boards
    from flowengine.jobs.posting import post_flow
    from flowengine.persistence import backends as persistence_backends

    db = Path(tempfile.mkdtemp()) / "flows.db"
    conf = {"board": url, "namespace": f"install-{uuid.uuid4().hex[:8]}"}
    with persistence_backends.backend(f"sqlite:///{db}") as persistence, \
            boards.backend("install", conf, persistence=persistence) as jobboard:
        job = post_flow(jobboard, persistence, "install_tasks.make_flow", store=STORE)
        flow_uuid = job.details["flow_uuid"]
        conductor = conductors.fetch("blocking", "install-conductor", jobboard,
                                     persistence=persistence, delete_logbook=False)
        runner = threading.Thread(target=conductor.run, daemon=True)
        runner.start()
        try:
            if not job.wait(timeout=PATIENCE):
                fail(f"the job on {url} was not done within {PATIENCE:.0f}s")
        finally:
            conductor.stop()
            runner.join(PATIENCE)
        with contextlib.closing(persistence.get_connection()) as conn:
            state = conn.get_flow_details(flow_uuid).state
    if state != "SUCCESS":
        fail(f"the job's flow ended {state}")
    print(f"job on {url.split(':')[0]} board: flow {state}")


def postgres(url: str) -> None:
    """A flow stored in PostgreSQL, then listed by ``flowengine flows``."""
    from flowengine.persistence import models

    engine = engines.load(install_tasks.make_flow(), store=STORE, backend=url,
                          book=models.LogBook("install"))
    engine.run()
    listing = run_cli("flows", "--backend", url)
    if "install-check" not in listing or "SUCCESS" not in listing:
        fail(f"flowengine flows does not list the flow:\n{listing}")
    print(f"flow stored in PostgreSQL: {engine.storage.get_flow_state()}, listed")


def dashboard() -> None:
    """``flowengine dashboard`` serves a page listing a stored flow."""
    from flowengine.persistence import models

    url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'flows.db'}"
    engines.load(install_tasks.make_flow(), store=STORE, backend=url,
                 book=models.LogBook("install")).run()
    port = free_port()
    server = subprocess.Popen([str(BIN / "flowengine"), "dashboard", "--backend", url,
                               "--port", str(port)], text=True, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        page = wait_for(lambda: fetch(f"http://127.0.0.1:{port}/"), "the dashboard to answer",
                        server)
    finally:
        server.terminate()
        server.communicate(timeout=PATIENCE)
    if "install-check" not in page:
        fail("the dashboard's page does not list the stored flow")
    print("dashboard lists the stored flow")


def otel() -> None:
    """With the OpenTelemetry SDK configured (the application's choice), a flow is traced."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    engines.run(install_tasks.make_flow(), store=STORE)
    names = [span.name for span in spans.get_finished_spans()]
    if not any("install-check" in name for name in names):
        fail(f"no span names the flow: {names}")
    print(f"traced: {len(names)} spans")


def missing() -> None:
    """Without an extra, the commands that need it say which one, in one line."""
    cases = [(("dashboard", "--backend", "sqlite://"), "flowengine[dashboard]"),
             (("workers", "--url", "redis://127.0.0.1:6379/0"), "flowengine[redis]"),
             (("workers", "--url", "beanstalk://127.0.0.1:11300"), "flowengine[beanstalk]")]
    for args, hint in cases:
        proc = subprocess.run([str(BIN / "flowengine"), *args], capture_output=True, text=True,
                              timeout=PATIENCE, stdin=subprocess.DEVNULL)
        said = proc.stderr.strip()
        if proc.returncode == 0 or hint not in said or len(said.splitlines()) != 1:
            fail(f"flowengine {' '.join(args)} exited {proc.returncode} and said:\n{said}")
    print(f"missing extras named: {len(cases)} commands")


def demo(script: str) -> None:
    """``make run``'s job (examples/demo_workers.py): two worker processes, two flows."""
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True,
                          timeout=PATIENCE * 3, stdin=subprocess.DEVNULL)
    wanted = ["flow state: SUCCESS", "flow state: REVERTED", "worker-1 stopped: exit code 0",
              "worker-2 stopped: exit code 0"]
    missing = [line for line in wanted if line not in proc.stdout]
    if proc.returncode != 0 or missing:
        fail(f"{script} exited {proc.returncode}, without {missing}:\n{proc.stdout}"
             f"{proc.stderr}")
    print("make run's demo: both flows ran, both workers stopped")


def run_cli(*args: str) -> str:
    proc = subprocess.run([str(BIN / "flowengine"), *args], capture_output=True, text=True,
                          timeout=PATIENCE, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        fail(f"flowengine {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as page:
            return str(page.read().decode())
    except OSError:
        return None


def wait_for(probe: Callable[[], str | None], what: str, proc: subprocess.Popen[str]) -> str:
    """``probe()``'s first answer; a server started in another process has nothing to wait on
    but its port, so this asks again every 50 ms, until ``proc`` exits or time runs out."""
    deadline = time.monotonic() + PATIENCE
    while (answer := probe()) is None:
        if proc.poll() is not None:
            fail(f"gave up waiting for {what}: the process exited with {proc.returncode}: "
                 f"{proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            fail(f"gave up waiting for {what}")
        time.sleep(0.05)
    return answer


def mysql() -> None:
    """A ``mysql://`` store URL resolves to the extra's driver (no server needed to see it)."""
    from flowengine.persistence.backends._sql import engine

    url = engine.normalize_url("mysql://flows@127.0.0.1:3306/flows")
    if url.get_driver_name() != "pymysql":
        fail(f"mysql:// resolves to driver {url.get_driver_name()!r}, not PyMySQL")
    import pymysql  # noqa: F401  (installed by the extra)

    print("mysql: mysql:// uses PyMySQL")


def testkit() -> None:
    """The test kit runs a flow with a failure injected and judges its reverts."""
    from flowengine import task
    from flowengine.flows import linear_flow
    from flowengine.testing import TestKit

    class Reserve(task.Task):
        def execute(self) -> str:
            return "reserved"

        def revert(self, **kwargs: object) -> None:
            pass

    class Charge(task.Task):
        def execute(self) -> str:
            return "charged"

    with TestKit() as kit:
        kit.fail_execute("charge")
        outcome = kit.run(linear_flow.Flow("booking").add(Reserve("reserve"), Charge("charge")))
        if outcome.state != "REVERTED":
            fail(f"the test kit's flow ended {outcome.state}, not REVERTED")
    print("testkit: a failed charge reverted")


CHECKS: dict[str, Callable[..., None]] = {
    "modules": lambda *extras: modules(list(extras)),
    "workers": workers,
    "metrics": lambda url: workers(url, metrics=True),
    "board": board,
    "postgres": postgres,
    "dashboard": dashboard,
    "otel": otel,
    "missing": missing,
    "demo": demo,
    "mysql": mysql,
    "testkit": testkit,
}

if __name__ == "__main__":
    for name, *args in json.loads(sys.argv[1]):
        CHECKS[name](*args)
