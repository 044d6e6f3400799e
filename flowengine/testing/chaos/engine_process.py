"""The engine process of ``flowengine chaos``: keeps flows running, resumes them when restarted.

    python -m flowengine.testing.chaos.engine_process CONFIG.json

It runs instances of the flow on the worker-based engine, ``concurrency`` at a time, each saved
in a logbook of its own (``<prefix>-<n>``, instance ``n`` gets ``chaos_instance=n`` in its
store) before it starts. Started again after being killed, it first resumes every stored
instance that has not ended, then goes on starting new ones. Once the drain file exists it
starts no more and exits when the running ones end.

Everything it sees goes to its log (JSON lines, one ``write`` each): ``engine-start``,
``flow-start`` / ``flow-resume`` (with the ids of the requests the stored record says were
sent, :func:`recorded_requests`), every ``atom`` state change (stored first, then logged, with
the ids of the atom's requests recorded so far), ``flow-end`` with the state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import os
import sys
import threading
import time
import uuid as uuid_mod
from pathlib import Path
from typing import Any

from flowengine import engines, states
from flowengine.engines.actions import META_ATTEMPT_IDS
from flowengine.persistence import backends, models
from flowengine.types.notifier import Notifier

#: Flow states a run ends in.
ENDED = frozenset({states.SUCCESS, states.REVERTED, states.FAILURE})
#: Seconds between looks at the drain file while the flows run.
LOOK = 0.2


@dataclasses.dataclass(frozen=True)
class Config:
    """What the orchestrator tells its engine process (written as JSON)."""

    factory: str
    args: list[Any]
    kwargs: dict[str, Any]
    store: dict[str, Any]
    backend: str
    prefix: str
    broker: dict[str, Any]
    topic: str
    concurrency: int
    log: str
    drain: str
    ready: str
    options: dict[str, Any]

    def save(self, path: Path) -> None:
        """Write it to ``path``."""
        path.write_text(json.dumps(dataclasses.asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Config:
        """Read what :meth:`save` wrote."""
        return cls(**json.loads(path.read_text(encoding="utf-8")))


class Log:
    """The engine's log: one JSON line per ``write`` on an ``O_APPEND`` descriptor."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, event: str, **fields: Any) -> None:
        line = {"event": event, "t": time.time(), "pid": os.getpid(), **fields}
        os.write(self._fd, (json.dumps(line, default=repr) + "\n").encode("utf-8"))


def recorded_requests(flow_detail: models.FlowDetail) -> dict[str, list[str]]:
    """The ids of the requests each atom's record says were sent (atom uuid -> ids).

    An engine stores a request's id with its atom before it publishes the request, so the
    certificate can tell a request some engine recorded (and may have sent before its atom
    completed) from one an engine sent without being able to record it. A resumed run
    overwrites them: read them as it starts, and with every atom change.
    """
    found = {}
    for atom in flow_detail:
        ids = [i for i in (atom.meta or {}).get(META_ATTEMPT_IDS) or () if isinstance(i, str)]
        if ids:
            found[atom.uuid] = ids
    return found


def atom_requests(flow_detail: models.FlowDetail, atom_uuid: str | None) -> list[str]:
    """The request ids recorded with one atom (see :func:`recorded_requests`)."""
    atom = flow_detail.find(atom_uuid) if atom_uuid else None
    if atom is None:
        return []
    return [i for i in (atom.meta or {}).get(META_ATTEMPT_IDS) or () if isinstance(i, str)]


def _factory(name: str) -> Any:
    module, _, attr = name.partition(":")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


