"""What a jobboard stores and reads back: priorities, postings, trashed jobs, board options.

Every backend writes the same JSON records (:func:`format_posting`, :meth:`TrashedJob.to_dict`),
so they are defined once here. :mod:`flowengine.jobs.base` re-exports these names (TaskFlow's
programs import ``JobPriority`` from there).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
from typing import TYPE_CHECKING, Any

from flowengine import exceptions as exc

if TYPE_CHECKING:
    from flowengine.persistence import models

__all__ = ["DAMAGED_NAME", "DEFAULT_CLAIM_TTL", "DEFAULT_MAX_ATTEMPTS", "BoardOptions",
           "ClaimLost", "DamagedPosting", "JobPriority", "PostingError", "TrashedJob",
           "check_posting", "damaged_posting", "fencing_token", "format_posting", "parse_date",
           "read_posting", "trashed_job", "utcnow"]

#: Seconds a claim lasts unless renewed.
DEFAULT_CLAIM_TTL = 30.0
#: Claims a job gets before it goes to the trash (0: no limit).
DEFAULT_MAX_ATTEMPTS = 3
#: The name a damaged posting has in the trash (it may have had none).
DAMAGED_NAME = "(damaged posting)"


def fencing_token(previous: int, now: float) -> int:
    """The fencing token of a new claim of a job: greater than ``previous`` (the job's last
    one) and at least ``now`` (seconds since the epoch) in microseconds.

    The board's counter alone makes a job's tokens grow, whatever the clocks do; the clock
    makes the tokens of a job posted again for a flow that an earlier job ran (an orphan
    re-posted after its board lost it, a trashed job re-posted) start above those that job
    wrote, since a board that lost a job lost its counter too.
    """
    return max(previous + 1, int(now * 1_000_000))


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


def trashed_job(posting: dict[str, Any], info: Any) -> TrashedJob | None:
    """The trashed job a board stored as ``posting`` plus ``info`` (``reason``, ``attempts``,
    ``trashed_on``); None if they are not one (a damaged trash entry is skipped, not fatal)."""
    if not isinstance(posting, dict) or not isinstance(info or {}, dict):
        return None
    info = info or {}
    try:
        return TrashedJob.from_dict({
            "uuid": posting["uuid"], "name": posting["name"], "posting": posting,
            "reason": str(info.get("reason", "")), "attempts": info.get("attempts", 0),
            "trashed_on": info.get("trashed_on") or utcnow().isoformat()})
    except (KeyError, TypeError, ValueError):
        return None


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


class PostingError(ValueError):
    """A stored value is not a job posting; the message says what is wrong with it."""


@dataclasses.dataclass(frozen=True)
class DamagedPosting:
    """A value on a board that should be a job posting and is not.

    Attributes:
        key: Where it is stored (a Redis hash field, a ZooKeeper node, an etcd key).
        reason: What is wrong with it (never its content).
        trashed: Whether the board moved it to the trash.
    """

    key: str
    reason: str
    trashed: bool = False


def check_posting(data: Any) -> dict[str, Any]:
    """``data`` if it is a job posting a board can offer, as :func:`format_posting` writes it.

    Only what TaskFlow's boards need is required (a ``uuid`` and a ``name``); what is present
    must have the type a conductor reads (``details`` and ``book`` objects, a known
    ``priority``, ISO dates), so that a damaged posting is refused here, where the board can
    skip it, and not in a conductor.

    Raises:
        PostingError: naming the first field at fault (never its value).
    """
    if not isinstance(data, dict):
        raise PostingError(f"a JSON {_json_kind(data)}, not an object")
    for key in ("uuid", "name"):
        if key not in data:
            raise PostingError(f"it has no {key!r}")
        if not isinstance(data[key], str) or not data[key]:
            raise PostingError(f"its {key!r} is a JSON {_json_kind(data[key])}, not a string"
                               if not isinstance(data[key], str) else f"its {key!r} is empty")
    for key in ("details", "book"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise PostingError(f"its {key!r} is a JSON {_json_kind(data[key])}, not an object")
    book = data.get("book") or {}
    if book.get("uuid") is not None and not isinstance(book["uuid"], str):
        raise PostingError(f"its book's 'uuid' is a JSON {_json_kind(book['uuid'])}, not a string")
    try:
        JobPriority.convert(data.get("priority") or JobPriority.NORMAL)
    except ValueError:
        raise PostingError("its 'priority' names no priority") from None
    for key in ("created_on", "last_modified"):
        try:
            parse_date(data.get(key))
        except (TypeError, ValueError):
            raise PostingError(f"its {key!r} is not an ISO 8601 date") from None
    return data


def read_posting(raw: bytes | str) -> dict[str, Any]:
    """The posting a stored value holds (UTF-8 JSON), checked by :func:`check_posting`.

    Raises:
        PostingError: naming what is wrong (not UTF-8, not JSON, not a posting).
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise PostingError("not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise PostingError(f"not JSON ({err.msg} at character {err.pos})") from None
    except ValueError as err:  # a number too long to read, say
        raise PostingError(f"not JSON ({err})") from None
    return check_posting(data)


def damaged_posting(key: str, raw: bytes | str | None, reason: str) -> dict[str, Any]:
    """What a board keeps in its trash for a damaged posting found at ``key``.

    It has a posting's shape (so trash listings read it), a ``uuid`` (the one the value
    names, else ``key``'s last part), and the value as it was under ``damaged``, so that an
    operator can still look at it where it was already stored.
    """
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw or ""
    try:
        named = json.loads(text).get("uuid")
    except (ValueError, AttributeError):
        named = None
    uuid = named if isinstance(named, str) and named else key.rstrip("/").rpartition("/")[2]
    return {"uuid": uuid, "name": DAMAGED_NAME, "details": {}, "damaged": text,
            "damage": reason}


def _json_kind(value: Any) -> str:
    """What JSON calls ``value``'s type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    for kind, name in ((str, "string"), ((int, float), "number"), (list, "array"),
                       (dict, "object")):
        if isinstance(value, kind):
            return name
    return type(value).__name__
