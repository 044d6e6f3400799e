"""Atom details: what persistence remembers about one task or retry controller.

Public through :mod:`flowengine.persistence.models`. Failures are stored as
:meth:`Failure.to_dict` dicts (TaskFlow's version-1 failure format) and rebuilt with
:meth:`Failure.from_dict`.
"""

from __future__ import annotations

import abc
import copy
import os
from typing import Any, TypeVar

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence._record import (
    NamedRecord,
    format_meta,
    format_shared,
    version_string,
)
from flowengine.types.failure import Failure

_AD = TypeVar("_AD", bound="AtomDetail")

#: One entry of a retry's history: what it returned, and the failures of its atoms by name.
RetryHistoryEntry = tuple[Any, dict[str, Failure]]


def _all_none(*values: Any) -> bool:
    return all(value is None for value in values)


def _copy_failure(failure: Failure | None, deep_copy: bool) -> Failure | None:
    # A Failure may hold a traceback, which deepcopy cannot copy: Failure.copy knows how.
    if failure is None:
        return None
    return failure.copy() if deep_copy else failure


class AtomDetail(NamedRecord, metaclass=abc.ABCMeta):
    """The stored state of one atom: state, intention, results, failures, metadata and version.

    Args:
        name: The atom's name.
        uuid: The atom detail's unique id.

    Attributes:
        state: The atom's state (a :mod:`flowengine.states` constant) or ``None``.
        intention: What the engine means to do next (``EXECUTE``, ``REVERT``, ``RETRY``,
            ``IGNORE``).
        results: What ``execute`` returned.
        failure: The :class:`~flowengine.types.failure.Failure` ``execute`` raised, or ``None``.
        revert_results: What ``revert`` returned.
        revert_failure: The failure ``revert`` raised, or ``None``.
        meta: Free-form metadata (progress, for example).
        version: The atom's version (tuple or string) when the detail was written.
        times: When the atom last entered each state, ``{state: seconds since the epoch}``,
            recorded by the engines with each state change. A flowengine field: not part of
            :meth:`to_dict` nor of :meth:`pformat` (see :mod:`flowengine.persistence.state_times`).
    """

    def __init__(self, name: str, uuid: str) -> None:
        super().__init__(name, uuid)
        self.state: str | None = None
        self.intention: str | None = states.EXECUTE
        self.results: Any = None
        self.failure: Failure | None = None
        self.revert_results: Any = None
        self.revert_failure: Failure | None = None
        self.meta: dict[str, Any] = {}
        self.version: Any = None
        self.times: dict[str, float] = {}

    @property
    def last_results(self) -> Any:
        """The most recent result the atom produced."""
        return self.results

    def update(self, ad: AtomDetail) -> AtomDetail:
        """Make this detail's attributes the very objects ``ad`` holds.

        Args:
            ad: The detail to take everything from; updating from itself does nothing.

        Returns:
            This atom detail.
        """
        if ad is self:
            return self
        self.state = ad.state
        self.intention = ad.intention
        self.meta = ad.meta
        self.failure = ad.failure
        self.results = ad.results
        self.revert_results = ad.revert_results
        self.revert_failure = ad.revert_failure
        self.version = ad.version
        self.times = ad.times
        return self

    @abc.abstractmethod
    def merge(self, other: AtomDetail, deep_copy: bool = False) -> AtomDetail:
        """Take ``other``'s state, intention, failures, meta, version and times.

        Subclasses decide how results are merged and call this for the rest.

        Args:
            other: The detail to merge from.
            deep_copy: Copy what is taken instead of sharing references.

        Returns:
            This atom detail.
        """
        self.state = other.state
        self.intention = other.intention
        if self.failure != other.failure:
            self.failure = _copy_failure(other.failure, deep_copy)
        if self.revert_failure != other.revert_failure:
            self.revert_failure = _copy_failure(other.revert_failure, deep_copy)
        if self.meta != other.meta:
            self.meta = copy.deepcopy(other.meta) if deep_copy else other.meta
        if self.version != other.version:
            self.version = copy.deepcopy(other.version) if deep_copy else other.version
        if self.times != other.times:
            self.times = dict(other.times)
        return self

    @abc.abstractmethod
    def put(self, state: str, result: Any) -> bool:
        """Record ``result`` obtained in ``state``; return whether anything changed."""

    @abc.abstractmethod
    def reset(self, state: str) -> None:
        """Forget results and failures, set ``state`` and the ``EXECUTE`` intention."""

    @abc.abstractmethod
    def copy(self) -> AtomDetail:
        """Return a shallow copy that shares result objects (copying them is unsafe)."""

    def to_dict(self) -> dict[str, Any]:
        """Return this detail as a dict, failures as :meth:`Failure.to_dict` dicts.

        TaskFlow's keys only: :attr:`times` is kept by each backend in a place of its own.
        """
        return {
            "failure": self.failure.to_dict() if self.failure else None,
            "revert_failure": self.revert_failure.to_dict() if self.revert_failure else None,
            "meta": self.meta,
            "name": self.name,
            "results": self.results,
            "revert_results": self.revert_results,
            "state": self.state,
            "version": self.version,
            "intention": self.intention,
            "uuid": self.uuid,
        }

    @classmethod
    def from_dict(cls: type[_AD], data: dict[str, Any]) -> _AD:
        """Build a detail from a dict made by :meth:`to_dict`."""
        ad = cls(data["name"], data["uuid"])
        ad.state = data.get("state")
        ad.intention = data.get("intention")
        ad.results = data.get("results")
        ad.revert_results = data.get("revert_results")
        ad.version = data.get("version")
        meta = data.get("meta")
        ad.meta = meta if isinstance(meta, dict) else {}
        if data.get("failure"):
            ad.failure = Failure.from_dict(data["failure"])
        if data.get("revert_failure"):
            ad.revert_failure = Failure.from_dict(data["revert_failure"])
        return ad

    def pformat(self, indent: int = 0, linesep: str = os.linesep) -> str:
        """Return a multi-line, human-readable description of this detail."""
        pad = " " * (indent + 1)
        lines = [f"{' ' * indent}{type(self).__name__}: '{self.name}'"]
        lines.extend(format_shared(self, indent + 1))
        lines.append(f"{pad}- version = {version_string(self.version)}")
        lines.append(f"{pad}- results = {self.results}")
        lines.append(f"{pad}- failure = {bool(self.failure)}")
        lines.extend(format_meta(self.meta, indent + 1))
        return linesep.join(lines)

    def _clone_common(self: _AD) -> _AD:
        clone = copy.copy(self)
        clone.meta = dict(self.meta)
        clone.version = copy.copy(self.version)
        clone.times = dict(self.times)
        return clone


