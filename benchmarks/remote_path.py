"""How far one remote request travels through the code, and how much live state holds it.

Issue 26 measures the remote wing by what one request crosses, not by lines: this script runs
one worker-based flow of one no-op task with its worker in the same process on the in-memory
transport (flowengine's, and TaskFlow's when it is installed), once to warm up, then once more
with a profiler that records every module whose Python code runs from ``engine.run()`` until it
returns, on any thread. Reported per project: ``modules`` (how many), ``engine_thread``
(those run on the engine's own thread), ``other_threads`` (the worker's and the broker
client's threads), and the sorted module names. The same flow is then run, measured the same
way, on the project's serial engine: ``remote_only`` counts the modules the worker-based run
crossed and the serial one did not (``remote_names``), the request's own path without the
engine core every engine shares (compiling, storing, the run loop). That is the figure issue
26's "about 20 modules" and TaskFlow's "about 15" compare with; ``modules`` is the whole run's.

It also counts, by reading flowengine's source, the process-global live state the design
carries: ``registries`` (module-level names bound to a mutable container: a dict, list, set,
deque, weak dictionary or ``threading.local``; one made filled and named in capitals is a
table of constants and is left out),
``fork_hooks`` (``os.register_at_fork`` calls) and ``exit_hooks`` (``atexit.register``).
Prints one JSON document. Example::

    python benchmarks/remote_path.py
    python benchmarks/remote_path.py --no-taskflow --list
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Calls that make a module-level name a mutable container.
_CONTAINER_CALLS = {"dict", "list", "set", "deque", "defaultdict", "OrderedDict", "Counter",
                    "WeakValueDictionary", "WeakKeyDictionary", "WeakSet", "local"}


class _Modules:
    """Modules of one project whose code ran while measuring, by the thread it ran on.

    The profiler is set before the worker and the engine start their threads (a profiler
    cannot be set on a thread already running): it records only while :attr:`on`.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.on = False
        self.by_thread: dict[str, set[str]] = {}

    def profile(self, frame: FrameType, event: str, _arg: object) -> None:
        if not self.on or event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if isinstance(name, str) and name.startswith(self.prefix):
            self.by_thread.setdefault(threading.current_thread().name, set()).add(name)

    @contextmanager
    def measuring(self) -> Iterator[None]:
        """Record while the block runs."""
        self.on = True
        try:
            yield
        finally:
            self.on = False


@contextmanager
def _profiled(modules: _Modules) -> Iterator[None]:
    """Profile this thread and every thread started in the block."""
    threading.setprofile(modules.profile)
    sys.setprofile(modules.profile)
    try:
        yield
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def _crossed(modules: _Modules) -> set[str]:
    return set().union(*modules.by_thread.values()) if modules.by_thread else set()


def _report(modules: _Modules, local: _Modules, engine_thread: str,
            listed: bool) -> dict[str, Any]:
    every = _crossed(modules)
    own = modules.by_thread.get(engine_thread, set())
    remote = every - _crossed(local)
    row: dict[str, Any] = {"modules": len(every), "engine_thread": len(own),
                           "other_threads": len(every - own), "remote_only": len(remote)}
    if listed:
        row["names"] = sorted(every)
        row["remote_names"] = sorted(remote)
    return row


def _serial_run(modules: _Modules, run: Callable[[str], None]) -> None:
    """Run ``run`` (given a flow name) on a serial engine once warm, then once measured."""
    with _profiled(modules):
        run("serial-warm")
        with modules.measuring():
            run("serial-measured")


