"""The records persistence stores: logbooks, flow details and atom details.

A :class:`LogBook` holds :class:`FlowDetail` objects; a flow detail holds one atom detail per atom
of its flow: a :class:`TaskDetail` for a task, a :class:`RetryDetail` for a retry controller. The
objects are plain in-memory records; nothing is saved until a backend connection saves them.

Names, constructors and semantics are TaskFlow's. The atom detail classes live in a private module
because of their size; import them from here.
"""

from __future__ import annotations

import copy
import datetime
import os
import uuid as uuidlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from flowengine.persistence._atom_details import AtomDetail, RetryDetail, TaskDetail
from flowengine.persistence._record import NamedRecord, format_meta, format_shared

__all__ = [
    "LogBook",
    "FlowDetail",
    "AtomDetail",
    "TaskDetail",
    "RetryDetail",
    "ATOM_TYPES",
    "atom_detail_class",
    "atom_detail_type",
]

_T = TypeVar("_T")

_TIME_FIELDS = ("year", "month", "day", "hour", "minute", "second", "microsecond")


def _utcnow() -> datetime.datetime:
    # Naive UTC, as TaskFlow stores it: users compare these with their own naive UTC values.
    return datetime.datetime.now(datetime.UTC).replace(tzinfo=None)


def _copier(deep_copy: bool) -> Callable[[_T], _T]:
    return copy.deepcopy if deep_copy else (lambda value: value)


def _marshal_time(when: datetime.datetime | None) -> dict[str, Any] | None:
    # The field-per-component dict TaskFlow's file backends write, so their files stay readable.
    if when is None:
        return None
    data: dict[str, Any] = {name: getattr(when, name) for name in _TIME_FIELDS}
    if when.tzinfo is not None:
        data["tzname"] = when.tzinfo.tzname(None)
    return data


def _unmarshal_time(data: dict[str, Any] | None) -> datetime.datetime | None:
    if not data:
        return None
    year, month, day, hour, minute, second, micro = (int(data[name]) for name in _TIME_FIELDS)
    # datetime has no leap second.
    when = datetime.datetime(year, month, day, hour, minute, min(second, 59), micro)
    if data.get("tzname") in ("UTC", "UTC+00:00"):
        when = when.replace(tzinfo=datetime.UTC)
    return when


def _meta_of(data: dict[str, Any]) -> dict[str, Any]:
    # Older records may hold a non-dict meta; a dict is what every reader expects.
    meta = data.get("meta")
    return meta if isinstance(meta, dict) else {}


