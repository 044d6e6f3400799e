"""Engine options: one typed, validated record instead of a loose dict."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Collection, Mapping
from typing import Any

from flowengine.engines import stopping
from flowengine.engines import suspend_requests as sr
from flowengine.engines.admission import OPTIONS as ADMISSION_OPTIONS
from flowengine.engines.admission import AdmissionOptions
from flowengine.engines.executor import SubmitsCalls, TaskExecutor
from flowengine.engines.time_limits import parse_time_limits
from flowengine.hooks import Hook

_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}

#: The options TaskFlow's engines read (any of them). Every engine accepts them, and ignores
#: those it has no use for, as TaskFlow does: a program can switch engines by name alone.
TASKFLOW_OPTIONS = frozenset({
    "defer_reverts", "never_resolve", "inject_transient", "gather_statistics", "executor",
    "max_workers", "url", "exchange", "topics", "transport", "transport_options",
    "retry_options", "transition_timeout", "worker_expiry", "polling_interval",
})


def unknown_options(kind: str, unknown: Collection[str], known: Collection[str]) -> ValueError:
    """The error for options ``unknown`` to a ``kind`` engine, each with the nearest of
    ``known`` when one is close."""
    hints = [f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
             for name in sorted(unknown)
             for close in [difflib.get_close_matches(name, sorted(known), n=1)]]
    return ValueError(f"Unknown {kind} engine option(s): {', '.join(hints)}")


def as_bool(name: str, value: Any) -> bool:
    """Accept booleans and their usual string spellings (engine URIs carry strings).

    ``None`` is false, as TaskFlow reads it (``options.get(name, default)`` tested for truth):
    for ``defer_reverts`` and ``never_resolve`` that is their default, for ``inject_transient``
    it is not.
    """
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int):
        return bool(value)
    raise ValueError(f"Engine option {name!r} must be a boolean, got {value!r}")


def as_optional_int(name: str, value: Any, minimum: int = 1) -> int | None:
    """Accept None, ints and digit strings no smaller than ``minimum``."""
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"Engine option {name!r} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"Engine option {name!r} must be >= {minimum}, got {number}")
    return number


def as_clock(name: str, value: Any) -> Callable[[], float] | None:
    """Accept None (the system's clock) or a function of no arguments returning seconds."""
    if value is not None and not callable(value):
        raise ValueError(f"Engine option {name!r} must be a function returning seconds, got "
                         f"{value!r}")
    return value


#: The ``executor`` option: one of flowengine's task executors, an executor of the program's
#: own, the name of one ("threads"), or None (the engine's own pool).
ExecutorOption = TaskExecutor | SubmitsCalls | str | None


def as_executor(value: Any) -> ExecutorOption:
    """Accept what :data:`ExecutorOption` allows; the parallel engine checks the names and
    refuses process pools."""
    if value is None or isinstance(value, (str, TaskExecutor, SubmitsCalls)):
        return value
    raise ValueError(f"Engine option 'executor' must be an executor (an object with submit), "
                     f"a flowengine TaskExecutor or an executor's name such as 'threads', "
                     f"not {value!r}")


def as_hooks(value: Any) -> tuple[Hook, ...] | None:
    """Accept None (the process's defaults) or an iterable of :class:`~flowengine.hooks.Hook`."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"Engine option 'hooks' must be a list of flowengine.hooks.Hook, "
                         f"got {value!r}")
    found = tuple(value)
    for hook in found:
        if not isinstance(hook, Hook):
            raise ValueError(f"Engine option 'hooks' must hold flowengine.hooks.Hook objects, "
                             f"not {hook!r}")
    return found


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """Options every action engine understands; engine-specific ones stay in ``extra``.

    Attributes:
        defer_reverts: a retry's REVERT always defers to the enclosing retry controller.
        never_resolve: do not consult retry controllers; any failure stops the engine.
        inject_transient: atoms' ``inject`` values are kept in memory only (not stored).
        executor: the parallel engine's executor (an Executor, or "threads").
        max_workers: the parallel engine's thread count.
        hooks: what attaches to the engine (see :mod:`flowengine.hooks`); None: the
            process's defaults.
        retry_clock: epoch seconds of retry waits and deadlines (None: the system's clocks;
            tests inject one to move time by hand).
        time_limits: ``{task name: seconds}`` overriding tasks' ``time_limit``.
        deadline: seconds the flow may run before it is cancelled (None: no deadline; see
            :mod:`flowengine.engines.stopping`).
        suspend_check_interval: seconds between looks at the flow's stored suspend and cancel
            requests (see :mod:`flowengine.engines.suspend_requests`).
        admission: the locks and limits options (see :mod:`flowengine.engines.admission`).
        extra: every other option, for engines that understand them.
    """

    defer_reverts: bool = False
    never_resolve: bool = False
    inject_transient: bool = True
    executor: ExecutorOption = None
    max_workers: int | None = None
    hooks: tuple[Hook, ...] | None = None
    retry_clock: Callable[[], float] | None = None
    time_limits: Mapping[str, float] = dataclasses.field(default_factory=dict)
    deadline: float | None = None
    suspend_check_interval: float = sr.DEFAULT_INTERVAL
    admission: AdmissionOptions = dataclasses.field(default_factory=AdmissionOptions)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None, kind: str = "action",
                     extra: Collection[str] | None = None) -> EngineOptions:
        """Validate a mapping of options (as given to ``engines.load``).

        Args:
            options: The options.
            kind: The engine's name, for messages.
            extra: The options beyond this record's fields that the engine reads (None: any
                is kept in ``extra`` unchecked).

        Raises:
            ValueError: A bad value, or (with ``extra``) an option neither the engine nor
                TaskFlow knows, with the nearest known name.
        """
        options = dict(options or {})
        if extra is not None:
            known = _FIELDS | set(extra)
            unknown = set(options) - known - TASKFLOW_OPTIONS
            if unknown:
                raise unknown_options(kind, unknown, known)
        return cls(
            defer_reverts=as_bool("defer_reverts", options.pop("defer_reverts", False)),
            never_resolve=as_bool("never_resolve", options.pop("never_resolve", False)),
            inject_transient=as_bool("inject_transient", options.pop("inject_transient", True)),
            executor=as_executor(options.pop("executor", None)),
            max_workers=as_optional_int("max_workers", options.pop("max_workers", None)),
            hooks=as_hooks(options.pop("hooks", None)),
            retry_clock=as_clock("retry_clock", options.pop("retry_clock", None)),
            time_limits=parse_time_limits(options.pop("time_limits", None)),
            deadline=stopping.deadline_seconds(options.pop(stopping.OPTION, None)),
            suspend_check_interval=sr.interval_of(options.pop(sr.OPTION, None)),
            admission=AdmissionOptions.from_mapping(
                {name: options.pop(name) for name in ADMISSION_OPTIONS if name in options}),
            extra=options,
        )

    def as_dict(self) -> dict[str, Any]:
        """The options as a plain dict, validated (the admission options by their own
        names)."""
        found = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name not in ("extra", "admission")}
        found.update((f.name, getattr(self.admission, f.name))
                     for f in dataclasses.fields(self.admission))
        found.update(self.extra)
        return found


#: The options :class:`EngineOptions` holds in fields of their own.
_FIELDS = (frozenset(f.name for f in dataclasses.fields(EngineOptions)) - {"extra", "admission"}
           | ADMISSION_OPTIONS)
