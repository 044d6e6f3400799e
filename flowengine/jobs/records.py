"""What a jobboard stores and reads back: priorities, postings, trashed jobs, board options.

Every backend writes the same JSON records (:func:`format_posting`, :meth:`TrashedJob.to_dict`),
so they are defined once here. :mod:`flowengine.jobs.base` re-exports these names (TaskFlow's
programs import ``JobPriority`` from there).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import TYPE_CHECKING, Any

from flowengine import exceptions as exc

if TYPE_CHECKING:
    from flowengine.persistence import models

__all__ = ["DEFAULT_CLAIM_TTL", "DEFAULT_MAX_ATTEMPTS", "BoardOptions", "ClaimLost",
           "JobPriority", "TrashedJob", "format_posting", "parse_date", "utcnow"]

#: Seconds a claim lasts unless renewed.
DEFAULT_CLAIM_TTL = 30.0
#: Claims a job gets before it goes to the trash (0: no limit).
DEFAULT_MAX_ATTEMPTS = 3



class ClaimLost(exc.UnclaimableJob):
    """A claim ended (expired, or taken by another owner) while its holder thought it held it.

    Args:
        message: Names the job and the owner that lost it.
        job_uuid: The job.
        who: The owner that lost it.
    """

    def __init__(self, message: str, job_uuid: str = "", who: str = "") -> None:
        super().__init__(message)
        self.job_uuid = job_uuid
        self.who = who


class JobPriority(enum.Enum):
    """How urgent a job is; boards hand out more urgent jobs first."""

    VERY_HIGH = "VERY_HIGH"
    HIGH = "HIGH"
    NORMAL = "NORMAL"
    LOW = "LOW"
    VERY_LOW = "VERY_LOW"

    @classmethod
    def convert(cls, value: JobPriority | str) -> JobPriority:
        """The priority ``value`` names (case-insensitive), or it if it already is one.

        Raises:
            ValueError: If ``value`` names no priority (the message lists the valid ones).
        """
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).upper())
        except ValueError:
            valid = [p.value for p in cls]
            raise ValueError(f"'{value}' is not a valid priority, valid priorities are {valid}") \
                from None

    @property
    def rank(self) -> int:
        """0 for the most urgent priority, 4 for the least."""
        return list(type(self)).index(self)

    @classmethod
    def reorder(cls, *values: tuple[JobPriority | str, Any]) -> Any:
        """Given ``(priority, value)`` pairs, the values most urgent first (stable).

        One pair gives its value alone, as in TaskFlow; more give a tuple.
        """
        if not values:
            raise ValueError("At least one (priority, value) pair is required")
        ordered = sorted(values, key=lambda pair: cls.convert(pair[0]).rank)
        if len(ordered) == 1:
            return ordered[0][1]
        return tuple(value for _, value in ordered)


@dataclasses.dataclass(frozen=True)
class BoardOptions:
    """flowengine's board options, read from the board's conf dict.

    Attributes:
        claim_ttl: Seconds a claim (and an entity registration) lasts unless renewed
            (conf key ``claim_ttl``).
        max_attempts: Claims a job gets before it is trashed; 0 means no limit (conf key
            ``max_attempts``).
    """

    claim_ttl: float = DEFAULT_CLAIM_TTL
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    def __post_init__(self) -> None:
        if not self.claim_ttl > 0:
            raise ValueError(f"Board option claim_ttl must be > 0 seconds, not {self.claim_ttl!r}")
        if self.max_attempts < 0:
            raise ValueError(f"Board option max_attempts must be >= 0, not {self.max_attempts!r}")

    @classmethod
    def from_conf(cls, conf: dict[str, Any]) -> BoardOptions:
        """Read ``claim_ttl`` and ``max_attempts`` (strings from a URI are accepted).

        Raises:
            ValueError: If either is not a number in range (the message names the key).
        """
        values: dict[str, Any] = {}
        for key, kind in (("claim_ttl", float), ("max_attempts", int)):
            if conf.get(key) is None:
                continue
            try:
                values[key] = kind(conf[key])
            except (TypeError, ValueError):
                raise ValueError(f"Board option {key} must be a number, not {conf[key]!r}") \
                    from None
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class TrashedJob:
    """A job set aside in a board's trash, for an operator to inspect or re-post.

    Attributes:
        uuid: The job's uuid (kept on re-post).
        name: The job's name.
        reason: Why it was trashed ("abandoned or orphaned 3 times", or the trasher's reason).
        attempts: Claims it had had.
        trashed_on: When it was trashed (UTC).
        posting: The job's posting as :func:`format_posting` wrote it.
    """

    uuid: str
    name: str
    reason: str
    attempts: int
    trashed_on: datetime.datetime
    posting: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form backends store."""
        return {"uuid": self.uuid, "name": self.name, "reason": self.reason,
                "attempts": self.attempts, "trashed_on": self.trashed_on.isoformat(),
                "posting": self.posting}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrashedJob:
        """Read :meth:`to_dict`'s form."""
        return cls(uuid=data["uuid"], name=data["name"], reason=data.get("reason", ""),
                   attempts=int(data.get("attempts", 0)),
                   trashed_on=datetime.datetime.fromisoformat(data["trashed_on"]),
                   posting=dict(data.get("posting") or {}))


def utcnow() -> datetime.datetime:
    """Now, in UTC, timezone-aware."""
    return datetime.datetime.now(datetime.UTC)


def format_posting(uuid: str, name: str, created_on: datetime.datetime | None = None,
                   last_modified: datetime.datetime | None = None,
                   details: dict[str, Any] | None = None,
                   book: models.LogBook | None = None,
                   priority: JobPriority = JobPriority.NORMAL) -> dict[str, Any]:
    """The JSON-ready record of a job that every backend stores (TaskFlow's keys).

    Dates are ISO 8601 strings; ``book`` becomes ``{"name", "uuid"}``.
    """
    posting: dict[str, Any] = {"uuid": uuid, "name": name, "priority": priority.value,
                               "details": dict(details or {})}
    if created_on is not None:
        posting["created_on"] = created_on.isoformat()
    if last_modified is not None:
        posting["last_modified"] = last_modified.isoformat()
    if book is not None:
        posting["book"] = {"name": book.name, "uuid": book.uuid}
    return posting


def parse_date(value: Any) -> datetime.datetime | None:
    """An ISO 8601 date as written by :func:`format_posting` (None stays None)."""
    if not value:
        return None
    return datetime.datetime.fromisoformat(str(value))
