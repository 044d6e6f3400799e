"""Hooks: one ordered list through which logging, tracing and the like attach to engines and
workers.

An engine holds an ordered list of :class:`Hook` objects, :attr:`ActionEngine.hooks
<flowengine.engines.engine.ActionEngine.hooks>`, and calls them at the points below; a hook
overrides the ones it needs:

* :meth:`Hook.run`: a context manager entered around each run (``run()``/``run_iter()``), from
  before the flow's RUNNING state until its atoms are done; the flow's end state is stored just
  after it is left. A hook usually registers listeners on the engine's notifiers here (see
  :class:`~flowengine.listeners.base.Listener`).
* :meth:`Hook.whole_run`: a context manager entered around the whole of each run, from before
  its set-up (the flow's records made, its RESUMING state) until after its end state is
  stored. Whatever must hear every flow state, the end one included, attaches here (the
  worker-based engine's events, metrics and placement records).
* :meth:`Hook.call`: a context manager entered around each task call a local executor makes,
  on the thread (or in the asyncio task) that runs it.
* :meth:`Hook.failure_resolved`: what was decided about an atom's failure (retry, revert).
* :meth:`Hook.request_sent`: a worker-based engine is about to publish one attempt's request;
  the hook may add headers (tracing adds the attempt's trace context).

A :class:`~flowengine.worker_based.worker.Worker` holds such a list too, and calls the two
points of the worker side:

* :meth:`Hook.serving`: a context manager entered around the serving of one request, on the
  thread that reads it, from before the request is checked until its last reply is sent (a
  coroutine task's call, awaited later, is not inside it).
* :meth:`Hook.replying`: the worker is about to send a reply to the request it serves (its
  RUNNING, progress, or outcome); called within :meth:`Hook.serving` where the reply is sent
  from there.

Hooks are entered in list order and left in reverse, so an earlier hook's listeners hear each
state change first. A hook that raises is logged, naming it, and left out of that run or call:
it never breaks the engine (nor a worker's request).

Neither engines nor workers import the modules that attach this way. Every engine and worker
starts with the process's :data:`defaults` (the atom log and tracing, which :mod:`flowengine`
puts there as the package is imported); the engine option ``hooks`` (a worker's ``hooks``
argument) replaces them for one engine (worker), and an application may change the defaults
before it loads engines or makes workers (take the atom log out, add a hook of its own).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowengine.atom import Atom
    from flowengine.engines.engine import ActionEngine

__all__ = ["Hook", "Hooks", "defaults"]

LOG = logging.getLogger(__name__)


class Hook:
    """One thing attached to engines; every method does nothing unless overridden."""

    def run(self, engine: ActionEngine) -> contextlib.AbstractContextManager[object] | None:
        """What to enter around one run of ``engine`` (None: nothing)."""
        return None

    def whole_run(self, engine: ActionEngine) -> contextlib.AbstractContextManager[object] | None:
        """What to enter around the whole of one run of ``engine``, set-up and end state
        included (None: nothing). Entered before any hook's :meth:`run`, left after."""
        return None

    def call(self, task: Atom) -> contextlib.AbstractContextManager[object] | None:
        """What to enter around one local call of ``task``'s execute or revert, where it runs
        (None: nothing)."""
        return None

    def failure_resolved(self, atom_uuid: str, decision: object, retry: Atom | None) -> None:
        """An atom's failure was resolved: ``decision`` is RETRY, REVERT or REVERT_ALL, by
        the retry controller ``retry`` (None: no controller decided)."""

    def request_sent(self, headers: MutableMapping[str, Any], atom_uuid: str, *,
                     request_id: str, attempt: int, task_name: str, topic: str) -> None:
        """A worker-based engine is about to publish attempt ``attempt`` (request
        ``request_id``) of atom ``atom_uuid``'s task to ``topic``; headers added to
        ``headers`` travel with the request (workers read the ones they know)."""

    def serving(self, headers: Mapping[str, Any], *, task_name: str, worker: str,
                request_id: str | None, attempt: int | None,
                topic: str) -> contextlib.AbstractContextManager[object] | None:
        """What to enter around worker ``worker`` serving one request for ``task_name``,
        taken from ``topic``'s queue (None: nothing). ``headers`` are the request's, as
        sent; ``request_id`` and ``attempt`` are its attempt's ids (None: a TaskFlow engine
        sent it, which has none)."""
        return None

    def replying(self, state: str, event_type: str | None) -> None:
        """A worker is about to send a reply in ``state`` (``RUNNING``, ``EVENT``,
        ``SUCCESS``, ``FAILURE``) to the request it serves; ``event_type`` names an
        ``EVENT``'s kind (progress, cancelled, returned)."""

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.{type(self).__qualname__}>"