class Runner:
    """Runs and resumes the instances of one flow (see the module docstring)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.log = Log(config.log)
        self.backend = backends.fetch(config.backend)
        with contextlib.closing(self.backend.get_connection()) as conn:
            conn.upgrade()
        self._factory = _factory(config.factory)
        self._running: set[str] = set()
        self._changed = threading.Condition()

    def _options(self) -> dict[str, Any]:
        return {"engine": "worker-based", "topics": [self.config.topic], "events": False,
                **self.config.broker, **self.config.options}

    def _store(self, instance: int) -> dict[str, Any]:
        return {**self.config.store, "chaos_instance": instance}

    def _books(self) -> list[models.LogBook]:
        with contextlib.closing(self.backend.get_connection()) as conn:
            return [b for b in conn.get_logbooks() if b.name.startswith(f"{self.config.prefix}-")]

    def resume_all(self) -> int:
        """Resume every stored instance that has not ended; return the highest instance
        number stored."""
        highest = 0
        for book in self._books():
            instance = int(book.name.rsplit("-", 1)[1])
            highest = max(highest, instance)
            for detail in book:
                if detail.state not in ENDED:
                    self._start(instance, detail, resumed=True)
        return highest

    def start_new(self, instance: int) -> None:
        """Save instance ``instance`` in a logbook of its own, then start it."""
        flow = self._factory(*self.config.args, **self.config.kwargs)
        detail = models.FlowDetail(name=getattr(flow, "name", "flow"), uuid=str(uuid_mod.uuid4()))
        book = models.LogBook(f"{self.config.prefix}-{instance}")
        book.add(detail)
        with contextlib.closing(self.backend.get_connection()) as conn:
            conn.save_logbook(book)
        self._start(instance, detail, resumed=False, flow=flow)

    def _start(self, instance: int, detail: models.FlowDetail, resumed: bool,
               flow: Any = None) -> None:
        flow = flow if flow is not None else self._factory(*self.config.args,
                                                           **self.config.kwargs)
        # The store again on a resume: the engine may have died before it was saved.
        engine = engines.load(flow, store=self._store(instance), flow_detail=detail,
                              backend=self.backend, **self._options())
        uuid = engine.storage.flow_uuid
        engine.atom_notifier.register(Notifier.ANY, self._atom_logger(engine))
        with self._changed:
            self._running.add(uuid)
        self.log("flow-resume" if resumed else "flow-start", flow=uuid, instance=instance,
                 recorded=recorded_requests(engine.storage.flow_detail))
        threading.Thread(target=self._run, args=(engine, uuid), daemon=True,
                         name=f"chaos-flow-{instance}").start()

    def _atom_logger(self, engine: Any) -> Any:
        storage = engine.storage

        def logged(state: str, details: dict[str, Any]) -> None:
            atom_uuid = details.get("task_uuid") or details.get("retry_uuid")
            self.log("atom", flow=storage.flow_uuid, state=state,
                     atom=details.get("task_name") or details.get("retry_name"),
                     atom_uuid=atom_uuid, ids=atom_requests(storage.flow_detail, atom_uuid))
        return logged

    def _run(self, engine: Any, uuid: str) -> None:
        error = None
        try:
            engine.run()
        except Exception as err:  # the flow's own failure: recorded, the next one starts
            error = f"{type(err).__name__}: {err}"
        self.log("flow-end", flow=uuid, state=str(engine.storage.get_flow_state()),
                 error=error)
        with self._changed:
            self._running.discard(uuid)
            self._changed.notify_all()

    def serve(self) -> None:
        """Resume, then keep ``concurrency`` flows running until drained; return once the
        last one ended."""
        self.log("engine-start")
        instance = self.resume_all()
        Path(self.config.ready).touch()
        drain = Path(self.config.drain)
        while not drain.exists():
            with self._changed:
                free = self.config.concurrency - len(self._running)
            for _ in range(max(free, 0)):
                instance += 1
                self.start_new(instance)
            with self._changed:
                self._changed.wait(LOOK)
        with self._changed:
            self._changed.wait_for(lambda: not self._running)
        self.log("engine-drained")


def main(argv: list[str] | None = None) -> None:
    """Run the engine process of the config file named on the command line."""
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if os.getcwd() not in sys.path:  # the flow's module in the current directory
        sys.path.insert(0, os.getcwd())
    Runner(Config.load(Path(args[0]))).serve()
    logging.shutdown()
    os._exit(0)  # nothing left to wait for: the broker client's threads must not hold it


if __name__ == "__main__":
    main()
