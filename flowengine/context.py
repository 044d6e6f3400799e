"""The task's context: who and what a running ``execute`` or ``revert`` call is.

Inside a task's ``execute`` or ``revert``, on every engine (serial, parallel, worker-based), in
a worker process, in a thread of its own or in an ``async def``, :func:`current` says which flow
and atom the call belongs to, which attempt it is, where it runs, the flow's deadline, and
whether the call has been asked to stop::

    from flowengine import context, task

    class CopyVolume(task.Task):
        def execute(self, volume_id):
            ctx = context.current()
            ctx.logger.info("copying %s", volume_id)   # the record carries the flow/atom ids
            for chunk in chunks(volume_id):
                ctx.raise_if_cancelled()                # the flow is being cancelled: stop here
                copy(chunk)

A call is asked to stop when its flow is cancelled (``engine.cancel``, ``flowengine cancel``, a
deadline). Stopping is cooperative: a task that looks (:attr:`TaskContext.cancel_requested`,
:meth:`TaskContext.raise_if_cancelled`, :meth:`TaskContext.wait`) stops early; one that does
not runs to its end, and what it did is reverted with the rest. An ``async def`` task is also
interrupted at its next ``await`` (:class:`asyncio.CancelledError`). A ``revert`` is never
asked to stop: it is what a cancel runs.

The context lives in a :mod:`contextvars` variable set where the call runs, so it follows the
call onto the thread (or asyncio task) that runs it, and nothing else sees it. Outside a call,
:func:`current` returns a detached context (no ids, never cancelled), so a task's ``execute``
can still be called directly in a unit test. A TaskFlow program that never asks sees no
difference.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from flowengine import exceptions as exc

__all__ = ["CancelSignal", "TaskContext", "bound", "current"]

LOG = logging.getLogger(__name__)

#: The logger :attr:`TaskContext.logger` adapts.
TASK_LOGGER = "flowengine.task"


class CancelSignal:
    """Whether (and why) a call was asked to stop; set once, from any thread.

    The engine holds one per run for its local calls; a worker holds one per request.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = threading.Event()
        self._reason: str | None = None
        self._callbacks: list[Callable[[str], None]] = []

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for."""
        return self._set.is_set()

    @property
    def reason(self) -> str | None:
        """Why (None until asked)."""
        return self._reason

    def request(self, reason: str) -> bool:
        """Ask the calls listening to stop, saying why; False if it was asked already."""
        with self._lock:
            if self._set.is_set():
                return False
            self._reason = reason
            self._set.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _call(callback, reason)
        return True

    def on_request(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(reason)`` once a stop is asked (at once if it was already); return
        what stops listening (the call ended first)."""
        with self._lock:
            if not self._set.is_set():
                self._callbacks.append(callback)
                return lambda: self._forget(callback)
        _call(callback, self._reason or "")
        return lambda: None

    def _forget(self, callback: Callable[[str], None]) -> None:
        with self._lock:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(callback)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop is asked or ``timeout`` seconds passed; whether it was asked."""
        return self._set.wait(timeout)


def _call(callback: Callable[[str], None], reason: str) -> None:
    try:
        callback(reason)
    except Exception:  # one listener failing must not keep the others from hearing it
        LOG.exception("Cancel callback %r failed", callback)


class _Uncancellable(CancelSignal):
    def request(self, reason: str) -> bool:
        return False  # shared by every revert and detached context: never set


#: Never set: the signal of a detached context and of every revert.
NEVER_CANCELLED: CancelSignal = _Uncancellable()


@dataclasses.dataclass(frozen=True)
class TaskContext:
    """Who and what one ``execute`` or ``revert`` call is (read it with :func:`current`).

    Attributes:
        flow_uuid: The flow detail's uuid (None outside a flow).
        flow_name: The flow's name.
        atom_name: The task's name in the flow.
        atom_uuid: The task's atom detail uuid.
        action: ``"execute"`` or ``"revert"`` (None outside a call).
        attempt: 1, or the attempt of the innermost retry controller around the task (2 for
            the first retry of its subflow).
        request_id: The id of the worker request carrying the call (None on local engines).
        request_attempt: 1, or more when a worker-based engine sent the call again (its
            worker was lost or handed it back).
        worker: The worker running it (None on local engines).
        deadline: When the flow's deadline expires, in seconds since the epoch (None: none).
    """

    flow_uuid: str | None = None
    flow_name: str | None = None
    atom_name: str | None = None
    atom_uuid: str | None = None
    action: str | None = None
    attempt: int = 1
    request_id: str | None = None
    request_attempt: int = 1
    worker: str | None = None
    deadline: float | None = None
    signal: CancelSignal = dataclasses.field(default=NEVER_CANCELLED, repr=False, compare=False)

    @property
    def cancel_requested(self) -> bool:
        """Whether this call was asked to stop (its flow is being cancelled)."""
        return self.signal.requested

    @property
    def cancel_reason(self) -> str | None:
        """Why it was asked to stop (None while it was not)."""
        return self.signal.reason

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~flowengine.exceptions.FlowCancelled` if this call was asked to stop.

        Raised from ``execute``, it fails the task like any exception; the flow is being
        cancelled, so no retry controller retries it and the task is reverted with the rest.
        """
        if self.signal.requested:
            reason = self.signal.reason
            raise exc.FlowCancelled(
                f"Task {self.atom_name!r} of flow {self.flow_name!r} ({self.flow_uuid}) stopped: "
                f"its flow is being cancelled ({reason})", reason=reason)

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds, waking early if this call is asked to stop;
        return whether it was (a pause between polls that a cancel cuts short)."""
        return self.signal.wait(timeout)

    def ids(self) -> dict[str, Any]:
        """The identifying fields as a dict (what :attr:`logger` adds to its records)."""
        return {"flow_uuid": self.flow_uuid, "flow_name": self.flow_name,
                "atom_name": self.atom_name, "atom_uuid": self.atom_uuid,
                "action": self.action, "attempt": self.attempt, "request_id": self.request_id,
                "worker": self.worker}

    @property
    def logger(self) -> logging.LoggerAdapter:  # type: ignore[type-arg]
        """A logger (``flowengine.task``) whose records carry this call's ids."""
        return self.adapt(logging.getLogger(TASK_LOGGER))

    def adapt(self, logger: logging.Logger) -> logging.LoggerAdapter:  # type: ignore[type-arg]
        """``logger`` adapted so its records carry this call's ids.

        Each record gets the attributes of :meth:`ids` (for a structured handler or a format
        such as ``%(flow_uuid)s``) and, when tracing is on, ``otelTraceID`` and ``otelSpanID``
        of the task's span; its message starts with ``[flow name/atom name]``.
        """
        return _ContextAdapter(logger, self)

    def replace(self, **changes: Any) -> TaskContext:
        """A copy with ``changes`` (the signal stays the same unless given)."""
        return dataclasses.replace(self, **changes)


