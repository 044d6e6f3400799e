"""Retry controllers: atoms that decide what happens when their subflow fails.

A retry controller is attached to a flow. When an atom inside that flow fails, the controller's
``on_failure`` returns a :class:`Decision`: ``RETRY`` reverts the subflow and runs it again (the
controller's ``execute`` produces the value for the next attempt), ``REVERT`` reverts the subflow
and lets the enclosing flow's controller decide, ``REVERT_ALL`` reverts the whole flow.

Beyond TaskFlow, every controller takes ``delay``/``backoff``/``max_delay``: the wait before the
next attempt, which never blocks other ready atoms.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from flowengine import atom
from flowengine.exceptions import NotFound
from flowengine.types.failure import Failure

#: The argument name a retry's ``execute``/``revert``/``on_failure`` receive the history as.
EXECUTE_REVERT_HISTORY = "history"
#: The argument name flow failures are passed to ``revert`` as.
REVERT_FLOW_FAILURES = atom.REVERT_FLOW_FAILURES


class Decision(str, enum.Enum):
    """What a retry controller decided to do about a failure in its subflow."""

    #: Revert this subflow and defer to the enclosing flow's controller (if any).
    REVERT = "REVERT"
    #: Revert everything, ignoring enclosing controllers.
    REVERT_ALL = "REVERT_ALL"
    #: Revert this subflow and run it again.
    RETRY = "RETRY"

    def __str__(self) -> str:
        return self.value


REVERT = Decision.REVERT
REVERT_ALL = Decision.REVERT_ALL
RETRY = Decision.RETRY


class History:
    """What a retry controller has tried so far.

    Iterating yields ``(provided_value, {atom_name: Failure})`` for each attempt, oldest first.
    ``failure`` is set when the controller itself failed.
    """

    def __init__(
        self,
        contents: Sequence[tuple[Any, dict[str, Failure]]],
        failure: Failure | None = None,
    ) -> None:
        self._contents = list(contents)
        self._failure = failure

    @property
    def failure(self) -> Failure | None:
        """The controller's own failure, if it failed."""
        return self._failure

    def provided_iter(self) -> Iterator[Any]:
        """Iterate over the values the controller provided, oldest first."""
        for provided, _outcomes in self._contents:
            yield provided

    def outcomes_iter(self, index: int | None = None) -> Iterator[tuple[str, Failure]]:
        """Iterate over ``(atom_name, failure)`` pairs of one attempt, or of all attempts."""
        contents = self._contents if index is None else [self._contents[index]]
        for _provided, outcomes in contents:
            yield from outcomes.items()

    def caused_by(
        self, exception_cls: type[BaseException] | str, index: int | None = None,
        include_retry: bool = False,
    ) -> bool:
        """Whether any recorded failure (of one attempt, or all) was caused by ``exception_cls``."""
        if include_retry and self._failure is not None and self._failure.check(exception_cls):
            return True
        return any(f.check(exception_cls) for _name, f in self.outcomes_iter(index=index))

    def __len__(self) -> int:
        return len(self._contents)

    def __iter__(self) -> Iterator[tuple[Any, dict[str, Failure]]]:
        return iter(self._contents)

    def __getitem__(self, index: int) -> tuple[Any, dict[str, Failure]]:
        return self._contents[index]


class Retry(atom.Atom):
    """Base class for retry controllers.

    Args:
        delay: seconds to wait before the next attempt after a ``RETRY`` decision.
        backoff: multiplier applied to the delay after each attempt (exponential backoff).
        max_delay: upper bound on the wait, in seconds.
    """

    def __init__(
        self,
        name: str | None = None,
        provides: atom.ProvidesSpec = None,
        requires: str | Iterable[str] | None = None,
        auto_extract: bool = True,
        rebind: atom.RebindSpec = None,
        *,
        delay: float = 0.0,
        backoff: float = 1.0,
        max_delay: float | None = None,
    ) -> None:
        super().__init__(
            name=name,
            provides=provides,
            requires=requires,
            rebind=rebind,
            auto_extract=auto_extract,
            ignore_list=[EXECUTE_REVERT_HISTORY],
        )
        if delay < 0 or backoff < 1.0 or (max_delay is not None and max_delay < 0):
            raise ValueError(
                f"Retry {name!r}: delay and max_delay must be >= 0 and backoff >= 1 "
                f"(got delay={delay}, backoff={backoff}, max_delay={max_delay})"
            )
        self.delay = delay
        self.backoff = backoff
        self.max_delay = max_delay

    def delay_before(self, attempt: int) -> float:
        """Seconds to wait before attempt number ``attempt`` (2 is the first retry)."""
        if self.delay <= 0 or attempt < 2:
            return 0.0
        wait = self.delay * (self.backoff ** (attempt - 2))
        return wait if self.max_delay is None else min(wait, self.max_delay)

    @abc.abstractmethod
    def execute(self, history: History, *args: Any, **kwargs: Any) -> Any:
        """Return the value this attempt of the subflow runs with."""

    def revert(self, history: History, *args: Any, **kwargs: Any) -> Any:
        """Undo ``execute`` when the subflow is reverted for good."""

    @abc.abstractmethod
    def on_failure(self, history: History, *args: Any, **kwargs: Any) -> Decision:
        """Decide what to do about a failure in the subflow."""


