"""Exceptions raised by flowengine.

The hierarchy, class names and constructor signatures are TaskFlow's, so code that catches
``taskflow.exceptions.X`` catches ``flowengine.exceptions.X`` after the import rename. Almost every
class derives directly from :class:`TaskFlowException` or from one of its four families:

* :class:`StorageFailure` -- persistence could not read, save or delete something.
* :class:`JobFailure` -- jobs and job boards.
* :class:`ExecutionFailure` -- running atoms (timeouts, invalid state transitions, lost workers).
* :class:`DependencyFailure` -- requirements that cannot be satisfied.

flowengine adds :class:`WorkerLost`, :class:`TaskTimeLimitExceeded`, :class:`FlowCancelled`
(all :class:`ExecutionFailure`), :class:`BackendError` and :class:`RunHalted` (both
:class:`StorageFailure`); a TaskFlow program never sees the first four unless it opts into
leases, time limits, cancellation or a SQL/Redis backend, and sees :class:`RunHalted` only where
TaskFlow would raise the write's own :class:`StorageFailure`.

:class:`WrappedFailure` is, as in TaskFlow, a plain :class:`Exception`: it carries one or more
:class:`~flowengine.types.failure.Failure` objects that cannot be re-raised as themselves.
"""

from __future__ import annotations

import builtins
import sys
import traceback
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from flowengine.types.failure import Failure

__all__ = [
    # Root and helper.
    "TaskFlowException",
    "raise_with_cause",
    # Storage.
    "StorageFailure",
    "BackendError",
    "RunHalted",
    # Conductors and jobs.
    "ConductorFailure",
    "JobFailure",
    "UnclaimableJob",
    # Execution.
    "ExecutionFailure",
    "RequestTimeout",
    "InvalidState",
    "WorkerLost",
    "TaskTimeLimitExceeded",
    "FlowCancelled",
    # Dependencies.
    "DependencyFailure",
    "AmbiguousDependency",
    "MissingDependencies",
    "MissingSecrets",
    # Other.
    "CompilationFailure",
    "IncompatibleVersion",
    "Duplicate",
    "NotFound",
    "Empty",
    "MultipleChoices",
    "InvalidFormat",
    "DisallowedAccess",
    "NotImplementedError",
    "WrappedFailure",
]


def raise_with_cause(
    exc_cls: type[TaskFlowException], message: str, *args: Any, **kwargs: Any
) -> NoReturn:
    """Raise ``exc_cls(message, *args, **kwargs)`` chained to a cause.

    When ``cause`` is not given, the exception currently being handled (if any) becomes the cause,
    so both ``.cause`` and ``__cause__`` point at it.

    Args:
        exc_cls: A :class:`TaskFlowException` subclass to raise.
        message: The message, passed as the first positional argument.
        *args: Further positional constructor arguments.
        **kwargs: Further keyword constructor arguments (including ``cause``).

    Raises:
        ValueError: If ``exc_cls`` is not a :class:`TaskFlowException` subclass.
    """
    if not (isinstance(exc_cls, type) and issubclass(exc_cls, TaskFlowException)):
        raise ValueError(f"raise_with_cause needs a TaskFlowException subclass, got {exc_cls!r}")
    if "cause" not in kwargs:
        active = sys.exc_info()[1]
        if active is not None:
            kwargs["cause"] = active
    raise exc_cls(message, *args, **kwargs) from kwargs.get("cause")


class TaskFlowException(Exception):
    """Root of (almost) every exception flowengine raises.

    ``str()`` of the exception is :meth:`pformat`, so the chain of causes is shown.

    Args:
        message: What went wrong, naming the atom, flow, state or resource involved.
        cause: The exception that caused this one, if any.
    """

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self._cause = cause

    @property
    def cause(self) -> BaseException | None:
        """The exception that caused this one, or ``None``."""
        return self._cause

    def __str__(self) -> str:
        return self.pformat()

    def _get_message(self) -> str:
        # Never str(self) here: that is pformat, which calls back into this method.
        return str(self.args[0]) if self.args else ""

    def pformat(
        self, indent: int = 2, indent_text: str = " ", show_root_class: bool = False
    ) -> str:
        """Format this exception and its chain of causes, one indented line per cause.

        The chain is followed through ``cause`` attributes of :class:`TaskFlowException` objects;
        a foreign exception ends it, because its attributes have unknown meaning.

        Args:
            indent: How many ``indent_text`` units each level of cause is indented by.
            indent_text: The text repeated to indent.
            show_root_class: Prefix the first line with this exception's class name.

        Returns:
            The formatted text.

        Raises:
            ValueError: If ``indent`` is negative.
        """
        if indent < 0:
            raise ValueError(f"pformat indent must be >= 0, got {indent}")
        lines: list[str] = []
        first = self._get_message()
        if show_root_class:
            first = f"{type(self).__name__}: {first}"
        lines.append(first)
        depth = indent
        seen: list[BaseException] = []
        cause = self.cause
        while cause is not None and not any(cause is s for s in seen):
            seen.append(cause)
            prefix = indent_text * depth
            if isinstance(cause, TaskFlowException):
                lines.append(f"{prefix}{type(cause).__name__}: {cause._get_message()}")
            else:
                for line in traceback.format_exception_only(type(cause), cause):
                    lines.append(prefix + line.rstrip("\n"))
                break
            depth += indent
            cause = cause.cause
        return "\n".join(lines)


