"""Child processes of ``flowengine rehearse`` and ``flowengine chaos``: workers (flowengine's,
with the tools' eyes inside, or TaskFlow's own) and engines, addressed by pid.

Each child's output goes to a log file in the tool's folder, quoted when it fails. Readiness is
a file the child creates once it serves, never a sleep.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flowengine import task as task_mod

#: Seconds a child gets to start serving.
START_TIMEOUT = 60.0
#: Seconds a child gets to exit after SIGTERM before it is killed.
STOP_TIMEOUT = 15.0
#: The environment variable telling a task module shared with TaskFlow which library to use.
TASK_LIBRARY_ENV = "FLOWENGINE_TASK_LIBRARY"


@dataclasses.dataclass(frozen=True)
class BrokerOptions:
    """Where workers and engines meet: the broker options of the ``flowengine`` commands."""

    exchange: str
    url: str | None = None
    transport: str | None = None
    transport_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    taskflow_compat: bool = False

    def engine_options(self) -> dict[str, Any]:
        """What ``engines.load(..., engine="worker-based")`` takes."""
        return {"exchange": self.exchange, "url": self.url, "transport": self.transport,
                "transport_options": dict(self.transport_options) or None,
                "taskflow_compat": self.taskflow_compat}

    def worker_args(self) -> list[str]:
        """The same as :mod:`~flowengine.testing.worker_process` arguments."""
        args = ["--exchange", self.exchange]
        if self.url:
            args += ["--url", self.url]
        if self.transport:
            args += ["--transport", self.transport]
        for key, value in self.transport_options.items():
            args += ["--transport-option", f"{key}={_json(value)}"]
        if self.taskflow_compat:
            args.append("--taskflow-compat")
        return args


def _json(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


def task_specs(classes: Sequence[type[task_mod.Task]]) -> list[str]:
    """``module:Class`` of each task class, as a worker imports it.

    Raises:
        ValueError: A class a worker process could not import by name (defined in
            ``__main__`` or inside a function).
    """
    specs = []
    for cls in classes:
        if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
            raise ValueError(f"task class {cls.__qualname__} (module {cls.__module__}) cannot "
                             f"be imported by a worker process: define it at the top level "
                             f"of an importable module")
        specs.append(f"{cls.__module__}:{cls.__qualname__}")
    return specs


class Child:
    """One child process, addressed by its pid.

    Args:
        name: What it is called in messages and its log file's name.
        argv: Its command line.
        log_dir: Where its output goes.
        env: Extra environment.
        ready: A file it creates once it serves (None: ready at once).
        cwd: Its working directory (None: this process's).
    """

    def __init__(self, name: str, argv: list[str], log_dir: Path,
                 env: Mapping[str, str] | None = None, ready: Path | None = None,
                 cwd: Path | None = None) -> None:
        self.name, self.argv, self.ready_file = name, argv, ready
        self.log_path = log_dir / f"{name}.log"
        environment = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        # Task modules of the current directory, as the tool found them.
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [os.getcwd(), environment.get("PYTHONPATH")]))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=environment, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=cwd)
        self.pid = self.proc.pid
        self.frozen = False

    @property
    def alive(self) -> bool:
        """Whether it still runs."""
        return self.proc.poll() is None

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Return once it serves.

        Raises:
            RuntimeError: It exited, or did not serve within ``timeout``; the message quotes
                its output.
        """
        deadline = time.monotonic() + timeout
        while self.ready_file is not None and not self.ready_file.exists():
            if not self.alive:
                raise RuntimeError(self.failure(f"exited with {self.proc.returncode}"))
            if time.monotonic() >= deadline:
                raise RuntimeError(self.failure(f"did not serve within {timeout}s"))
            time.sleep(0.02)  # polls a file another process creates; nothing to wait on here

    def signal(self, signum: int) -> None:
        """Send ``signum`` (if it still runs)."""
        if self.alive:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        self.signal(signal.SIGKILL)
        self.proc.wait()

    def freeze(self) -> None:
        """SIGSTOP: it stays, silent, until :meth:`thaw`."""
        self.signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        """SIGCONT."""
        self.signal(signal.SIGCONT)
        self.frozen = False

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM (after SIGCONT if frozen), then SIGKILL if still there after ``timeout``;
        return the exit code."""
        if self.frozen:
            self.thaw()
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def log(self, tail: int = 40) -> str:
        """The last ``tail`` lines of its output."""
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(lines[-tail:])

    def failure(self, why: str) -> str:
        """``why``, with its output."""
        return f"{self.name} (pid {self.pid}) {why}\n--- its output\n{self.log()}"


def flowengine_worker(name: str, directory: Path, broker: BrokerOptions, topic: str,
                      specs: Sequence[str], threads: int = 4,
                      extra: Sequence[str] = ()) -> Child:
    """Start a flowengine worker process (:mod:`~flowengine.testing.worker_process`)."""
    ready = directory / f"{name}.ready"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "flowengine.testing.worker_process", *broker.worker_args(),
            "--topic", topic, "--threads", str(threads), "--ready", str(ready), *extra]
    argv += [arg for spec in specs for arg in ("--task", spec)]
    return Child(name, argv, directory, ready=ready)


def taskflow_worker(name: str, directory: Path, broker: BrokerOptions, topic: str,
                    specs: Sequence[str]) -> Child:
    """Start TaskFlow's own worker process (``python -m taskflow.engines.worker_based.worker``)
    with :data:`TASK_LIBRARY_ENV` set to ``taskflow`` (engines find it by polling, as
    TaskFlow's do: it announces nothing)."""
    if not broker.url:
        raise ValueError("TaskFlow workers need a broker URL (--url)")
    argv = [sys.executable, "-m", "taskflow.engines.worker_based.worker",
            "--exchange", broker.exchange, "--connection-url", broker.url, "--topic", topic,
            "--verbose"]
    argv += [arg for spec in specs for arg in ("--task", spec)]
    return Child(name, argv, directory, env={TASK_LIBRARY_ENV: "taskflow"})
