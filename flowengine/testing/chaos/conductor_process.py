"""A conductor process of ``flowengine chaos --board``: the conductor ``flowengine conductor``
runs, with the tool's eyes inside.

    python -m flowengine.testing.chaos.conductor_process CONFIG.json NAME

It claims the session's jobs from its board and runs their flows on the worker-based engine,
as ``flowengine conductor --engine worker-based`` does: the same
:class:`~flowengine.conductors.backends.impl_nonblocking.NonBlockingConductor`, its claims
kept alive as leases, every write of a job's progress fenced by its claim, an engine whose
claim lapsed halted without reverting anything. SIGTERM (or SIGINT) stops it as it stops
``flowengine conductor``: no more claims, running jobs suspended and handed back; a second one
exits at once.

What it does with each job goes to the session's conductor log (JSON lines, one ``write``
each, several processes appending): ``job-claimed`` when its engine starts (with the ids of
the requests the stored record says were sent), every ``atom`` state change of the job's flow
(stored first, then logged: a write the claim's fence refused is never logged; with the ids of
the atom's requests recorded so far), ``job-released`` when the run ends, with the flow's
state and what the run raised (``RunHalted``: the claim was lost). Each line names the claim
it was made under (this process's pid and the job's attempt), which is how the certificate
tells the conductor that took a job over from the one a fault struck.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from flowengine.conductors.backends.impl_nonblocking import NonBlockingConductor
from flowengine.jobs import backends as boards
from flowengine.jobs.base import Job
from flowengine.persistence import backends
from flowengine.testing.chaos.engine_process import Log, atom_requests, recorded_requests
from flowengine.types.notifier import Notifier, register_deregister


@dataclasses.dataclass(frozen=True)
class Config:
    """What the orchestrator tells its conductor processes (written as JSON)."""

    board: dict[str, Any]
    backend: str
    engine_options: dict[str, Any]
    max_jobs: int
    log: str
    ready_dir: str

    def save(self, path: Path) -> None:
        """Write it to ``path``."""
        path.write_text(json.dumps(self.__dict__), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Config:
        """Read what :meth:`save` wrote."""
        return cls(**json.loads(path.read_text(encoding="utf-8")))


class _JobLog:
    """Entered around one job's run: logs its claim, its flow's atom changes and its end."""

    def __init__(self, log: Log, conductor: str, job: Job, engine: Any) -> None:
        self._log, self._engine = log, engine
        storage = engine.storage
        self._fields = {"conductor": conductor, "job": job.uuid, "flow": storage.flow_uuid,
                        "claim": f"{os.getpid()}/{job.uuid}/{job.attempts}"}
        self._stack = contextlib.ExitStack()

    def _atom(self, state: str, details: dict[str, Any]) -> None:
        atom_uuid = details.get("task_uuid") or details.get("retry_uuid")
        self._log("atom", state=state, atom=details.get("task_name") or details.get("retry_name"),
                  atom_uuid=atom_uuid,
                  ids=atom_requests(self._engine.storage.flow_detail, atom_uuid), **self._fields)

    def __enter__(self) -> _JobLog:
        self._log("job-claimed", recorded=recorded_requests(self._engine.storage.flow_detail),
                  **self._fields)
        self._stack.enter_context(
            register_deregister(self._engine.atom_notifier, Notifier.ANY, self._atom))
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stack.close()
        try:
            state = str(self._engine.storage.get_flow_state())
        except Exception:  # what is in memory is all that is asked; never mask the run's end
            state = "?"
        self._log("job-released", state=state, error=kind.__name__ if kind else None,
                  **self._fields)


class LoggedConductor(NonBlockingConductor):
    """``flowengine conductor``'s conductor, logging what it does with each job."""

    def __init__(self, *args: Any, chaos_log: Log, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._chaos_log = chaos_log

    def _listeners_from_job(self, job: Job, engine: Any) -> list[Any]:
        return [*super()._listeners_from_job(job, engine),
                _JobLog(self._chaos_log, self.name, job, engine)]


def main(argv: list[str] | None = None) -> None:
    """Run the conductor the config file and name on the command line describe until
    signalled."""
    from flowengine.cli.signal_relay import SignalRelay

    config_path, name = (sys.argv[1:] if argv is None else argv)[:2]
    config = Config.load(Path(config_path))
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if os.getcwd() not in sys.path:  # the flow's module in the current directory
        sys.path.insert(0, os.getcwd())
    log = Log(config.log)
    persistence = backends.fetch(config.backend)
    board = boards.fetch(name, dict(config.board), persistence=persistence)
    board.connect()
    conductor = LoggedConductor(name, board, persistence=persistence, engine="worker-based",
                                engine_options=config.engine_options,
                                max_simultaneous_jobs=config.max_jobs, chaos_log=log)
    stopping = threading.Event()

    def stop(_signum: Any) -> None:
        if not stopping.is_set():
            stopping.set()
            conductor.stop()

    SignalRelay(stop, "flowengine-chaos-conductor-signals", again="exit").install()
    # Registered and connected: the orchestrator may count on it from here.
    board.register_entity(conductor.conductor)
    log("conductor-start", conductor=name)
    (Path(config.ready_dir) / f"{name}.ready").touch()
    try:
        conductor.run()
    finally:
        log("conductor-stop", conductor=name)
        logging.shutdown()
        os._exit(0)  # the broker client's threads must not hold the process


if __name__ == "__main__":
    main()
