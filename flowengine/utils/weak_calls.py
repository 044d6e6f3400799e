"""Callbacks that do not keep their object alive.

An engine hands its own bound methods to objects it owns (its executor, its hooks): each such
callback refers back to the engine, so the engine and everything it holds form a reference
cycle. CPython frees a cycle only when the cyclic collector finds it, and in a process running
many flows the finished engines pile up until a full collection walks the whole heap. A
:class:`WeakMethod` callback breaks the cycle: the owner keeps the object alive, the callback
only reaches it while it lives.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, ParamSpec, TypeVar

__all__ = ["WeakMethod"]

P = ParamSpec("P")
R = TypeVar("R")


class WeakMethod(Generic[P, R]):
    """Calls ``method`` (a bound method) while its object lives; returns ``gone`` after.

    Args:
        method: The bound method to call.
        gone: What a call returns once the method's object has been freed.
    """

    __slots__ = ("_ref", "_gone", "__weakref__")

    def __init__(self, method: Callable[P, R], gone: R) -> None:
        self._ref = weakref.WeakMethod(method)  # type: ignore[arg-type]
        self._gone = gone

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        method = self._ref()
        if method is None:
            return self._gone
        return method(*args, **kwargs)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        method = self._ref()
        return f"WeakMethod({method!r})" if method is not None else "WeakMethod(<gone>)"
