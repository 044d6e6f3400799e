"""Reading stored flows: the backend named by ``--backend``, and flows and atoms as plain data.

``flows``, ``show`` and ``run --resume`` share these, so every command finds a flow the same
way and ``--json`` prints exactly what the text output is made from.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from typing import Any

import click

from flowengine import exceptions as exc
from flowengine import states
from flowengine.cli import formatting as fmt
from flowengine.cli.loading import LoadError
from flowengine.persistence import backends, base, models, state_times
from flowengine.persistence._record import version_string
from flowengine.persistence.atom_meta import META_DELAYED_UNTIL, META_RETRY_DUE, waiting_of
from flowengine.persistence.backends._uri import mask_urls, split_conf
from flowengine.storage import Storage
from flowengine.types.failure import Failure

#: The pseudo-atom that holds ``--store`` values; not an atom of the flow.
INJECTOR = Storage.injector_name
#: Atom states in the order counts are shown.
STATE_ORDER = (states.PENDING, states.RUNNING, states.SUCCESS, states.FAILURE, states.REVERTING,
               states.REVERTED, states.REVERT_FAILURE, states.RETRYING, states.IGNORE)
#: Atom metadata holding each remote attempt (``WorkerBasedActionEngine`` writes it).
ATTEMPT_LOG = "attempt_log"
_EXECUTE_ENDS = (states.SUCCESS, states.FAILURE)
_REVERT_ENDS = (states.REVERTED, states.REVERT_FAILURE)


def open_backend(uri: str, *, create: bool) -> base.Backend:
    """The backend ``uri`` names; created and upgraded when ``create``, else it must exist.

    Raises:
        click.BadParameter: unknown scheme, or (not ``create``) no such file or directory.
        LoadError: the backend cannot be opened or upgraded.
    """
    shown = mask_urls(uri)
    try:
        scheme, conf = split_conf(uri)
        if not create:
            _check_exists(scheme, uri, conf)
        backend = backends.fetch(uri)
    except (exc.NotFound, ValueError, TypeError) as err:
        raise click.BadParameter(str(err), param_hint="--backend") from err
    if create:
        try:
            with contextlib.closing(backend.get_connection()) as conn:
                conn.upgrade()
        except Exception as err:
            raise LoadError(f"cannot prepare backend {shown}: {err}") from err
    return backend


def _check_exists(scheme: str, uri: str, conf: dict[str, Any]) -> None:
    path = None
    if scheme in ("dir", "file"):
        path = conf.get("path")
    elif scheme == "sqlite":
        raw = urllib.parse.unquote(urllib.parse.urlsplit(uri).path)
        path = raw[1:] if raw.startswith("/") else raw
        path = None if path in ("", ":memory:") else path
    if path and not os.path.exists(path):
        raise ValueError(f"{mask_urls(uri)}: {path} does not exist")


@contextlib.contextmanager
def reading(backend: base.Backend, uri: str,
            keep_open: bool = False) -> Iterator[base.Connection]:
    """A connection whose read errors become a LoadError naming the backend (closed on
    leaving, with the backend unless ``keep_open``)."""
    conn = backend.get_connection()
    try:
        yield conn
    except exc.StorageFailure as err:
        raise LoadError(f"cannot read flows from {mask_urls(uri)}: {err}") from err
    finally:
        conn.close()
        if not keep_open:
            backend.close()


def iter_flows(conn: base.Connection) -> Iterator[tuple[models.LogBook, models.FlowDetail]]:
    """Every stored flow detail (with its atoms) and its logbook."""
    for book in conn.get_logbooks(lazy=True):
        for fd in conn.get_flows_for_book(book.uuid):
            yield book, fd


def find_flow(conn: base.Connection, flow_id: str, uri: str,
              param_hint: str = "FLOW_ID") -> models.FlowDetail:
    """The flow detail whose uuid is ``flow_id`` or, failing that, starts with it.

    Raises:
        click.BadParameter: no flow, or several, match (exit code 2).
    """
    try:
        return conn.get_flow_details(flow_id)
    except (exc.NotFound, exc.StorageFailure):
        pass  # not a whole uuid (the dir backend refuses some as file names): try prefixes
    matches = [fd.uuid for book in conn.get_logbooks(lazy=True)
               for fd in conn.get_flows_for_book(book.uuid, lazy=True)
               if fd.uuid.startswith(flow_id)]
    if len(matches) == 1:
        return conn.get_flow_details(matches[0])
    if matches:
        raise click.BadParameter(f"{flow_id!r} is the start of {len(matches)} flow ids "
                                 f"({', '.join(sorted(matches))}); give more of it",
                                 param_hint=param_hint)
    raise click.BadParameter(f"no flow {flow_id!r} in {mask_urls(uri)}", param_hint=param_hint)


def atoms_of(fd: models.FlowDetail) -> list[models.AtomDetail]:
    """The flow's atom details, without the ``--store`` pseudo-atom, in the order they ran
    (backends return them in any order): by their first recorded state change, atoms that
    never ran last, by name."""
    atoms = [ad for ad in fd if ad.name != INJECTOR]

    def ran(ad: models.AtomDetail) -> tuple[float, str]:
        first = state_times.first_entry(ad)
        return (float("inf") if first is None else first, ad.name)

    return sorted(atoms, key=ran)


def last_update(book: models.LogBook | None, fd: models.FlowDetail,
                written: datetime.datetime | None = None) -> float | None:
    """The flow's "updated" time: see :func:`flowengine.persistence.state_times.updated`
    (``written``: when its logbook was last written, when ``book`` is not given)."""
    return state_times.updated(fd, book.updated_at if book is not None else written)


def book_written(conn: base.Connection, fd: models.FlowDetail) -> datetime.datetime | None:
    """When the logbook holding ``fd`` was last written, for a flow with no recorded state
    change (its "updated" time then); None, without reading anything, for any other flow."""
    if state_times.updated(fd) is not None:
        return None
    for book in conn.get_logbooks(lazy=True):
        if any(found.uuid == fd.uuid
               for found in conn.get_flows_for_book(book.uuid, lazy=True)):
            return book.updated_at
    return None


def flow_summary(book: models.LogBook | None, fd: models.FlowDetail,
                 written: datetime.datetime | None = None) -> dict[str, Any]:
    """One line of ``flows``: the flow, its logbook, atom counts by state, last update
    (``written``: see :func:`last_update`)."""
    atoms = atoms_of(fd)
    counts = Counter(ad.state or states.PENDING for ad in atoms)
    factory = fd.meta.get("factory")
    return {
        "uuid": fd.uuid,
        "name": fd.name,
        "state": fd.state,
        "book": None if book is None else book.name,
        "book_uuid": None if book is None else book.uuid,
        "atoms": len(atoms),
        "atom_states": {s: counts[s] for s in sorted(counts, key=_state_rank)},
        "updated_at": fmt.timestamp(last_update(book, fd, written)),
        "factory": factory.get("name") if isinstance(factory, dict) else None,
    }


def _state_rank(state: str) -> int:
    return STATE_ORDER.index(state) if state in STATE_ORDER else len(STATE_ORDER)


def failure_record(failure: Failure | None) -> dict[str, Any] | None:
    """A stored failure as data (its type names, message and traceback)."""
    if failure is None:
        return None
    return {
        "type": failure.exc_type_names[0] if failure.exc_type_names else None,
        "types": list(failure.exc_type_names),
        "message": failure.exception_str,
        "traceback": failure.traceback_str,
    }


def _span(stamps: dict[str, float], start: str, ends: tuple[str, ...]) -> float | None:
    began = stamps.get(start)
    ended = max((stamps[e] for e in ends if e in stamps), default=None)
    if began is None or ended is None or ended < began:
        return None
    return ended - began


def durations(ad: models.AtomDetail) -> tuple[float | None, float | None]:
    """How long an atom's last execute and last revert took, from when it entered each state
    (else the ``duration`` a :class:`~flowengine.listeners.timing.DurationListener` stored)."""
    times = state_times.entered(ad)
    execute_time = _span(times, states.RUNNING, _EXECUTE_ENDS)
    revert_time = _span(times, states.REVERTING, _REVERT_ENDS)
    if execute_time is None and revert_time is None:
        execute_time = ad.meta.get("duration")
    return execute_time, revert_time


def atom_record(ad: models.AtomDetail) -> dict[str, Any]:
    """Everything ``show`` tells about one atom, as data.

    Timings (``started_at``, durations, and ``times``: when it last entered each state, seconds
    since the epoch) come from what every engine records with each state change (see
    :mod:`flowengine.persistence.state_times`); attempts and workers from the ``attempt_log``,
    ``attempts`` and ``worker``/``workers`` metadata the worker-based engine records;
    ``delayed_until`` (ISO 8601) for a retry controller waiting out its delay or a task whose
    request waits out a delayed dispatch. Missing ones are
    None.
    """
    meta = dict(ad.meta)
    times = state_times.entered(ad)
    is_retry = isinstance(ad, models.RetryDetail)
    execute_time, revert_time = durations(ad)
    attempt_log = meta.get(ATTEMPT_LOG) if isinstance(meta.get(ATTEMPT_LOG), list) else None
    workers = meta.get("workers")
    if workers is None and attempt_log:
        workers = list(dict.fromkeys(a.get("worker") for a in attempt_log if a.get("worker")))
    if workers is None and meta.get("worker") is not None:
        workers = [meta["worker"]]
    return {
        "name": ad.name,
        "uuid": ad.uuid,
        "kind": "retry" if is_retry else "task",
        "state": ad.state,
        "intention": ad.intention,
        "version": version_string(ad.version),
        "progress": meta.get("progress"),
        "started_at": fmt.timestamp(times.get(states.RUNNING)),
        "duration": execute_time,
        "revert_duration": revert_time,
        "attempts": len(ad.results or ()) if is_retry else meta.get("attempts"),
        "workers": workers,
        "attempt_log": attempt_log,
        "delayed_until": (_retry_due(ad.state, meta.get(META_RETRY_DUE)) if is_retry
                          else _task_due(ad.state, meta.get(META_DELAYED_UNTIL))),
        # A lock or concurrency limit it waits for (it is not running meanwhile).
        "waiting_for": (None if ad.state not in (states.PENDING, states.RUNNING, None)
                        else waiting_of(meta)),
        # A retry controller that never ran has no results (its last_results raises).
        "result": ad.last_results if not is_retry or ad.results else None,
        "revert_result": ad.revert_results,
        "failure": failure_record(ad.failure),
        "revert_failure": failure_record(ad.revert_failure),
        "meta": meta,
        "times": times,
    }


def _retry_due(state: str | None, due: Any) -> str | None:
    """When a retry's wait before its next attempt ends: RETRYING while the engine holds the
    wait; SUCCESS (its next attempt decided) while its subflow's first requests wait as
    delayed dispatches (worker-based engines). The due time is forgotten when the wait ends."""
    if state not in (states.RETRYING, states.SUCCESS) or not _is_time(due):
        return None
    return fmt.timestamp(float(due))


def _task_due(state: str | None, due: Any) -> str | None:
    """When a task waiting out a delay starts, if still ahead: a PENDING task's own
    ``start_delay`` on a local engine, or the delayed request of a RUNNING task."""
    if (state not in (states.RUNNING, states.PENDING) or not _is_time(due)
            or due <= time.time()):
        return None
    return fmt.timestamp(float(due))


def _is_time(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
