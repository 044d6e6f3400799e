"""Following a run as it happens: each atom's state, progress and duration.

:class:`RunWatcher` collects from the engine's notifiers: atom states from the atom notifier,
progress from each task's notifier (the worker-based engine re-emits remote progress there too).
:class:`PlainView` prints one line per change; :class:`LiveView` redraws a rich table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from flowengine import states
from flowengine.cli import formatting as fmt
from flowengine.cli import records
from flowengine.engines import RetryWait, compiler
from flowengine.task import EVENT_UPDATE_PROGRESS
from flowengine.types.failure import Failure
from flowengine.types.notifier import Notifier

#: The event name views receive for a progress update (the others are atom states).
PROGRESS = "progress"
#: The event name views receive when a retry controller starts waiting before an attempt.
DELAYED = "DELAYED"
_STARTS = frozenset((states.RUNNING, states.REVERTING))
_ENDS = frozenset((states.SUCCESS, states.FAILURE, states.REVERTED, states.REVERT_FAILURE))
_STYLES = {
    states.RUNNING: "cyan", states.SUCCESS: "green", states.FAILURE: "red",
    states.REVERTING: "yellow", states.REVERTED: "yellow", states.REVERT_FAILURE: "bold red",
    states.RETRYING: "magenta", states.IGNORE: "dim", states.PENDING: "dim",
}


@dataclasses.dataclass
class AtomStatus:
    """What is known about one atom during a run (times from a monotonic clock)."""

    name: str
    kind: str
    state: str
    progress: float | None = None
    started: float | None = None
    duration: float | None = None
    note: str = ""


View = Callable[[AtomStatus, str], None]


def _note(state: str, result: Any) -> str:
    if isinstance(result, Failure):
        return f"({result.exc_type_names[0] if result.exc_type_names else 'Failure'}: " \
               f"{fmt.truncate(result.exception_str)})"
    if state == states.SUCCESS and result is not None:
        return f"-> {fmt.short_value(result, 40)}"
    return ""


class RunWatcher:
    """Keeps an :class:`AtomStatus` per atom of ``engine`` up to date while it runs.

    Use as a context manager around the run; views added with :meth:`add_view` are called
    (from engine threads) with a copy of the changed status and the state or ``PROGRESS``.
    """

    def __init__(self, engine: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._engine = engine
        self._clock = clock
        self._lock = threading.Lock()
        self._views: list[View] = []
        self.started = clock()
        self.flow_state: str = engine.storage.get_flow_state()
        #: Atoms in the order their revert ended (REVERTED or REVERT_FAILURE).
        self.reverted: list[str] = []
        #: Those whose revert failed.
        self.revert_failed: list[str] = []
        storage = engine.storage
        details = {ad.name: ad for ad in storage.flow_detail}
        self._atoms: dict[str, AtomStatus] = {}
        self._tasks: list[Any] = []
        for atom in engine.compilation.iter_atoms():
            kind = engine.compilation.kind(atom)
            ad = details.get(atom.name)
            execute_time, revert_time = records.durations(ad) if ad is not None else (None, None)
            self._atoms[atom.name] = AtomStatus(
                atom.name, kind, storage.get_atom_state(atom.name),
                ad.meta.get("progress") if ad is not None else None,
                duration=revert_time if revert_time is not None else execute_time)
            if kind == compiler.TASK:
                self._tasks.append(atom)

    def add_view(self, view: View) -> None:
        """Call ``view(status, event)`` on every change."""
        self._views.append(view)

    def __enter__(self) -> RunWatcher:
        self._engine.notifier.register(Notifier.ANY, self._on_flow)
        self._engine.atom_notifier.register(Notifier.ANY, self._on_atom)
        for task in self._tasks:
            task.notifier.register(EVENT_UPDATE_PROGRESS, self._on_progress, args=(task.name,))
        self._engine.retry_waits.subscribe(self._on_wait)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._engine.notifier.deregister(Notifier.ANY, self._on_flow)
        self._engine.atom_notifier.deregister(Notifier.ANY, self._on_atom)
        for task in self._tasks:
            task.notifier.deregister(EVENT_UPDATE_PROGRESS, self._on_progress)
        self._engine.retry_waits.unsubscribe(self._on_wait)

    def statuses(self) -> list[AtomStatus]:
        """Copies of every atom's status, in the flow's order."""
        with self._lock:
            return [dataclasses.replace(s) for s in self._atoms.values()]

    def elapsed(self, status: AtomStatus) -> float | None:
        """How long the atom has been running, or how long its last execute/revert took."""
        if status.started is not None:
            return self._clock() - status.started
        return status.duration

    def _on_flow(self, state: str, details: dict[str, Any]) -> None:
        self.flow_state = state

    def _on_atom(self, state: str, details: dict[str, Any]) -> None:
        name = details.get("task_name") or details.get("retry_name")
        now = self._clock()
        with self._lock:
            status = self._atoms.get(name or "")
            if status is None:
                return
            status.state = state
            if state in _STARTS:
                status.started, status.duration = now, None
            elif state in _ENDS and status.started is not None:
                status.duration = now - status.started
                status.started = None
            if state in (states.REVERTED, states.REVERT_FAILURE):
                self.reverted.append(status.name)
            if state == states.REVERT_FAILURE:
                self.revert_failed.append(status.name)
            status.note = _note(state, details.get("result"))
            changed = dataclasses.replace(status)
        self._tell(changed, state)

    def _on_progress(self, event: str, name: str, details: dict[str, Any]) -> None:
        with self._lock:
            status = self._atoms[name]
            status.progress = details.get("progress")
            changed = dataclasses.replace(status)
        self._tell(changed, PROGRESS)

    def _on_wait(self, wait: RetryWait) -> None:
        with self._lock:
            status = self._atoms.get(wait.retry_name)
            if status is None:
                return
            if wait.due is None:  # over: the controller's next state tells the rest
                status.note = ""
                return
            what = (f"for attempt {wait.attempt}" if wait.kind == "retry"
                    else "before it starts")
            status.note = (f"waits {fmt.duration(wait.seconds)} {what} "
                           f"(until {fmt.timestamp(wait.due)})")
            changed = dataclasses.replace(status)
        self._tell(changed, DELAYED)

    def _tell(self, status: AtomStatus, event: str) -> None:
        for view in self._views:
            view(status, event)


class PlainView:
    """One line per state change (``name: STATE in 0.12s -> result``), progress in 10% steps."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self._echo = echo
        self._shown: dict[str, int] = {}

    def __call__(self, status: AtomStatus, event: str) -> None:
        if event == PROGRESS:
            progress = status.progress
            # The engine itself reports 0% and 100% around every execute and revert.
            if progress is None or not 0.0 < progress < 1.0:
                return
            step = int(progress * 10)
            if self._shown.get(status.name) != step:
                self._shown[status.name] = step
                self._echo(f"{status.name}: {progress:.0%}")
            return
        self._shown.pop(status.name, None)
        line = f"{status.name}: {event}"
        if event in _ENDS and status.duration is not None:
            line += f" in {fmt.duration(status.duration)}"
        self._echo(f"{line} {status.note}".rstrip())