def _flowengine(listed: bool) -> dict[str, Any]:
    from remote_path_tasks import Noop

    from flowengine import engines
    from flowengine.flows import linear_flow
    from flowengine.worker_based import client
    from flowengine.worker_based.worker import Worker

    modules = _Modules("flowengine")
    exchange, topic = f"remote-path-{uuid.uuid4().hex[:8]}", "remote-path"
    options = {"exchange": exchange, "topics": [topic], "transport": "memory"}
    with _profiled(modules):
        worker = Worker(exchange=exchange, topic=topic, tasks=[Noop], transport="memory",
                        threads_count=1)
        runner = threading.Thread(target=worker.run, kwargs={"display_banner": False},
                                  name="worker", daemon=True)
        runner.start()
        try:
            if not worker.wait(timeout=30):
                raise RuntimeError("the flowengine worker did not start")
            engines.load(linear_flow.Flow("warm").add(Noop("t")), engine="worker-based",
                         **options).run()
            engine = engines.load(linear_flow.Flow("measured").add(Noop("t")),
                                  engine="worker-based", **options)
            with modules.measuring():
                engine.run()
        finally:
            worker.stop(grace=5)
            runner.join(timeout=10)
            client.close_all()
    local = _Modules("flowengine")
    _serial_run(local, lambda name: engines.load(
        linear_flow.Flow(name).add(Noop("t")), engine="serial").run())
    return _report(modules, local, threading.current_thread().name, listed)


def _taskflow(listed: bool) -> dict[str, Any]:
    from remote_path_tasks import TaskflowNoop
    from taskflow import engines
    from taskflow.engines.worker_based import worker as tf_worker
    from taskflow.patterns import linear_flow

    modules = _Modules("taskflow")
    exchange, topic = f"remote-path-tf-{uuid.uuid4().hex[:8]}", "remote-path"
    options = {"exchange": exchange, "topics": [topic], "transport": "memory"}
    with _profiled(modules):
        worker = tf_worker.Worker(exchange, topic, [TaskflowNoop], transport="memory")
        runner = threading.Thread(target=worker.run, name="worker", daemon=True)
        runner.start()
        try:
            worker.wait()
            engines.load(linear_flow.Flow("warm").add(TaskflowNoop("t")),
                         engine="worker-based", **options).run()
            engine = engines.load(linear_flow.Flow("measured").add(TaskflowNoop("t")),
                                  engine="worker-based", **options)
            with modules.measuring():
                engine.run()
        finally:
            worker.stop()
            runner.join(timeout=10)
    local = _Modules("taskflow")
    _serial_run(local, lambda name: engines.load(
        linear_flow.Flow(name).add(TaskflowNoop("t")), engine="serial").run())
    return _report(modules, local, threading.current_thread().name, listed)


def _container(value: ast.expr) -> str | None:
    """"empty" or "filled" for a container expression, else None."""
    if isinstance(value, ast.Dict):
        return "filled" if value.keys else "empty"
    if isinstance(value, (ast.List, ast.Set)):
        return "filled" if value.elts else "empty"
    if isinstance(value, (ast.DictComp, ast.ListComp, ast.SetComp)):
        return "filled"
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in _CONTAINER_CALLS:
            return "filled" if value.args or value.keywords else "empty"
    return None


def live_state(package: pathlib.Path) -> dict[str, Any]:
    """Module-level mutable containers and fork/exit hooks in ``package``'s source."""
    registries: list[str] = []
    fork_hooks = exit_hooks = 0
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        for node in tree.body:
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            kind = None if value is None else _container(value)
            if kind is None:
                continue
            for target in targets:
                # A container made empty is filled as the process runs, whatever its name; a
                # filled one named in capitals is a table of constants.
                if isinstance(target, ast.Name) and target.id != "__all__" and (
                        kind == "empty" or not target.id.isupper()):
                    registries.append(f"{module}.{target.id}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                called = (getattr(owner, "id", ""), node.func.attr)
                fork_hooks += called == ("os", "register_at_fork")
                exit_hooks += called == ("atexit", "register")
    return {"registries": len(registries), "registry_names": registries,
            "fork_hooks": fork_hooks, "exit_hooks": exit_hooks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-taskflow", action="store_true", help="measure flowengine only")
    parser.add_argument("--list", action="store_true", help="list the modules crossed")
    args = parser.parse_args()
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    started = time.monotonic()
    report: dict[str, Any] = {"benchmark": "remote_path", "python": sys.version.split()[0],
                              "transport": "memory", "flowengine": _flowengine(args.list)}
    if not args.no_taskflow:
        try:
            report["taskflow"] = _taskflow(args.list)
        except ImportError as err:
            report["taskflow"] = {"error": f"TaskFlow is not installed: {err}"}
    import flowengine
    report["live_state"] = live_state(pathlib.Path(flowengine.__file__).parent)
    report["seconds"] = round(time.monotonic() - started, 2)
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