def make(**fields: Any) -> TaskContext:
    """A :class:`TaskContext` with ``fields`` (the others at their defaults), built without the
    frozen dataclass's checked assignment of each field: an engine makes one per atom."""
    ctx = object.__new__(TaskContext)
    ctx.__dict__.update(fields)
    return ctx


class _ContextAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    def __init__(self, logger: logging.Logger, ctx: TaskContext) -> None:
        super().__init__(logger, ctx.ids())
        self._ctx = ctx

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]
                ) -> tuple[Any, MutableMapping[str, Any]]:
        extra: dict[str, Any] = dict(self.extra or {})
        extra.update(_trace_ids())
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        ctx = self._ctx
        return f"[{ctx.flow_name}/{ctx.atom_name}] {msg}", kwargs


def _trace_ids() -> Mapping[str, str]:
    """The current span's trace and span ids, as the tracing log filter names them (none
    when tracing is off)."""
    from flowengine import tracing

    return tracing.current_ids()


#: What may be current: a context, or what makes it when a task first asks (an engine makes
#: the context of every call it starts, and most tasks never ask).
Binding = TaskContext | Callable[[], TaskContext]

_CURRENT: contextvars.ContextVar[Binding | None] = contextvars.ContextVar(
    "flowengine_task_context", default=None)
_DETACHED = TaskContext()


def _resolved(binding: Binding | None) -> TaskContext | None:
    if binding is None or isinstance(binding, TaskContext):
        return binding
    return binding()


def current() -> TaskContext:
    """The context of the ``execute``/``revert`` call running here (a detached one, with no
    ids and never cancelled, outside any)."""
    return _resolved(_CURRENT.get()) or _DETACHED


def active() -> TaskContext | None:
    """The context set here, or None (engines and workers use it; tasks use :func:`current`)."""
    return _resolved(_CURRENT.get())


def carried() -> Binding | None:
    """What is current here, as it was set (for an executor to set it where the call runs)."""
    return _CURRENT.get()


class bound:  # noqa: N801 - used as a function: ``with context.bound(ctx):``
    """Make ``ctx`` (a context, or what makes it on first use) current inside the ``with``
    block; nothing changes for None.

    A class rather than a generator: engines enter one for every call they start.
    """

    __slots__ = ("_ctx", "_token")

    def __init__(self, ctx: Binding | None) -> None:
        self._ctx = ctx
        self._token: contextvars.Token[Binding | None] | None = None

    def __enter__(self) -> None:
        if self._ctx is not None:
            self._token = _CURRENT.set(self._ctx)

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None