class LiveView:
    """A rich table of every atom (state, progress, time, result), redrawn while the flow runs."""

    def __init__(self, watcher: RunWatcher, console: Console, title: str) -> None:
        self._watcher = watcher
        self._title = title
        self._live = Live(console=console, get_renderable=self.render, refresh_per_second=8,
                          redirect_stderr=False)

    def __enter__(self) -> LiveView:
        self._live.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._live.stop()

    def render(self) -> Group:
        """The table as it is now."""
        table = Table("atom", "kind", "state", "progress", "time", "", box=None, pad_edge=False)
        for status in self._watcher.statuses():
            progress = status.progress or 0.0
            bar = Table.grid(padding=(0, 1))
            bar.add_row(ProgressBar(total=1.0, completed=progress, width=16),
                        Text(fmt.percent(progress)))
            table.add_row(status.name, status.kind,
                          Text(status.state, style=_STYLES.get(status.state, "")), bar,
                          fmt.duration(self._watcher.elapsed(status)), status.note)
        state = self._watcher.flow_state
        heading = Text.assemble(self._title, " ", (state, _STYLES.get(state, "bold")))
        return Group(heading, table)


def open_view(watcher: RunWatcher, console: Console, title: str, echo: Callable[[str], None],
              plain: bool) -> contextlib.AbstractContextManager[Any]:
    """The view for a run: live when ``console`` is interactive (a terminal; rich's
    ``TTY_INTERACTIVE=0|1`` overrides) and not ``plain``, else one line per change."""
    if plain or not console.is_interactive:
        watcher.add_view(PlainView(echo))
        return contextlib.nullcontext()
    return LiveView(watcher, console, title)