class AlwaysRevert(Retry):
    """Revert the subflow and let the enclosing flow decide."""

    def on_failure(self, *args: Any, **kwargs: Any) -> Decision:
        return REVERT

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return None


class AlwaysRevertAll(Retry):
    """Revert the whole flow on any failure in the subflow."""

    def on_failure(self, *args: Any, **kwargs: Any) -> Decision:
        return REVERT_ALL

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return None


class Times(Retry):
    """Retry the subflow up to ``attempts`` times in all; provides the attempt number (from 1)."""

    def __init__(
        self,
        attempts: int = 1,
        name: str | None = None,
        provides: atom.ProvidesSpec = None,
        requires: str | Iterable[str] | None = None,
        auto_extract: bool = True,
        rebind: atom.RebindSpec = None,
        revert_all: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, provides, requires, auto_extract, rebind, **kwargs)
        self._attempts = attempts
        self._revert_action = REVERT_ALL if revert_all else REVERT

    @property
    def attempts(self) -> int:
        """How many attempts are allowed in all."""
        return self._attempts

    def on_failure(self, history: History, *args: Any, **kwargs: Any) -> Decision:
        return RETRY if len(history) < self._attempts else self._revert_action

    def execute(self, history: History, *args: Any, **kwargs: Any) -> int:
        return len(history) + 1


class ForEachBase(Retry):
    """Shared logic of controllers that try each value of a collection in turn."""

    def __init__(
        self,
        name: str | None = None,
        provides: atom.ProvidesSpec = None,
        requires: str | Iterable[str] | None = None,
        auto_extract: bool = True,
        rebind: atom.RebindSpec = None,
        revert_all: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, provides, requires, auto_extract, rebind, **kwargs)
        self._revert_action = REVERT_ALL if revert_all else REVERT

    def _next_value(self, values: Iterable[Any], history: History) -> Any:
        # Each attempt uses up one occurrence: a value listed twice is tried twice (TaskFlow).
        tried = list(history.provided_iter())
        for value in values:
            if value in tried:
                tried.remove(value)
            else:
                return value
        raise NotFound(f"No elements left in the collection of retry controller {self.name!r}")

    def _on_failure(self, values: Iterable[Any], history: History) -> Decision:
        try:
            self._next_value(values, history)
        except NotFound:
            return self._revert_action
        return RETRY


class ForEach(ForEachBase):
    """Run the subflow once per value (given up front) until one attempt succeeds."""

    def __init__(
        self,
        values: Iterable[Any],
        name: str | None = None,
        provides: atom.ProvidesSpec = None,
        requires: str | Iterable[str] | None = None,
        auto_extract: bool = True,
        rebind: atom.RebindSpec = None,
        revert_all: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, provides, requires, auto_extract, rebind, revert_all, **kwargs)
        self._values = list(values)

    def on_failure(self, history: History, *args: Any, **kwargs: Any) -> Decision:
        return self._on_failure(self._values, history)

    def execute(self, history: History, *args: Any, **kwargs: Any) -> Any:
        return self._next_value(self._values, history)


class ParameterizedForEach(ForEachBase):
    """Like :class:`ForEach`, with the values read from storage (the ``values`` argument)."""

    def on_failure(  # type: ignore[override]
        self, values: Iterable[Any], history: History, *args: Any, **kwargs: Any
    ) -> Decision:
        return self._on_failure(values, history)

    def execute(  # type: ignore[override]
        self, values: Iterable[Any], history: History, *args: Any, **kwargs: Any
    ) -> Any:
        return self._next_value(values, history)
