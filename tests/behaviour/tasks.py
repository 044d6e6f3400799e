"""Atoms the engine behaviour suite runs, importable by name.

Remote workers build a task from its class and name alone and pass it JSON arguments, so every
class here is module-level, takes no constructor arguments of its own (behaviour comes from the
class and from arguments: ``inject``, ``store`` or other atoms' results) and returns JSON values.

Everything an atom does is written to the current :class:`Ledger` as an entry
``{"seq": n, "event": ..., "atom": ..., **data}``. The ledger is pluggable (:func:`use_ledger`):
in-process engines share :class:`MemoryLedger`; worker processes and the test that drives them
share a :class:`FileLedger`. Barriers used to prove concurrency are looked up by key through a
registry that is pluggable in the same way (:class:`LocalBarriers`, :class:`FileBarriers`).

A worker process picks the file-based ones when it imports this module with
``FLOWENGINE_TEST_LEDGER`` (a file path) and ``FLOWENGINE_TEST_BARRIERS`` (a directory) set.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pathlib
import threading
import time
import uuid
from typing import Any, Protocol

from flowengine import retry, task

# ---- the ledger ---------------------------------------------------------------------------------


class Ledger(Protocol):
    """Where atoms write down what they did, in the order they did it."""

    def append(self, entry: dict[str, Any]) -> None:
        """Add ``entry``, giving it the next sequence number as ``seq``."""

    def entries(self) -> list[dict[str, Any]]:
        """Every entry so far, oldest first."""

    def clear(self) -> None:
        """Forget every entry."""


class MemoryLedger:
    """A ledger for engines that run atoms in this process (serial and parallel)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[dict[str, Any]] = []

    def append(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._entries.append({"seq": len(self._entries), **entry})

    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self._entries]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class FileLedger:
    """A ledger several processes share: one JSON line per entry, appended under a file lock.

    Entries come back as JSON gives them (tuples become lists). Each line also says which
    process wrote it: :meth:`entries` leaves that out, :meth:`lines` keeps it (``pid``).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)

    def append(self, entry: dict[str, Any]) -> None:
        with open(self.path, "a+", encoding="utf-8") as file:
            fcntl.flock(file, fcntl.LOCK_EX)  # released when the file closes
            file.seek(0)
            seq = sum(1 for _line in file)
            line = {"seq": seq, **entry, "pid": os.getpid()}
            file.write(json.dumps(line, default=repr) + "\n")

    def lines(self) -> list[dict[str, Any]]:
        """Every entry so far with the ``pid`` of the process that wrote it, oldest first."""
        try:
            with open(self.path, encoding="utf-8") as file:
                fcntl.flock(file, fcntl.LOCK_SH)
                return [json.loads(line) for line in file if line.strip()]
        except FileNotFoundError:
            return []

    def entries(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in line.items() if k != "pid"} for line in self.lines()]

    def clear(self) -> None:
        with open(self.path, "a", encoding="utf-8") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            file.truncate(0)


#: Environment variables a worker process reads when it imports this module.
LEDGER_ENV = "FLOWENGINE_TEST_LEDGER"
BARRIERS_ENV = "FLOWENGINE_TEST_BARRIERS"

_ledger: Ledger = FileLedger(os.environ[LEDGER_ENV]) if LEDGER_ENV in os.environ else MemoryLedger()


def use_ledger(ledger: Ledger) -> Ledger:
    """Make ``ledger`` the one atoms write to; return the previous one."""
    global _ledger
    previous, _ledger = _ledger, ledger
    return previous


def record(event: str, atom: str, **data: Any) -> None:
    """Write one entry to the current ledger."""
    _ledger.append({"event": event, "atom": atom, **data})


def clear() -> None:
    """Forget every entry of the current ledger (in whichever process it is read)."""
    _ledger.clear()


def entries(event: str | None = None) -> list[dict[str, Any]]:
    """Entries of the current ledger (only those of ``event`` when given)."""
    return [e for e in _ledger.entries() if event is None or e["event"] == event]


def names(event: str) -> list[str]:
    """Names of the atoms that wrote ``event``, in order."""
    return [e["atom"] for e in entries(event)]


def first_seq(event: str, atom: str) -> int:
    """Sequence number of ``atom``'s first ``event`` entry (KeyError if there is none)."""
    for e in entries(event):
        if e["atom"] == atom:
            return int(e["seq"])
    raise KeyError(f"no {event!r} entry for {atom!r}")


