"""Where a backend's storage layout stands, and bringing it to the one this flowengine uses.

What ``flowengine db status`` and ``flowengine db upgrade`` run::

    >>> from flowengine.persistence import backends, layout
    >>> be = backends.fetch("sqlite:////var/lib/app/flows.db")  # doctest: +SKIP
    >>> layout.status(be).pending                              # doctest: +SKIP
    ('schema version 3: index on flowdetails (updated_at, uuid)',)
    >>> layout.upgrade(be)                                     # doctest: +SKIP
    ['schema version 3: index on flowdetails (updated_at, uuid)']

A SQL database has a schema version (one row per applied step in ``flowengine_schema``); a
directory has folders; memory has nothing to upgrade. A store this flowengine cannot use at all
(a newer schema, a TaskFlow database) raises
:class:`~flowengine.persistence.base.IncompatibleSchema`, whose message names the command to run.
"""

from __future__ import annotations

import contextlib

from flowengine.persistence import base
from flowengine.persistence._store import LayoutStatus, StoreConnection

__all__ = ["LayoutStatus", "describe", "status", "upgrade"]


def describe(backend: base.Backend) -> str:
    """How messages name ``backend`` (``sqlalchemy backend 'sqlite:///x.db'``), secrets masked."""
    with contextlib.closing(backend.get_connection()) as conn:
        if isinstance(conn, StoreConnection):
            return conn.description
        return type(backend).__name__


def status(backend: base.Backend) -> LayoutStatus:
    """Where ``backend``'s layout stands; nothing is changed.

    A third-party backend that does not say is reported as current.

    Raises:
        flowengine.exceptions.StorageFailure: If the store cannot be reached, or cannot be used
            by this flowengine at all (:class:`~flowengine.persistence.base.IncompatibleSchema`).
    """
    with contextlib.closing(backend.get_connection()) as conn:
        if isinstance(conn, StoreConnection):
            return conn.layout()
        return LayoutStatus(type(backend).__name__)


def upgrade(backend: base.Backend) -> list[str]:
    """Bring ``backend``'s layout to the one this flowengine uses; return the steps applied.

    Idempotent: a current store is left alone and nothing is returned. Concurrent upgrades of one
    database apply each step once. A third-party backend's ``upgrade()`` is run and reported as
    one step.

    Raises:
        flowengine.exceptions.StorageFailure: As for :func:`status`, or if a step fails (the
            database is left at the version before it).
    """
    with contextlib.closing(backend.get_connection()) as conn:
        if isinstance(conn, StoreConnection):
            return conn.upgrade_layout()
        conn.upgrade()
        return [f"{type(backend).__name__}.upgrade()"]