class LogBook(NamedRecord):
    """A named collection of flow details (typically one per job or engine run).

    Args:
        name: The logbook's name.
        uuid: Its unique id; a new random one when not given.

    Attributes:
        created_at: When the logbook was created (naive UTC ``datetime``).
        updated_at: When a flow detail was last added (naive UTC ``datetime`` or ``None``).
        meta: Free-form metadata (JSON values when a file or SQL backend stores it).
    """

    def __init__(self, name: str, uuid: str | None = None) -> None:
        super().__init__(name, uuid if uuid else str(uuidlib.uuid4()))
        self._flowdetails_by_id: dict[str, FlowDetail] = {}
        self.created_at: datetime.datetime | None = _utcnow()
        self.updated_at: datetime.datetime | None = None
        self.meta: dict[str, Any] = {}

    def add(self, fd: FlowDetail) -> None:
        """Add a flow detail, replacing any with the same uuid (not saved until a backend saves).

        Args:
            fd: The flow detail.
        """
        self._flowdetails_by_id[fd.uuid] = fd
        self.updated_at = _utcnow()

    def find(self, flow_uuid: str) -> FlowDetail | None:
        """Return the flow detail with ``flow_uuid``, or ``None``."""
        return self._flowdetails_by_id.get(flow_uuid)

    def merge(self, lb: LogBook, deep_copy: bool = False) -> LogBook:
        """Take ``lb``'s meta and timestamps where they differ; its flow details are not merged.

        Args:
            lb: The logbook to merge from; merging a logbook with itself does nothing.
            deep_copy: Deep-copy the values taken instead of sharing references.

        Returns:
            This logbook.
        """
        if lb is self:
            return self
        copy_fn = _copier(deep_copy)
        if self.meta != lb.meta:
            self.meta = copy_fn(lb.meta)
        if self.created_at != lb.created_at:
            self.created_at = copy_fn(lb.created_at)
        if self.updated_at != lb.updated_at:
            self.updated_at = copy_fn(lb.updated_at)
        return self

    def to_dict(self, marshal_time: bool = False) -> dict[str, Any]:
        """Return this logbook (without its flow details) as a dict.

        Args:
            marshal_time: Turn the timestamps into JSON-friendly dicts of their components.
        """
        convert: Callable[[Any], Any] = _marshal_time if marshal_time else (lambda t: t)
        return {
            "name": self.name,
            "meta": self.meta,
            "uuid": self.uuid,
            "updated_at": convert(self.updated_at),
            "created_at": convert(self.created_at),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], unmarshal_time: bool = False) -> LogBook:
        """Build a logbook from a dict made by :meth:`to_dict`.

        Args:
            data: The dict.
            unmarshal_time: The timestamps are component dicts (``to_dict(marshal_time=True)``).
        """
        convert: Callable[[Any], Any] = _unmarshal_time if unmarshal_time else (lambda t: t)
        book = cls(data["name"], uuid=data["uuid"])
        book.updated_at = convert(data.get("updated_at"))
        book.created_at = convert(data.get("created_at"))
        book.meta = _meta_of(data)
        return book

    def copy(self, retain_contents: bool = True) -> LogBook:
        """Return a shallow copy (its flow detail objects are shared, not copied).

        Args:
            retain_contents: Keep the flow details; when false the copy has none.
        """
        clone = copy.copy(self)
        clone._flowdetails_by_id = dict(self._flowdetails_by_id) if retain_contents else {}
        clone.meta = dict(self.meta)
        return clone

    def pformat(self, indent: int = 0, linesep: str = os.linesep) -> str:
        """Return a multi-line, human-readable description of this logbook and its contents."""
        lines = [f"{' ' * indent}{type(self).__name__}: '{self.name}'"]
        lines.extend(format_shared(self, indent + 1))
        lines.extend(format_meta(self.meta, indent + 1))
        for label, when in (("created_at", self.created_at), ("updated_at", self.updated_at)):
            if when is not None:
                lines.append(f"{' ' * (indent + 1)}- {label} = {when.isoformat()}")
        lines.extend(fd.pformat(indent + 1, linesep) for fd in self)
        return linesep.join(lines)

    def __iter__(self) -> Iterator[FlowDetail]:
        return iter(list(self._flowdetails_by_id.values()))

    def __len__(self) -> int:
        return len(self._flowdetails_by_id)