class TaskDetail(AtomDetail):
    """The stored state of a task."""

    def reset(self, state: str) -> None:
        """Forget results and failures, set ``state`` and the ``EXECUTE`` intention."""
        self.results = None
        self.failure = None
        self.revert_results = None
        self.revert_failure = None
        self.state = state
        self.intention = states.EXECUTE

    def put(self, state: str, result: Any) -> bool:
        """Record ``result`` obtained in ``state`` and clear what that state makes stale.

        In ``FAILURE`` and ``REVERT_FAILURE`` ``result`` is the failure; in ``SUCCESS`` it is the
        execute result, in ``REVERTED`` the revert result.

        Returns:
            Whether this detail changed (results are compared by identity, not equality).
        """
        altered = state != self.state
        self.state = state
        if state == states.REVERT_FAILURE:
            if self.revert_failure != result:
                self.revert_failure, altered = result, True
            if not _all_none(self.results, self.revert_results):
                self.results = self.revert_results = None
                altered = True
        elif state == states.FAILURE:
            if self.failure != result:
                self.failure, altered = result, True
            if not _all_none(self.results, self.revert_results, self.revert_failure):
                self.results = self.revert_results = self.revert_failure = None
                altered = True
        elif state == states.SUCCESS:
            if not _all_none(self.revert_results, self.revert_failure, self.failure):
                self.revert_results = self.revert_failure = self.failure = None
                altered = True
            # User results have no reliable equality, so any new object counts as a change.
            if result is not self.results:
                self.results, altered = result, True
        elif state == states.REVERTED:
            if self.revert_failure is not None:
                self.revert_failure, altered = None, True
            if result is not self.revert_results:
                self.revert_results, altered = result, True
        return altered

    def merge(self, other: AtomDetail, deep_copy: bool = False) -> TaskDetail:
        """Merge ``other`` (a task detail) into this one; results are always shared, never copied.

        Raises:
            flowengine.exceptions.NotImplementedError: If ``other`` is not a task detail.
        """
        if not isinstance(other, TaskDetail):
            raise exc.NotImplementedError(f"Can only merge task details, not {type(other)}")
        if other is self:
            return self
        super().merge(other, deep_copy=deep_copy)
        self.results = other.results
        self.revert_results = other.revert_results
        return self

    def copy(self) -> TaskDetail:
        """Return a shallow copy sharing the result objects, with copied meta and version."""
        return self._clone_common()


