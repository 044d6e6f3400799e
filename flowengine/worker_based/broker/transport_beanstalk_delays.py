"""Delayed beanstalkd jobs an engine may have to take back: their ids, and deleting one.

A request published with header ``x-flowengine-delay`` is a *delayed* job until its delay
ends; beanstalkd lets any connection ``delete`` it meanwhile (a reserved job only its holder).
The publisher learns which job its put became through a :func:`receipt` it holds open around
the publish (a put is synchronous, on the publisher's thread): the transport :func:`record` s
the job there as a *handle*, ``beanstalk://host:port/job-id?attempt=ATTEMPT-ID``, which names
the server, so the engine can store it with the atom and the process that resumes the flow
after a crash can :func:`delete` the job without knowing the broker's settings. Nothing is
kept for a put no receipt asked about. The attempt id guards the delete: a beanstalkd
restarted without a binlog numbers its jobs from 1 again, so the stored id may name another
program's job by then; :func:`delete` looks at the job first and leaves it alone unless it
carries that attempt.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import socket
import urllib.parse
from collections.abc import Iterator

LOG = logging.getLogger(__name__)

#: Handle scheme (the transport's URL scheme).
SCHEME = "beanstalk"
#: Seconds a delete may take to connect and answer.
DELETE_TIMEOUT = 5.0


@dataclasses.dataclass
class Receipt:
    """What a delayed put became: the job's handle, once the transport put it."""

    handle: str | None = None


_RECEIPT: contextvars.ContextVar[Receipt | None] = contextvars.ContextVar(
    "flowengine_beanstalk_receipt", default=None)


@contextlib.contextmanager
def receipt() -> Iterator[Receipt]:
    """Hold a receipt open around a publish: the delayed job it puts is recorded in it."""
    made = Receipt()
    token = _RECEIPT.set(made)
    try:
        yield made
    finally:
        _RECEIPT.reset(token)


def handle(address: tuple[str, int], job_id: int, attempt: str | None = None) -> str:
    """The handle of job ``job_id`` (the request ``attempt``) on the beanstalkd at ``address``."""
    host, port = address
    query = f"?{urllib.parse.urlencode({'attempt': attempt})}" if attempt else ""
    return f"{SCHEME}://{host}:{port}/{job_id}{query}"


def record(correlation_id: str, address: tuple[str, int], job_id: int) -> None:
    """Tell the publisher's open :func:`receipt` (if any) that the message ``correlation_id``
    became delayed job ``job_id``; a publish retried after a put keeps the last job's."""
    current = _RECEIPT.get()
    if current is not None:
        current.handle = handle(address, job_id, correlation_id)


def parse(job: str) -> tuple[tuple[str, int], int]:
    """``(address, job id)`` of a handle; ValueError naming it if it is not one."""
    parts = urllib.parse.urlsplit(job)
    try:
        if parts.scheme != SCHEME or not parts.hostname or parts.port is None:
            raise ValueError("not beanstalk://host:port/job-id")
        return (parts.hostname, parts.port), int(parts.path.lstrip("/"))
    except ValueError as err:
        raise ValueError(f"Not a beanstalkd job handle: {job!r} ({err})") from None


def attempt_of(job: str) -> str | None:
    """The attempt id a handle names (None for a handle without one)."""
    values = urllib.parse.parse_qs(urllib.parse.urlsplit(job).query).get("attempt")
    return values[0] if values else None


def delete(job: str) -> bool:
    """Delete the job ``job`` names; True if it was deleted, False if it is gone or held.

    A job whose delay ended and that a worker reserved cannot be deleted (beanstalkd answers
    NOT_FOUND, as for a job already settled): the worker's own checks decide then. A job that
    does not carry the handle's attempt id is another job under a reused id: left alone.
    """
    try:
        import greenstalk
    except ImportError as err:
        raise ImportError("Deleting a delayed beanstalkd job needs the greenstalk package: "
                          "pip install 'flowengine[beanstalk]'") from err

    address, job_id = parse(job)
    try:
        sock = socket.create_connection(address, timeout=DELETE_TIMEOUT)
    except OSError as err:
        LOG.warning("Could not reach beanstalkd at %s:%d to delete delayed job %d: %s",
                    *address, job_id, err)
        return False
    sock.settimeout(DELETE_TIMEOUT)
    client = greenstalk.Client(sock, encoding=None)
    attempt = attempt_of(job)
    try:
        if attempt is not None and attempt.encode() not in client.peek(job_id).body:
            LOG.warning("Delayed job %d on %s:%d is not attempt %s any more (the server "
                        "reused its id): left alone", job_id, *address, attempt)
            return False
        client.delete(job_id)
    except greenstalk.NotFoundError:
        return False
    finally:
        client.close()
    return True
