"""Shortcuts for making logbooks and flow details, optionally saved to a backend."""

from __future__ import annotations

import contextlib
import logging
import uuid as uuidlib
from typing import Any

from flowengine.persistence import base, models

__all__ = ["temporary_log_book", "temporary_flow_detail", "create_flow_detail"]

LOG = logging.getLogger(__name__)


def _save(backend: base.Backend, book: models.LogBook) -> None:
    with contextlib.closing(backend.get_connection()) as conn:
        conn.save_logbook(book)


def temporary_log_book(backend: base.Backend | None = None) -> models.LogBook:
    """Return a new logbook named ``tmp``, saved to ``backend`` when one is given.

    Meant for tests and short-lived work that needs a logbook but will not look it up again.
    """
    book = models.LogBook("tmp")
    if backend is not None:
        _save(backend, book)
    return book


def temporary_flow_detail(
    backend: base.Backend | None = None, meta: dict[str, Any] | None = None
) -> tuple[models.LogBook, models.FlowDetail]:
    """Return a new temporary logbook and a flow detail inside it, saved to ``backend`` if given.

    Args:
        backend: Where to save both, or ``None`` to keep them in memory only.
        meta: Metadata to put on the flow detail.

    Returns:
        ``(logbook, flow_detail)``.
    """
    book = temporary_log_book(backend)
    flow_detail = models.FlowDetail(name="tmp-flow-detail", uuid=str(uuidlib.uuid4()))
    if meta is not None:
        flow_detail.meta.update(meta)
    book.add(flow_detail)
    if backend is not None:
        _save(backend, book)
    return book, flow_detail


def create_flow_detail(
    flow: Any,
    book: models.LogBook | None = None,
    backend: base.Backend | None = None,
    meta: dict[str, Any] | None = None,
) -> models.FlowDetail:
    """Create a flow detail named after ``flow``, add it to ``book`` and save the book.

    Args:
        flow: The flow; its ``name`` names the detail (its uuid does when it has none).
        book: The logbook to add it to. Without one but with a backend, a temporary logbook is
            made (and not returned, so prefer passing one).
        backend: Where to save the logbook; without one nothing is saved.
        meta: Metadata to put on the flow detail.

    Returns:
        The new flow detail.
    """
    flow_id = str(uuidlib.uuid4())
    flow_name = getattr(flow, "name", None)
    if flow_name is None:
        LOG.warning("Flow %s has no name; naming its flow detail %s", flow, flow_id)
        flow_name = flow_id
    flow_detail = models.FlowDetail(name=flow_name, uuid=flow_id)
    if meta is not None:
        flow_detail.meta.update(meta)
    if backend is not None and book is None:
        LOG.warning("No logbook given for flow %s; creating a temporary one", flow)
        book = temporary_log_book(backend)
    if book is None:
        return flow_detail
    book.add(flow_detail)
    if backend is not None:
        _save(backend, book)
    return flow_detail