class RetryDetail(AtomDetail):
    """The stored state of a retry controller.

    ``results`` is the retry's history: one ``(data, failures)`` pair per ``execute``, where
    ``failures`` maps atom names to the failures that made the retry run again.
    """

    def __init__(self, name: str, uuid: str) -> None:
        super().__init__(name, uuid)
        self.results: list[RetryHistoryEntry] = []

    def reset(self, state: str) -> None:
        """Forget the history and failures, set ``state`` and the ``EXECUTE`` intention."""
        self.results = []
        self.revert_results = None
        self.failure = None
        self.revert_failure = None
        self.state = state
        self.intention = states.EXECUTE

    @property
    def last_results(self) -> Any:
        """What the latest ``execute`` returned.

        Raises:
            flowengine.exceptions.NotFound: If the retry has not run yet.
        """
        if not self.results:
            raise exc.NotFound(f"Retry '{self.name}' has no results yet")
        return self.results[-1][0]

    @property
    def last_failures(self) -> dict[str, Failure]:
        """The atom failures recorded with the latest result (not the retry's own ``failure``).

        Raises:
            flowengine.exceptions.NotFound: If the retry has not run yet.
        """
        if not self.results:
            raise exc.NotFound(f"Retry '{self.name}' has no failures recorded yet")
        return self.results[-1][1]

    def put(self, state: str, result: Any) -> bool:
        """Record ``result`` obtained in ``state``; a ``SUCCESS`` appends to the history.

        Returns:
            Whether this detail changed.
        """
        altered = state != self.state
        self.state = state
        if state == states.REVERT_FAILURE:
            if result != self.revert_failure:
                self.revert_failure, altered = result, True
            if self.revert_results is not None:
                self.revert_results, altered = None, True
        elif state == states.FAILURE:
            if result != self.failure:
                self.failure, altered = result, True
            if not _all_none(self.revert_results, self.revert_failure):
                self.revert_results = self.revert_failure = None
                altered = True
        elif state == states.SUCCESS:
            self.failure = self.revert_failure = self.revert_results = None
            # The history is only ever cleared by reset(): each execution is remembered.
            self.results.append((result, {}))
            altered = True
        elif state == states.REVERTED:
            if result is not self.revert_results:
                self.revert_results, altered = result, True
            if self.revert_failure is not None:
                self.revert_failure, altered = None, True
        return altered

    def merge(self, other: AtomDetail, deep_copy: bool = False) -> RetryDetail:
        """Merge ``other`` (a retry detail) into this one, rebuilding the history list.

        The history's data is shared; its failures are copied when ``deep_copy`` is true.

        Raises:
            flowengine.exceptions.NotImplementedError: If ``other`` is not a retry detail.
        """
        if not isinstance(other, RetryDetail):
            raise exc.NotImplementedError(f"Can only merge retry details, not {type(other)}")
        if other is self:
            return self
        super().merge(other, deep_copy=deep_copy)
        self.results = [
            (data, {name: f.copy() if deep_copy else f for name, f in failures.items()})
            for data, failures in other.results
        ]
        self.revert_results = other.revert_results
        return self

    def copy(self) -> RetryDetail:
        """Return a shallow copy with a new history list that shares each entry's data."""
        clone = self._clone_common()
        clone.results = [(data, dict(failures)) for data, failures in self.results]
        return clone

    def to_dict(self) -> dict[str, Any]:
        """Return this detail as a dict; history failures become failure dicts."""
        data = super().to_dict()
        data["results"] = [
            [result, {name: f.to_dict() for name, f in failures.items()}]
            for result, failures in self.results or ()
        ]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RetryDetail:
        """Build a retry detail from a dict made by :meth:`to_dict`."""
        rd = super().from_dict(data)
        history: list[Any] = data.get("results") or []
        rd.results = [
            (result, {name: Failure.from_dict(f) for name, f in (failures or {}).items()})
            for result, failures in history
        ]
        return rd
