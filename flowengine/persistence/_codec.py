"""Turning models into JSON-friendly records and back, refusing damaged or foreign records.

The record layouts are TaskFlow's (what its ``to_dict`` methods and file backends produce), so a
directory written by TaskFlow's ``dir`` backend can be read: a logbook is
``LogBook.to_dict(marshal_time=True)``, a flow detail is ``FlowDetail.to_dict()``, an atom detail
is ``{"atom": AtomDetail.to_dict(), "type": "TASK_DETAIL" | "RETRY_DETAIL"}``.

When each state was entered (the details' ``times``, a flowengine field) is not part of those
records: a backend that keeps it in the record's own file adds it under :data:`TIMES` beside
TaskFlow's keys (:func:`with_times`), where TaskFlow's readers never look; the decoders read it
back from there when present. A flow's fencing token (:mod:`flowengine.persistence.fencing`)
goes beside them the same way, under :data:`FENCING_TOKEN` (:func:`with_fencing_token`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from flowengine import exceptions as exc
from flowengine.persistence import fencing, models, state_times
from flowengine.persistence.base import CorruptRecord

BOOK = "logbook"
FLOW = "flow detail"
ATOM = "atom detail"
#: The key of a flow or atom record (the top level, beside TaskFlow's keys) holding ``times``.
TIMES = "times"
#: The key of a flow record (beside TaskFlow's keys) holding its fencing token.
FENCING_TOKEN = "fencing_token"

# What a damaged or foreign record makes the decoders raise (Failure.from_dict included).
_DECODE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError, exc.InvalidFormat)


def book_record(book: models.LogBook) -> dict[str, Any]:
    """Return the record a logbook is stored as."""
    return book.to_dict(marshal_time=True)


def flow_record(fd: models.FlowDetail) -> dict[str, Any]:
    """Return the record a flow detail is stored as."""
    return fd.to_dict()


def atom_record(ad: models.AtomDetail) -> dict[str, Any]:
    """Return the record an atom detail is stored as (its data and its type name)."""
    return {"atom": ad.to_dict(), "type": models.atom_detail_type(ad)}


def with_times(record: dict[str, Any], times: dict[str, float]) -> dict[str, Any]:
    """``record`` (a flow or atom record) with ``times`` beside TaskFlow's keys; unchanged
    (TaskFlow's record exactly) when there are none."""
    return {**record, TIMES: dict(times)} if times else record


def with_fencing_token(record: dict[str, Any], token: int | None) -> dict[str, Any]:
    """``record`` (a flow record) with its fencing ``token`` beside TaskFlow's keys; unchanged
    when it has none."""
    return {**record, FENCING_TOKEN: token} if token is not None else record


@contextlib.contextmanager
def decoding(where: str, kind: str, uuid: str) -> Iterator[None]:
    """Turn any decoding error raised inside into a :class:`CorruptRecord` naming the record."""
    try:
        yield
    except CorruptRecord:
        raise
    except _DECODE_ERRORS as err:
        raise CorruptRecord(
            f"{where}: {kind} '{uuid}' is damaged or not a flowengine record"
            f" ({type(err).__name__}: {err})",
            backend=where,
            kind=kind,
            uuid=uuid,
            cause=err,
        ) from err


def _check_uuid(data: Any, uuid: str) -> None:
    if not isinstance(data, dict):
        raise TypeError(f"expected a JSON object, found {type(data).__name__}")
    if data.get("uuid") != uuid:
        # A record filed under another uuid would silently alias two records.
        raise ValueError(f"record says its uuid is {data.get('uuid')!r}")


def decode_book(where: str, uuid: str, data: Any) -> models.LogBook:
    """Rebuild a logbook from its record."""
    with decoding(where, BOOK, uuid):
        _check_uuid(data, uuid)
        return models.LogBook.from_dict(data, unmarshal_time=True)


def decode_flow(where: str, uuid: str, data: Any) -> models.FlowDetail:
    """Rebuild a flow detail from its record."""
    with decoding(where, FLOW, uuid):
        _check_uuid(data, uuid)
        fd = models.FlowDetail.from_dict(data)
        fd.times = state_times.recorded(data.get(TIMES))
        fd.fencing_token = fencing.recorded(data.get(FENCING_TOKEN))
        return fd


def decode_atom(where: str, uuid: str, data: Any) -> models.AtomDetail:
    """Rebuild an atom detail from its record."""
    with decoding(where, ATOM, uuid):
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, found {type(data).__name__}")
        _check_uuid(data["atom"], uuid)
        ad = models.atom_detail_class(data["type"]).from_dict(data["atom"])
        ad.times = state_times.recorded(data.get(TIMES))
        return ad


def dumps(value: Any, where: str, kind: str, uuid: str) -> str:
    """Encode ``value`` as JSON text.

    Raises:
        flowengine.exceptions.StorageFailure: If ``value`` holds something JSON cannot encode
            (a set, an arbitrary object); the message names the record.
    """
    try:
        return json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise exc.StorageFailure(
            f"{where}: cannot save {kind} '{uuid}': it holds a value JSON cannot encode ({err});"
            " results and metadata must be JSON values with this backend",
            cause=err,
        ) from err


def loads(text: str | bytes, where: str, kind: str, uuid: str) -> Any:
    """Decode JSON text read for a record, raising :class:`CorruptRecord` when it is damaged."""
    with decoding(where, kind, uuid):
        return json.loads(text)