class StorageFailure(TaskFlowException):
    """Storage or a persistence backend could not read, save or delete something."""


class BackendError(StorageFailure):
    """A persistence backend's server or driver reported an error (flowengine addition).

    Raised for connection loss, driver errors and schema mismatches, with the backend's URI
    (secrets masked) in the message.
    """


class RunHalted(StorageFailure):
    """An engine stopped because it could no longer record what it does (flowengine addition).

    Raised by ``run()`` when a write of the flow's progress failed (the database is unreachable,
    the disk is full) or was refused (a conductor's claim on the job may have lapsed). The
    engine then starts nothing more and reverts nothing: work it cannot record must not be
    done, and a revert nobody can record would leave the stored record claiming work that was
    undone. What was stored stays as the last successful write left it (the flow RUNNING, an
    interrupted atom RUNNING), exactly as after a crash, so resuming the flow once the backend
    is back (or letting another conductor take the job) does the right thing.

    Args:
        message: What happened, naming the flow.
        cause: The write's own :class:`StorageFailure`.
    """


class ConductorFailure(TaskFlowException):
    """A conductor could not conduct its work."""


class JobFailure(TaskFlowException):
    """A job, or an operation on a job, failed."""


class UnclaimableJob(JobFailure):
    """A job could not be claimed."""


class ExecutionFailure(TaskFlowException):
    """Running a flow or an atom failed inside the engine."""


class RequestTimeout(ExecutionFailure):
    """A remote worker request did not finish within its allotted time."""


class InvalidState(ExecutionFailure):
    """A state transition that the lifecycle forbids was attempted."""


class WorkerLost(ExecutionFailure):
    """A remote task's worker vanished on every attempt (flowengine addition).

    Raised once a request's lease lapsed on its last allowed attempt; the request is then parked
    as a dead letter.

    Args:
        atom_name: The task whose request was lost.
        attempts: How many attempts were made.
        worker_ids: The workers that held the request, in attempt order.
        cause: The exception that caused this one, if any.
    """

    def __init__(
        self,
        atom_name: str,
        attempts: int,
        worker_ids: Iterable[str] = (),
        cause: BaseException | None = None,
    ) -> None:
        self.atom_name = atom_name
        self.attempts = attempts
        self.worker_ids: tuple[str, ...] = tuple(worker_ids)
        workers = ", ".join(self.worker_ids) if self.worker_ids else "unknown"
        message = (
            f"Task '{atom_name}' lost its worker on each of {attempts} attempt(s)"
            f" (workers: {workers})"
        )
        super().__init__(message, cause=cause)


class TaskTimeLimitExceeded(ExecutionFailure):
    """A task ran longer than its time limit (flowengine addition).

    Args:
        atom_name: The task that ran too long.
        time_limit: The limit, in seconds.
        elapsed: How long it had run when stopped, in seconds, if known.
        cause: The exception that caused this one, if any.
    """

    def __init__(
        self,
        atom_name: str,
        time_limit: float,
        elapsed: float | None = None,
        cause: BaseException | None = None,
    ) -> None:
        self.atom_name = atom_name
        self.time_limit = time_limit
        self.elapsed = elapsed
        message = f"Task '{atom_name}' exceeded its time limit of {time_limit:g}s"
        if elapsed is not None:
            message += f" (ran {elapsed:.3f}s)"
        super().__init__(message, cause=cause)


class FlowCancelled(ExecutionFailure):
    """A flow was cancelled: its running tasks were asked to stop, and its completed work is
    undone (flowengine addition; see ``engine.cancel`` and :mod:`flowengine.context`).

    ``run()`` raises it once a cancelled flow has ended ``REVERTED``; a task's
    ``context.current().raise_if_cancelled()`` raises it to stop its ``execute`` early.

    Args:
        message: What was cancelled, naming the flow (or the task).
        reason: Why, as the canceller gave it (``"deadline"`` when a deadline expired).
        by: Who asked (``"flowengine cancel"``, ``"dashboard"``, ``"deadline"``...), if known.
        cause: The exception that caused this one, if any.
    """

    def __init__(self, message: str, reason: str | None = None, by: str | None = None,
                 cause: BaseException | None = None) -> None:
        self.reason = reason
        self.by = by
        super().__init__(message, cause=cause)


class DependencyFailure(TaskFlowException):
    """A dependency problem was found."""


class AmbiguousDependency(DependencyFailure):
    """A requirement could be satisfied by more than one provider."""


