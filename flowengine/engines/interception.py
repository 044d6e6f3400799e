"""Interceptors: code a process runs around every task ``execute`` and ``revert`` it makes.

Every call of a task's ``execute`` or ``revert`` in a process goes through
:func:`~flowengine.engines.executor.execute_task` / ``revert_task`` (or their ``async``
twins), whoever makes it: a serial or parallel engine, or a worker serving a remote request.
An :class:`Interceptor` installed with :func:`installed` is handed each call with the means to
make it (``proceed``), so it can record the call, refuse it (raise instead), or make it twice.
:mod:`flowengine.testing` injects faults and keeps its ledger this way; nothing is installed
otherwise, and then a call costs one empty-tuple check more.

Only the task's own method is wrapped: ``pre_execute``/``post_execute`` (and the revert ones)
run outside, as they do without an interceptor, and whatever the interceptor raises becomes
the call's :class:`~flowengine.types.failure.Failure` as if the method had raised it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from flowengine.task import Task

#: The two actions a task call can be.
EXECUTE = "execute"
REVERT = "revert"


@dataclasses.dataclass(frozen=True)
class TaskCall:
    """One call of a task's method, as an interceptor sees it.

    Attributes:
        task: The task (its ``name`` is the atom's name in the flow).
        action: :data:`EXECUTE` or :data:`REVERT`.
        arguments: The keyword arguments of the call (a revert's include ``result`` and
            ``flow_failures``).
    """

    task: Task
    action: str
    arguments: Mapping[str, Any]


class Interceptor:
    """Runs around task calls; the defaults just make the call.

    Subclasses override :meth:`around` (plain methods) and :meth:`around_async` (``async
    def`` methods). Either may raise instead of calling ``proceed``, or call it more than
    once; what it returns is the call's result.
    """

    def around(self, call: TaskCall, proceed: Callable[[], Any]) -> Any:
        """Make (or refuse, or repeat) the plain call ``call``; return its result."""
        return proceed()

    async def around_async(self, call: TaskCall, proceed: Callable[[], Awaitable[Any]]) -> Any:
        """:meth:`around` for an ``async def`` method: ``proceed()`` is awaited."""
        return await proceed()


_installed: tuple[Interceptor, ...] = ()
_lock = threading.Lock()


@contextlib.contextmanager
def installed(interceptor: Interceptor) -> Iterator[Interceptor]:
    """Run ``interceptor`` around every task call this process makes, until the block ends.

    Several may be installed; the one installed last is outermost.
    """
    global _installed
    with _lock:
        _installed = (*_installed, interceptor)
    try:
        yield interceptor
    finally:
        with _lock:
            _installed = tuple(i for i in _installed if i is not interceptor)


def bound(task: Task, action: str, arguments: Mapping[str, Any],
          method: Callable[..., Any]) -> Callable[[], Any]:
    """``method(**arguments)`` as a call of no arguments, through the installed interceptors."""
    return _chain(task, action, arguments, method, "around")


def bound_async(task: Task, action: str, arguments: Mapping[str, Any],
                method: Callable[..., Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    """:func:`bound` for an ``async def`` method (each level returns an awaitable)."""
    return _chain(task, action, arguments, method, "around_async")


def _chain(task: Task, action: str, arguments: Mapping[str, Any], method: Callable[..., Any],
           level: str) -> Callable[[], Any]:
    call: Callable[[], Any] = functools.partial(method, **arguments)
    chain = _installed
    if not chain:
        return call
    info = TaskCall(task, action, arguments)
    for interceptor in chain:
        call = functools.partial(getattr(interceptor, level), info, call)
    return call
