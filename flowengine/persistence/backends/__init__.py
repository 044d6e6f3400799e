"""Finding a persistence backend from a URI or a configuration dict.

>>> from flowengine.persistence import backends
>>> with backends.backend("sqlite:////tmp/flows.db") as be:  # doctest: +SKIP
...     with contextlib.closing(be.get_connection()) as conn:
...         books = list(conn.get_logbooks())

The configuration is a URI string or a dict whose ``connection`` key holds one (or just a scheme
name such as ``"memory"`` or ``"dir"``). The URI's scheme picks the backend:

=====================================  =================================================
``memory://``                          :class:`~.impl_memory.MemoryBackend`
``file:///path``, ``dir:///path``      :class:`~.impl_dir.DirBackend` (JSON files)
``sqlite://``, ``sqlite:///path``      :class:`~.impl_sqlalchemy.SQLAlchemyBackend`
``postgresql://...``                   :class:`~.impl_sqlalchemy.SQLAlchemyBackend`
``mysql://...``, ``mariadb://...``     :class:`~.impl_sqlalchemy.SQLAlchemyBackend`
=====================================  =================================================

A dialect suffix (``postgresql+psycopg://``) is allowed. Query parameters become configuration
keys (``sqlite:///x.db?busy_timeout=5``) unless the dict sets them already. Other schemes are
looked up as entry points in ``namespace``, so third-party backends can register themselves.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from flowengine.persistence import base
from flowengine.persistence.backends._uri import mask_urls, split_conf
from flowengine.utils import backend_conf

__all__ = ["BACKEND_NAMESPACE", "fetch", "backend"]

LOG = logging.getLogger(__name__)

#: The entry point group searched for schemes flowengine does not know itself.
BACKEND_NAMESPACE = "flowengine.persistence"

_BUILTIN = {
    "memory": "flowengine.persistence.backends.impl_memory:MemoryBackend",
    "dir": "flowengine.persistence.backends.impl_dir:DirBackend",
    "file": "flowengine.persistence.backends.impl_dir:DirBackend",
    "sqlite": "flowengine.persistence.backends.impl_sqlalchemy:SQLAlchemyBackend",
    "postgresql": "flowengine.persistence.backends.impl_sqlalchemy:SQLAlchemyBackend",
    "postgres": "flowengine.persistence.backends.impl_sqlalchemy:SQLAlchemyBackend",
    "mysql": "flowengine.persistence.backends.impl_sqlalchemy:SQLAlchemyBackend",
    "mariadb": "flowengine.persistence.backends.impl_sqlalchemy:SQLAlchemyBackend",
}


def _load_class(scheme: str, namespace: str, shown: str) -> type[base.Backend]:
    cls: type[base.Backend] = backend_conf.load_class(
        scheme, namespace, _BUILTIN, BACKEND_NAMESPACE, "persistence backend for scheme",
        f" (in {shown!r})",
    )
    return cls


def fetch(
    conf: str | dict[str, Any], namespace: str = BACKEND_NAMESPACE, **kwargs: Any
) -> base.Backend:
    """Build the backend a URI or configuration dict names.

    Args:
        conf: A URI (``sqlite:////var/lib/app/flows.db``) or a dict with ``connection`` and
            backend options.
        namespace: The entry point group searched for schemes flowengine does not know.
        **kwargs: Passed to the backend's constructor after the configuration.

    Returns:
        The backend (nothing is connected or created yet).

    Raises:
        flowengine.exceptions.NotFound: If no backend handles the scheme (the message names it).
    """
    scheme, options = split_conf(conf)
    shown = mask_urls(str(options.get("connection")))
    cls = _load_class(scheme, namespace, shown)
    LOG.debug("Using %s for persistence %r", cls.__name__, shown)
    return cls(options, **kwargs)


@contextlib.contextmanager
def backend(
    conf: str | dict[str, Any], namespace: str = BACKEND_NAMESPACE, **kwargs: Any
) -> Iterator[base.Backend]:
    """Fetch a backend, upgrade its storage layout, yield it, and close it afterwards.

    Args:
        conf: As for :func:`fetch`.
        namespace: As for :func:`fetch`.
        **kwargs: As for :func:`fetch`.
    """
    with contextlib.closing(fetch(conf, namespace=namespace, **kwargs)) as be:
        with contextlib.closing(be.get_connection()) as conn:
            conn.upgrade()
        yield be