class MissingDependencies(DependencyFailure):
    """An entity requires values that nothing provides.

    Args:
        who: The entity (atom or flow) with unsatisfied requirements.
        requirements: The names nothing provides; kept as ``missing_requirements``.
        cause: The exception that caused this one, if any.
        method: The method (``execute``, ``revert``) whose arguments are missing, if known.
    """

    #: Message template (same wording as TaskFlow, so log scrapers keep working).
    MESSAGE_TPL = (
        "'%(who)s' requires %(requirements)s but no other entity produces said requirements"
    )

    #: Prefix used when the method is known.
    METHOD_TPL = "'%(method)s' method on "

    def __init__(
        self,
        who: Any,
        requirements: Any,
        cause: BaseException | None = None,
        method: str | None = None,
    ) -> None:
        message = self.MESSAGE_TPL % {"who": who, "requirements": requirements}
        if method:
            message = (self.METHOD_TPL % {"method": method}) + message
        super().__init__(message, cause=cause)
        self.missing_requirements = requirements
        self.who = who
        self.method = method


class MissingSecrets(MissingDependencies):
    """A resumed flow was not given its secret inputs again (flowengine addition).

    Secret values are never stored, so a flow loaded from its stored record needs them anew.

    Args:
        who: The flow.
        names: The secret inputs to give again; kept as ``missing_requirements``.
    """

    def __init__(self, who: Any, names: list[str]) -> None:
        super().__init__(who, names)
        listed = ", ".join(repr(n) for n in names)
        example = " ".join(f"--store {n}=VALUE" for n in names)
        self.args = (
            f"'{who}' needs its secret input(s) {listed} again: secret values are never "
            f"stored, so give them when resuming, as engines.load(..., store={{name: "
            f"Secret(value)}}) or `flowengine run --resume FLOW_ID {example}`",)


class CompilationFailure(TaskFlowException):
    """A flow could not be compiled into a runnable graph."""


class IncompatibleVersion(TaskFlowException):
    """Two versions (of an atom, a schema or a protocol) are incompatible."""


class Duplicate(TaskFlowException):
    """A duplicate entry was found."""


class DuplicateAtom(Duplicate, ValueError):
    """One atom object appears twice in a flow (a ValueError too, as TaskFlow raises)."""


class NotFound(TaskFlowException):
    """An entry does not exist."""


class Empty(TaskFlowException):
    """Something is empty that must not be."""


class MultipleChoices(TaskFlowException):
    """A decision cannot be made because several choices are possible."""


class InvalidFormat(TaskFlowException):
    """An object or payload is not in the expected format."""


class DisallowedAccess(TaskFlowException):
    """Storage cannot be accessed in the current state.

    Args:
        message: What access was refused.
        cause: The exception that caused this one, if any.
        state: The state that forbids the access.
    """

    def __init__(
        self, message: str, cause: BaseException | None = None, state: str | None = None
    ) -> None:
        super().__init__(message, cause=cause)
        self.state = state


class NotImplementedError(builtins.NotImplementedError):  # shadows the builtin: TaskFlow's name
    """Functionality flowengine itself does not implement.

    Distinct from the builtin so the library's own gaps are not confused with a user's
    unimplemented method; it still is a builtin ``NotImplementedError``.
    """


class WrappedFailure(Exception):
    """One or several failures that cannot be re-raised as their original exceptions.

    Raised when a failure was decoded from data (no exception object survives) or when several
    atoms failed at once. Nested ``WrappedFailure`` failures are flattened.

    Args:
        causes: The :class:`~flowengine.types.failure.Failure` objects.
    """

    def __init__(self, causes: Iterable[Failure]) -> None:
        super().__init__()
        self._causes: list[Failure] = []
        for cause in causes:
            inner = cause.exception
            if isinstance(inner, WrappedFailure):
                self._causes.extend(inner)
            else:
                self._causes.append(cause)

    def __iter__(self) -> Iterator[Failure]:
        """Iterate over the wrapped failures."""
        return iter(self._causes)

    def __len__(self) -> int:
        """Return how many failures are wrapped."""
        return len(self._causes)

    def __getitem__(self, index: int) -> Failure:
        """Return the wrapped failure at ``index``."""
        return self._causes[index]

    @property
    def causes(self) -> Sequence[Failure]:
        """The wrapped failures, in order."""
        return tuple(self._causes)

    def check(self, *exc_classes: type[BaseException] | str) -> type[BaseException] | str | None:
        """Return the first of ``exc_classes`` that caused any wrapped failure.

        Args:
            *exc_classes: Exception types or their names (dotted, as in ``exc_type_names``).

        Returns:
            The matching argument, or ``None`` if no wrapped failure matches.
        """
        for cause in self._causes:
            found = cause.check(*exc_classes)
            if found is not None:
                return found
        return None

    def __str__(self) -> str:
        return "WrappedFailure: [" + ", ".join(str(c) for c in self._causes) + "]"