# ---- barriers (proof that atoms run at the same time) -------------------------------------------


class Barrier(Protocol):
    """The part of :class:`threading.Barrier` atoms and tests use."""

    def wait(self) -> Any:
        """Block until every party arrived; raise ``threading.BrokenBarrierError`` if never."""

    def abort(self) -> None:
        """Break the barrier: waiting and later parties get ``BrokenBarrierError``."""


class BarrierRegistry(Protocol):
    """Where barriers live, by key."""

    def make(self, key: str, parties: int, timeout: float) -> Barrier:
        """Create (or replace) the barrier ``key``."""

    def get(self, key: str) -> Barrier:
        """The barrier ``key`` (KeyError if there is none)."""

    def clear(self) -> None:
        """Abort and forget every barrier."""


class LocalBarriers:
    """Barriers for atoms running in this process."""

    def __init__(self) -> None:
        self._barriers: dict[str, threading.Barrier] = {}

    def make(self, key: str, parties: int, timeout: float) -> Barrier:
        self._barriers[key] = threading.Barrier(parties, timeout=timeout)
        return self._barriers[key]

    def get(self, key: str) -> Barrier:
        return self._barriers[key]

    def clear(self) -> None:
        for barrier in self._barriers.values():
            barrier.abort()
        self._barriers.clear()


class FileBarrier:
    """A single-use barrier across processes: each party arrives by creating a file."""

    #: Seconds between looks at the directory while waiting.
    POLL = 0.005

    def __init__(self, directory: pathlib.Path, key: str, parties: int, timeout: float) -> None:
        self._directory, self._key = directory, key
        self.parties, self.timeout = parties, timeout

    def _arrived(self) -> int:
        return len(list(self._directory.glob(f"{self._key}.arrived.*")))

    def _aborted(self) -> pathlib.Path:
        return self._directory / f"{self._key}.aborted"

    def wait(self) -> int:
        (self._directory / f"{self._key}.arrived.{uuid.uuid4().hex}").touch()
        deadline = time.monotonic() + self.timeout
        while not self._aborted().exists():
            arrived = self._arrived()
            if arrived >= self.parties:
                return arrived - 1
            if time.monotonic() > deadline:
                self.abort()
                break
            time.sleep(self.POLL)
        raise threading.BrokenBarrierError(f"barrier {self._key!r} broke")

    def abort(self) -> None:
        self._aborted().touch()


