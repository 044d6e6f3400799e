"""The context each task call of a run gets (:mod:`flowengine.context`), and the run's stop.

One :class:`CallContexts` per runtime makes the :class:`~flowengine.context.TaskContext` of
every execute and revert it starts. The engine makes it current around the hand-over to the task
executor, which carries it to wherever the call runs (a pool thread, the event loop, a worker,
through a request header). Every execute of one run shares the run's
:class:`~flowengine.context.CancelSignal`, which a cancel sets; reverts never get it.
"""

from __future__ import annotations

from flowengine import context, states
from flowengine.atom import Atom
from flowengine.context import NEVER_CANCELLED, CancelSignal, TaskContext
from flowengine.engines.compiler import Compilation
from flowengine.storage import Storage

#: The ``action`` of a context, by the atom intention that starts the call.
_ACTIONS = {states.EXECUTE: "execute", states.REVERT: "revert"}


class CallContexts:
    """Makes the contexts of a runtime's calls.

    Args:
        storage: The run's storage (flow and atom ids, retry histories).
        compilation: The compiled flow (which retry controllers surround an atom).

    Attributes:
        signal: The current run's cancel signal (a new one each run: see :meth:`new_run`).
        deadline: When the flow's deadline expires, in epoch seconds by the engine's clock.
    """

    def __init__(self, storage: Storage, compilation: Compilation) -> None:
        self._storage = storage
        self._compilation = compilation
        self.signal = CancelSignal()
        self.deadline: float | None = None
        self._innermost: dict[str, str | None] = {}

    def new_run(self, deadline: float | None) -> CancelSignal:
        """Start a run: a fresh signal (a cancelled run's is spent), and its deadline."""
        self.signal = CancelSignal()
        self.deadline = deadline
        return self.signal

    def of(self, atom: Atom, intention: str) -> _Deferred:
        """What makes the context of the call ``intention`` starts for ``atom``, when it is
        first asked for (a serial engine starts thousands of calls a second, and most tasks
        never ask): a remote executor asks at once; a local task, if it looks."""
        return _Deferred(self, atom, intention, self.signal, self.deadline)

    def make(self, atom: Atom, intention: str, signal: CancelSignal,
             deadline: float | None) -> TaskContext:
        """The context of the call ``intention`` starts for ``atom``."""
        storage = self._storage
        action = _ACTIONS.get(intention, "execute")
        return context.make(
            flow_uuid=storage.flow_uuid, flow_name=storage.flow_name, atom_name=atom.name,
            atom_uuid=storage.get_atom_uuid(atom.name), action=action,
            attempt=self._attempt(atom), deadline=deadline,
            signal=signal if action == "execute" else NEVER_CANCELLED)

    def _attempt(self, atom: Atom) -> int:
        try:
            retry = self._innermost[atom.name]
        except KeyError:
            retries = self._compilation.retries_around(atom)
            retry = self._innermost[atom.name] = retries[-1].name if retries else None
        if retry is None:
            return 1
        return max(1, len(self._storage.get_retry_history(retry)))


class _Deferred:
    """Makes one call's context on first use, from what holds as the call starts."""

    __slots__ = ("_atom", "_calls", "_deadline", "_intention", "_made", "_signal")

    def __init__(self, calls: CallContexts, atom: Atom, intention: str, signal: CancelSignal,
                 deadline: float | None) -> None:
        self._calls, self._atom, self._intention = calls, atom, intention
        self._signal, self._deadline = signal, deadline
        self._made: TaskContext | None = None

    def __call__(self) -> TaskContext:
        if self._made is None:
            self._made = self._calls.make(self._atom, self._intention, self._signal,
                                          self._deadline)
        return self._made