class FlowDetail(NamedRecord):
    """The stored state of one flow: its state, metadata and one atom detail per atom.

    Args:
        name: The flow's name.
        uuid: The flow detail's unique id.

    Attributes:
        state: The flow's state (a :mod:`flowengine.states` constant) or ``None``.
        meta: Free-form metadata (JSON values when a file or SQL backend stores it).
        times: When the flow last entered each state, ``{state: seconds since the epoch}``,
            recorded by the engines with each state change. A flowengine field: not part of
            :meth:`to_dict` nor of :meth:`pformat` (see :mod:`flowengine.persistence.state_times`).
        fencing_token: The greatest claim fencing token a write to the flow was made under
            (None: never written under a claim), kept by the store, which refuses writes made
            under a smaller one. A flowengine field like :attr:`times` (see
            :mod:`flowengine.persistence.fencing`).
    """

    def __init__(self, name: str, uuid: str) -> None:
        super().__init__(name, uuid)
        self._atomdetails_by_id: dict[str, AtomDetail] = {}
        self.state: str | None = None
        self.meta: dict[str, Any] = {}
        self.times: dict[str, float] = {}
        self.fencing_token: int | None = None

    def add(self, ad: AtomDetail) -> None:
        """Add an atom detail, replacing any with the same uuid (not saved until a backend saves).

        Args:
            ad: The atom detail.
        """
        self._atomdetails_by_id[ad.uuid] = ad

    def find(self, ad_uuid: str) -> AtomDetail | None:
        """Return the atom detail with ``ad_uuid``, or ``None``."""
        return self._atomdetails_by_id.get(ad_uuid)

    def update(self, fd: FlowDetail) -> FlowDetail:
        """Make this flow detail share ``fd``'s state, metadata, times, fencing token and atom
        details.

        Args:
            fd: The flow detail to take everything from; updating from itself does nothing.

        Returns:
            This flow detail.
        """
        if fd is self:
            return self
        self._atomdetails_by_id = fd._atomdetails_by_id
        self.state = fd.state
        self.meta = fd.meta
        self.times = fd.times
        self.fencing_token = fd.fencing_token
        return self

    def merge(self, fd: FlowDetail, deep_copy: bool = False) -> FlowDetail:
        """Take ``fd``'s state, meta and times where they differ, and the greater fencing token
        (a token never goes down); its atom details are not merged.

        Args:
            fd: The flow detail to merge from; merging a flow detail with itself does nothing.
            deep_copy: Deep-copy the metadata taken instead of sharing it.

        Returns:
            This flow detail.
        """
        if fd is self:
            return self
        if self.meta != fd.meta:
            self.meta = _copier(deep_copy)(fd.meta)
        if self.times != fd.times:
            self.times = dict(fd.times)
        self.state = fd.state
        if self.fencing_token is None or (fd.fencing_token or 0) > self.fencing_token:
            self.fencing_token = fd.fencing_token
        return self

    def copy(self, retain_contents: bool = True) -> FlowDetail:
        """Return a shallow copy (its atom detail objects are shared, not copied).

        Args:
            retain_contents: Keep the atom details; when false the copy has none.
        """
        clone = copy.copy(self)
        clone._atomdetails_by_id = dict(self._atomdetails_by_id) if retain_contents else {}
        clone.meta = dict(self.meta)
        clone.times = dict(self.times)
        return clone

    def to_dict(self) -> dict[str, Any]:
        """Return this flow detail (without its atom details) as a dict.

        TaskFlow's keys only: :attr:`times` is kept by each backend in a place of its own.
        """
        return {"name": self.name, "meta": self.meta, "state": self.state, "uuid": self.uuid}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FlowDetail:
        """Build a flow detail from a dict made by :meth:`to_dict`."""
        fd = cls(data["name"], data["uuid"])
        fd.state = data.get("state")
        fd.meta = _meta_of(data)
        return fd

    def pformat(self, indent: int = 0, linesep: str = os.linesep) -> str:
        """Return a multi-line, human-readable description of this flow detail and its atoms."""
        lines = [f"{' ' * indent}{type(self).__name__}: '{self.name}'"]
        lines.extend(format_shared(self, indent + 1))
        lines.extend(format_meta(self.meta, indent + 1))
        lines.extend(ad.pformat(indent + 1, linesep) for ad in self)
        return linesep.join(lines)

    def __iter__(self) -> Iterator[AtomDetail]:
        return iter(list(self._atomdetails_by_id.values()))

    def __len__(self) -> int:
        return len(self._atomdetails_by_id)


_DETAIL_TO_NAME: dict[type[AtomDetail], str] = {
    RetryDetail: "RETRY_DETAIL",
    TaskDetail: "TASK_DETAIL",
}
_NAME_TO_DETAIL = {name: cls for cls, name in _DETAIL_TO_NAME.items()}

#: The type names atom details are stored under.
ATOM_TYPES = list(_NAME_TO_DETAIL)


def atom_detail_class(atom_type: str) -> type[AtomDetail]:
    """Return the atom detail class stored under ``atom_type`` (``TASK_DETAIL``, ``RETRY_DETAIL``).

    Raises:
        TypeError: If ``atom_type`` is not one of :data:`ATOM_TYPES`.
    """
    try:
        return _NAME_TO_DETAIL[atom_type]
    except (KeyError, TypeError):
        raise TypeError(f"Unknown atom type '{atom_type}'") from None


def atom_detail_type(atom_detail: AtomDetail) -> str:
    """Return the type name ``atom_detail`` is stored under.

    Raises:
        TypeError: If ``atom_detail`` is not a task or retry detail.
    """
    try:
        return _DETAIL_TO_NAME[type(atom_detail)]
    except KeyError:
        raise TypeError(f"Unknown atom '{atom_detail}' ({type(atom_detail)})") from None