class FileBarriers:
    """Barriers shared by the processes that see ``directory``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = pathlib.Path(directory)

    def make(self, key: str, parties: int, timeout: float) -> Barrier:
        for stale in self.directory.glob(f"{key}.*"):
            stale.unlink()
        spec = {"parties": parties, "timeout": timeout}
        (self.directory / f"{key}.json").write_text(json.dumps(spec), encoding="utf-8")
        return FileBarrier(self.directory, key, parties, timeout)

    def get(self, key: str) -> Barrier:
        try:
            spec = json.loads((self.directory / f"{key}.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise KeyError(key) from None
        return FileBarrier(self.directory, key, spec["parties"], spec["timeout"])

    def clear(self) -> None:
        for spec in self.directory.glob("*.json"):
            FileBarrier(self.directory, spec.stem, 0, 0.0).abort()
        for path in self.directory.iterdir():
            path.unlink()


_barriers: BarrierRegistry = (
    FileBarriers(os.environ[BARRIERS_ENV]) if BARRIERS_ENV in os.environ else LocalBarriers()
)


def make_barrier(key: str, parties: int, timeout: float = 5.0) -> Barrier:
    """Create the barrier ``Rendezvous`` atoms with ``barrier=key`` wait on."""
    return _barriers.make(key, parties, timeout)


def use_barriers(registry: BarrierRegistry) -> BarrierRegistry:
    """Make ``registry`` the one barriers are made in and found in; return the previous one."""
    global _barriers
    previous, _barriers = _barriers, registry
    return previous


def clear_barriers() -> None:
    """Abort and forget every barrier (a stuck atom fails instead of hanging)."""
    _barriers.clear()


# ---- exceptions atoms raise ---------------------------------------------------------------------


class Boom(RuntimeError):
    """What failing atoms raise (the message names the atom)."""


class RevertBoom(RuntimeError):
    """What atoms whose revert fails raise."""


def _failure_summary(flow_failures: dict[str, Any]) -> dict[str, str]:
    return {name: str(f.exception_str) for name, f in sorted(flow_failures.items())}


def _result_summary(result: Any) -> Any:
    # A Failure is not JSON; record what it says instead.
    if hasattr(result, "exception_str") and hasattr(result, "check"):
        return {"failure": str(result.exception_str)}
    return result


# ---- tasks --------------------------------------------------------------------------------------


class RecordingTask(task.Task):
    """Base: ``revert`` records the result, flow failures and arguments it was given."""

    def revert(self, *args: Any, result: Any = None, flow_failures: Any = None,
               **kwargs: Any) -> str:
        record("revert", self.name, result=_result_summary(result),
               flow_failures=_failure_summary(flow_failures or {}), args=kwargs)
        return f"{self.name} undone"


class Step(RecordingTask):
    """Needs nothing, returns its own name."""

    def execute(self) -> str:
        record("execute", self.name)
        return self.name


class Constant(RecordingTask):
    """Returns its ``value`` argument (give it with ``inject`` or ``rebind``)."""

    def execute(self, value: Any) -> Any:
        record("execute", self.name, value=value)
        return value


class Add(RecordingTask):
    """Returns ``x + y``."""

    def execute(self, x: Any, y: Any) -> Any:
        record("execute", self.name, x=x, y=y)
        return x + y


class Scale(RecordingTask):
    """Returns ``x * factor``; ``factor`` is optional (default 10)."""

    def execute(self, x: Any, factor: int = 10) -> Any:
        record("execute", self.name, x=x, factor=factor)
        return x * factor


class Gather(RecordingTask):
    """Takes whatever ``requires``/``rebind`` give it; returns them as a dict."""

    def execute(self, **kwargs: Any) -> dict[str, Any]:
        record("execute", self.name, args=dict(kwargs))
        return dict(kwargs)


class Greeting(RecordingTask):
    """Provides ``greeting`` unless told otherwise (``default_provides``)."""

    default_provides = "greeting"

    def execute(self, who: str) -> str:
        record("execute", self.name, who=who)
        return f"hello {who}"


class NotJson(RecordingTask):
    """Returns a set: not a JSON value, so no engine may accept it as a result."""

    def execute(self) -> Any:
        record("execute", self.name)
        return {self.name}


class Fail(RecordingTask):
    """Always raises :class:`Boom` naming itself."""

    def execute(self) -> None:
        record("execute", self.name)
        raise Boom(f"{self.name} failed")


class FailUntil(RecordingTask):
    """Fails while ``attempt`` (from a ``Times`` retry) is below ``succeed_at``."""

    def execute(self, attempt: int, succeed_at: int) -> int:
        record("execute", self.name, attempt=attempt)
        if attempt < succeed_at:
            raise Boom(f"{self.name} failed attempt {attempt}")
        return attempt


class FailOn(RecordingTask):
    """Fails when ``value`` (from a ``ForEach``-like retry) is in ``bad``; else returns it."""

    def execute(self, value: Any, bad: list[Any]) -> Any:
        record("execute", self.name, value=value)
        if value in bad:
            raise Boom(f"{self.name} failed with {value!r}")
        return value


class RevertFails(task.Task):
    """Succeeds, but raises :class:`RevertBoom` when reverted."""

    def execute(self) -> str:
        record("execute", self.name)
        return self.name

    def revert(self, *args: Any, **kwargs: Any) -> None:
        record("revert", self.name)
        raise RevertBoom(f"{self.name} revert failed")


class Progress(RecordingTask):
    """Reports progress 0.25, 0.5 and 0.75 while executing."""

    def execute(self) -> str:
        record("execute", self.name)
        for value in (0.25, 0.5, 0.75):
            self.update_progress(value)
        return self.name


class Announcer(RecordingTask):
    """Notifies two events of its own (``found``) while executing."""

    def execute(self) -> str:
        for count in (1, 2):
            self.notifier.notify("found", {"count": count})
        return self.name


class WildProgress(Step):
    """Reports progress outside 0.0-1.0 (7.0, then -1.0)."""

    def execute(self) -> str:
        self.update_progress(7.0)
        self.update_progress(-1.0)
        return super().execute()


class HalfThenFail(RecordingTask):
    """Reports progress 0.5, then raises :class:`Boom`."""

    def execute(self) -> None:
        self.update_progress(0.5)
        record("execute", self.name)
        raise Boom(f"{self.name} failed half way")


class InspectFailures(Step):
    """Records how the flow failures given to its ``revert`` look (type, check, message)."""

    def revert(self, *args: Any, result: Any = None, flow_failures: Any = None,
               **kwargs: Any) -> None:
        from flowengine.types.failure import Failure

        record("revert", self.name, failures={
            name: {"is_failure": isinstance(f, Failure),
                   "checks_as_boom": f.check(Boom) is not None,
                   "checks_by_name": f.check(f"{Boom.__module__}.Boom") is not None,
                   "message": f.exception_str}
            for name, f in (flow_failures or {}).items()})


class WhereAmI(RecordingTask):
    """Records and returns the name of the thread it runs on."""

    def execute(self) -> str:
        thread = threading.current_thread().name
        record("execute", self.name, thread=thread)
        return thread


class Rendezvous(RecordingTask):
    """Waits on the barrier named ``barrier`` (fails if the others never arrive)."""

    def execute(self, barrier: str) -> str:
        record("execute", self.name)
        _barriers.get(barrier).wait()
        record("passed-barrier", self.name)
        return self.name


class RendezvousThenFail(Rendezvous):
    """Waits on its barrier, then fails (several failures at the same time)."""

    def execute(self, barrier: str) -> str:
        super().execute(barrier)
        raise Boom(f"{self.name} failed")


# ---- atoms that read their context and stop when asked (cancel, deadline) ----------------


#: Seconds an atom waiting to be cancelled waits at most (a test that never cancels fails).
CANCEL_PATIENCE = 30.0


def context_record() -> dict[str, Any]:
    """What the running call's context says, as a ledger entry's fields."""
    from flowengine import context

    ctx = context.current()
    return {**ctx.ids(), "request_attempt": ctx.request_attempt, "deadline": ctx.deadline,
            "cancel_requested": ctx.cancel_requested}


class _LedgerHandler(logging.Handler):
    """Writes each record's message and the ids a context logger adds to the ledger (the
    test reads what a worker process logged as it reads what it did)."""

    def emit(self, record: logging.LogRecord) -> None:
        ids = {key: getattr(record, key, None)
               for key in ("flow_uuid", "flow_name", "atom_name", "action", "attempt")}
        _ledger.append({"event": "log", "atom": ids["atom_name"],
                        "message": record.getMessage(), **ids})


#: The logger :class:`ContextProbe` adapts with its context (its records go to the ledger).
PROBE_LOGGER = logging.getLogger("behaviour.context_probe")
PROBE_LOGGER.addHandler(_LedgerHandler())
PROBE_LOGGER.setLevel(logging.INFO)
PROBE_LOGGER.propagate = False


class ContextProbe(RecordingTask):
    """Records its context in ``execute`` and in ``revert``, and logs through a logger its
    context adapts."""

    def execute(self) -> str:
        from flowengine import context

        record("execute", self.name, context=context_record())
        context.current().adapt(PROBE_LOGGER).info("probing %s", self.name)
        return self.name

    def revert(self, *args: Any, **kwargs: Any) -> None:
        record("revert", self.name, context=context_record())


class UntilCancelled(RecordingTask):
    """Meets the test at the barrier named ``barrier``, then polls its context until its flow
    is cancelled; records what it saw and returns (or, with ``raise_it``, raises through
    ``raise_if_cancelled``)."""

    def execute(self, barrier: str, raise_it: bool = False) -> str:
        from flowengine import context

        ctx = context.current()
        record("execute", self.name)
        _barriers.get(barrier).wait()
        if not ctx.wait(CANCEL_PATIENCE):
            raise Boom(f"{self.name} was never asked to stop")
        record("stopped", self.name, reason=ctx.cancel_reason)
        if raise_it:
            ctx.raise_if_cancelled()
        return self.name


# ---- atoms that fail while a fault file exists (repairs) ----------------------------------


class RevertFailsWhile(RecordingTask):
    """Returns its name; its ``revert`` fails while the file ``fault`` exists, and records the
    result it was given either way."""

    def execute(self, fault: str) -> str:
        record("execute", self.name)
        return f"{self.name}-resource"

    def revert(self, fault: str, result: Any = None, flow_failures: Any = None,
               **kwargs: Any) -> str:
        if os.path.exists(fault):
            record("revert-failed", self.name, result=_result_summary(result))
            raise RevertBoom(f"{self.name} revert failed: {fault} exists")
        record("revert", self.name, result=_result_summary(result))
        return f"{self.name} undone"


class FailWhile(RecordingTask):
    """Fails its execute while the file ``fault`` exists."""

    def execute(self, fault: str) -> str:
        record("execute", self.name)
        if os.path.exists(fault):
            raise Boom(f"{self.name} failed: {fault} exists")
        return self.name


# ---- atoms whose outcome the wire cannot carry (the integration bad-input tests) -----------------


class Unsendable(RecordingTask):
    """Returns a value JSON cannot encode: a worker must answer that it cannot send it."""

    def execute(self) -> Any:
        record("execute", self.name)
        return {"not json": object()}


class UnsendableError(RecordingTask):
    """Raises :class:`Boom` with an argument JSON cannot encode."""

    def execute(self) -> None:
        record("execute", self.name)
        raise Boom(f"{self.name} failed", object())


# ---- retry controllers that also record ---------------------------------------------------


class RecordingTimes(retry.Times):
    """A ``Times`` retry that records each attempt it starts and each decision it makes."""

    def execute(self, history: Any, *args: Any, **kwargs: Any) -> int:
        attempt = super().execute(history, *args, **kwargs)
        record("retry-execute", self.name, attempt=attempt)
        return attempt

    def on_failure(self, history: Any, *args: Any, **kwargs: Any) -> Any:
        decision = super().on_failure(history, *args, **kwargs)
        record("retry-decision", self.name, decision=str(decision), attempts=len(history))
        return decision

    def revert(self, history: Any, *args: Any, **kwargs: Any) -> None:
        record("revert", self.name, attempts=len(history))


class BrokenRetry(retry.Times):
    """A retry whose ``execute`` raises."""

    def execute(self, history: Any, *args: Any, **kwargs: Any) -> int:
        record("retry-execute", self.name)
        raise Boom(f"{self.name} cannot start")


class UndecidedRetry(retry.Times):
    """A retry whose ``on_failure`` raises instead of deciding."""

    def on_failure(self, history: Any, *args: Any, **kwargs: Any) -> Any:
        record("retry-decision", self.name)
        raise RevertBoom(f"{self.name} cannot decide")


# ---- functions for functor tasks ----------------------------------------------------------------


def double(x: Any) -> Any:
    """Twice ``x``."""
    return x * 2


def plus(a: Any, b: Any) -> Any:
    """``a + b``."""
    return a + b


def undo_double(x: Any, result: Any, flow_failures: Any) -> None:
    """Revert of :func:`double`: records what it was given."""
    record("revert", "double", x=x, result=result, flow_failures=sorted(flow_failures))