class Hooks:
    """An engine's ordered hooks, and how the engine calls them.

    Args:
        hooks: The hooks, in the order they are entered.

    Raises:
        TypeError: One of ``hooks`` is not a :class:`Hook`.
    """

    def __init__(self, hooks: Iterable[Hook] = ()) -> None:
        self._hooks: list[Hook] = []
        self._calls: tuple[Hook, ...] = ()
        self._resolves: tuple[Hook, ...] = ()
        self._whole_runs: tuple[Hook, ...] = ()
        self._sends: tuple[Hook, ...] = ()
        self._serves: tuple[Hook, ...] = ()
        self._replies: tuple[Hook, ...] = ()
        # Every engine copies the defaults as it is made: checked one by one, sorted once.
        for hook in hooks:
            _check(hook)
            self._hooks.append(hook)
        self._sorted()

    def __iter__(self) -> Iterator[Hook]:
        return iter(list(self._hooks))

    def __len__(self) -> int:
        return len(self._hooks)

    def __repr__(self) -> str:
        return f"Hooks({self._hooks!r})"

    def insert(self, index: int, hook: Hook) -> None:
        """Put ``hook`` at ``index`` (0: entered first)."""
        _check(hook)
        self._hooks.insert(index, hook)
        self._sorted()

    def append(self, hook: Hook) -> None:
        """Put ``hook`` last (entered after the others)."""
        self.insert(len(self._hooks), hook)

    def extend(self, hooks: Iterable[Hook]) -> None:
        """Put each of ``hooks`` last, in order."""
        for hook in hooks:
            self.append(hook)

    def remove(self, hook: Hook) -> None:
        """Take ``hook`` out (ValueError if it is not in)."""
        self._hooks.remove(hook)
        self._sorted()

    def _sorted(self) -> None:
        # Which hooks take part in the per-call points, worked out once per change rather than
        # once per task call.
        self._calls = tuple(h for h in self._hooks if type(h).call is not Hook.call)
        self._whole_runs = tuple(h for h in self._hooks
                                 if type(h).whole_run is not Hook.whole_run)
        self._resolves = tuple(h for h in self._hooks
                               if type(h).failure_resolved is not Hook.failure_resolved)
        self._sends = tuple(h for h in self._hooks
                            if type(h).request_sent is not Hook.request_sent)
        self._serves = tuple(h for h in self._hooks if type(h).serving is not Hook.serving)
        self._replies = tuple(h for h in self._hooks if type(h).replying is not Hook.replying)

    @contextlib.contextmanager
    def whole_run(self, engine: ActionEngine) -> Iterator[None]:
        """Enter every hook's :meth:`Hook.whole_run` for one run of ``engine``, in order."""
        with contextlib.ExitStack() as stack:
            for hook in self._whole_runs:
                _enter(stack, hook, hook.whole_run, engine)
            yield

    @contextlib.contextmanager
    def run(self, engine: ActionEngine) -> Iterator[None]:
        """Enter every hook's :meth:`Hook.run` for one run of ``engine``, in order."""
        with contextlib.ExitStack() as stack:
            for hook in list(self._hooks):
                _enter(stack, hook, hook.run, engine)
            yield

    def call(self, task: Atom) -> contextlib.AbstractContextManager[object]:
        """What a local executor enters around one call of ``task``."""
        calls = self._calls
        if not calls:
            return _NOTHING
        if len(calls) == 1:
            return _entered(calls[0], task)
        return self._all_calls(calls, task)

    @contextlib.contextmanager
    def _all_calls(self, calls: tuple[Hook, ...], task: Atom) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for hook in calls:
                stack.enter_context(_entered(hook, task))
            yield

    def failure_resolved(self, atom_uuid: str, decision: object, retry: Atom | None) -> None:
        """Tell every hook how an atom's failure was resolved."""
        for hook in self._resolves:
            try:
                hook.failure_resolved(atom_uuid, decision, retry)
            except Exception:
                LOG.exception("Engine hook %r failed on the resolution (%s) of atom %s's "
                              "failure", hook, decision, atom_uuid)

    def request_sent(self, headers: MutableMapping[str, Any], atom_uuid: str, *,
                     request_id: str, attempt: int, task_name: str, topic: str) -> None:
        """Tell every hook that a request is about to be published (see
        :meth:`Hook.request_sent`); a hook that raises is logged and the request goes."""
        for hook in self._sends:
            try:
                hook.request_sent(headers, atom_uuid, request_id=request_id, attempt=attempt,
                                  task_name=task_name, topic=topic)
            except Exception:
                LOG.exception("Engine hook %r failed as request %s of task %r was sent; the "
                              "request goes without it", hook, request_id, task_name)

    def serving(self, headers: Mapping[str, Any], *, task_name: str, worker: str,
                request_id: str | None, attempt: int | None,
                topic: str) -> contextlib.AbstractContextManager[object]:
        """What a worker enters around serving one request (see :meth:`Hook.serving`)."""
        serves = self._serves
        if not serves:
            return _NOTHING
        return self._all_serves(serves, headers, task_name=task_name, worker=worker,
                                request_id=request_id, attempt=attempt, topic=topic)

    @contextlib.contextmanager
    def _all_serves(self, serves: tuple[Hook, ...], headers: Mapping[str, Any], *,
                    task_name: str, worker: str, request_id: str | None, attempt: int | None,
                    topic: str) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for hook in serves:
                try:
                    entered = hook.serving(headers, task_name=task_name, worker=worker,
                                           request_id=request_id, attempt=attempt, topic=topic)
                    if entered is not None:
                        stack.enter_context(entered)
                except Exception:
                    LOG.exception("Hook %r failed as worker %s began serving request %s of "
                                  "task %r; the request is served without it", hook, worker,
                                  request_id, task_name)
            yield

    def replying(self, state: str, event_type: str | None) -> None:
        """Tell every hook that a worker is about to send a reply (see
        :meth:`Hook.replying`); a hook that raises is logged and the reply goes."""
        for hook in self._replies:
            try:
                hook.replying(state, event_type)
            except Exception:
                LOG.exception("Hook %r failed as a %s reply was sent; the reply goes without "
                              "it", hook, state)


_NOTHING: contextlib.AbstractContextManager[object] = contextlib.nullcontext()


def _check(hook: object) -> None:
    if not isinstance(hook, Hook):
        raise TypeError(f"An engine hook must be a flowengine.hooks.Hook, not {hook!r}")


def _enter(stack: contextlib.ExitStack, hook: Hook,
           point: Callable[[ActionEngine], contextlib.AbstractContextManager[object] | None],
           engine: ActionEngine) -> None:
    """Enter ``hook``'s context for one run; a hook that fails is logged and left out."""
    try:
        entered = point(engine)
        if entered is not None:
            stack.enter_context(entered)
    except Exception:
        LOG.exception("Engine hook %r failed as a run of flow %r started; the run goes on "
                      "without it", hook, engine.storage.flow_name)


def _entered(hook: Hook, task: Atom) -> contextlib.AbstractContextManager[object]:
    try:
        entered = hook.call(task)
    except Exception:
        LOG.exception("Engine hook %r failed around a call of task %r; the call goes on "
                      "without it", hook, task.name)
        entered = None
    return entered if entered is not None else _NOTHING


#: The hooks every engine starts with, in order (the engine option ``hooks`` replaces them).
defaults = Hooks()
