"""A backend that keeps records in a SQL database through SQLAlchemy 2.x.

SQLite (a file: the embedded default; several processes may share it), PostgreSQL (through psycopg
3: ``pip install 'flowengine[postgresql]'``) and MySQL/MariaDB (through PyMySQL: ``pip install
'flowengine[mysql]'``) are tested; other SQLAlchemy databases may work. The schema is versioned:
:meth:`Connection.upgrade` creates it or brings an older one forward, and a schema newer than this
code is refused with :class:`~flowengine.persistence.base.IncompatibleSchema`. See
``doc/persistence.rst``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from flowengine import exceptions as exc
from flowengine.persistence import base, models
from flowengine.persistence._hints import upgrade_hint
from flowengine.persistence._store import LayoutStatus, RecordStore, Session, StoreConnection
from flowengine.persistence.backends._sql import migrations, tables
from flowengine.persistence.backends._sql.engine import (
    WRITE_OPTION,
    SQLOptions,
    create_engine,
    describe,
    masker,
)
from flowengine.persistence.backends._sql.session import SQLSession, replace_atom_sql
from flowengine.persistence.backends._uri import mask_urls

__all__ = ["SQLAlchemyBackend"]

LOG = logging.getLogger(__name__)

# PostgreSQL SQLSTATEs a retried transaction can get past: serialization failure, deadlock.
_RETRYABLE_PG_CODES = frozenset({"40001", "40P01"})
# ... and MySQL's error numbers for a deadlock (1213) and a lost race to insert (1062 is an
# IntegrityError already).
_RETRYABLE_MYSQL_CODES = frozenset({1213})
_CONNECT_ERRORS = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)


class _SQLStore(RecordStore):
    def __init__(self, engine: sa.Engine, max_retries: int, url: str) -> None:
        self.engine = engine
        self.description = describe(engine.url)
        self.url = url  # as the user gave it (password masked): what commands in messages name
        self._mask: Callable[[str], str] = masker(engine.url)
        self._max_retries = max_retries
        self._tables = tables.define(sa.MetaData())
        self._schema_ok = False
        self._sqlite = engine.dialect.name == "sqlite"
        in_memory = self._sqlite and (engine.url.database or "") in ("", ":memory:")
        # An in-memory SQLite database is one shared connection: transactions must take turns.
        self._serial: contextlib.AbstractContextManager[Any] = (
            threading.Lock() if in_memory else contextlib.nullcontext()
        )

    def mask(self, text: str) -> str:
        return self._mask(text)

    def is_conflict(self, err: BaseException) -> bool:
        if isinstance(err, sa_exc.IntegrityError):
            return True  # two writers inserted one new record; the retry updates it instead
        original = getattr(err, "orig", None)
        code = getattr(original, "sqlstate", None)
        if isinstance(err, sa_exc.DBAPIError) and self.engine.dialect.name in ("mysql", "mariadb"):
            args: tuple[object, ...] = getattr(original, "args", ())
            return bool(args) and args[0] in _RETRYABLE_MYSQL_CODES
        return isinstance(err, sa_exc.DBAPIError) and code in _RETRYABLE_PG_CODES

    @contextlib.contextmanager
    def _connection(self, write: bool) -> Iterator[sa.Connection]:
        """A connection of this store's, one at a time (SQLite: a writing one if ``write``)."""
        with self._serial, self.engine.connect() as conn:
            if write and self._sqlite:
                conn.execution_options(**{WRITE_OPTION: True})
            yield conn

    @contextlib.contextmanager
    def _transaction(self, write: bool) -> Iterator[sa.Connection]:
        with self._connection(write) as conn, conn.begin():
            yield conn

    @contextlib.contextmanager
    def session(self, write: bool) -> Iterator[Session]:
        with self._transaction(write) as conn:
            if not self._schema_ok:
                self._require_current(conn)
            yield SQLSession(conn, self._tables, self.description, write)

    def replace_atom(self, ad: models.AtomDetail) -> bool | None:
        if not self._schema_ok:
            return None  # the first writes go through a session, which checks the schema
        sql, params = replace_atom_sql(self._tables.atomdetails, self.engine.dialect, ad,
                                       self.description)
        # One statement on the pooled DB-API connection: on SQLite (driver autocommit, see
        # _sql/engine.py) it is a transaction of its own, so BEGIN IMMEDIATE and COMMIT, each a
        # trip through SQLAlchemy, are not needed; elsewhere the driver begins one, committed
        # below. Either way an atom state change costs one write and no statement building.
        with self._serial:
            raw = self.engine.raw_connection()
            try:
                cursor = raw.cursor()
                try:
                    cursor.execute(sql, params)
                    replaced = cursor.rowcount > 0
                finally:
                    cursor.close()
                raw.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    raw.rollback()
                raise
            finally:
                raw.close()
        return replaced

    def _require_current(self, conn: sa.Connection) -> None:
        version = migrations.check(conn, self.description, self.url)
        if version < migrations.LATEST:
            state = "has no flowengine schema" if version == 0 else f"has schema version {version}"
            raise exc.StorageFailure(
                f"{self.description}: the database {state}, and this flowengine needs version"
                f" {migrations.LATEST}; {upgrade_hint(self.url)}"
            )
        self._schema_ok = True

    def upgrade(self) -> list[str]:
        with self._connection(True) as conn, \
                migrations.upgrade_lock(conn, self.description), conn.begin():
            applied = migrations.upgrade(conn, self.description, self.url)
        if applied:
            LOG.info("%s: applied schema migrations %s", self.description,
                     [migration.version for migration in applied])
        self._schema_ok = True
        return [f"schema version {m.version}: {m.description}" for m in applied]

    def layout(self) -> LayoutStatus:
        with self._serial, self.engine.connect() as conn:
            version = migrations.check(conn, self.description, self.url)
        steps = tuple(f"schema version {m.version}: {m.description}"
                      for m in migrations.pending(version))
        return LayoutStatus(self.description, version, migrations.LATEST, steps)

    def reach(self) -> None:
        self._connect(lambda conn: None)

    def validate(self) -> None:
        self._connect(lambda conn: migrations.check(conn, self.description, self.url))

    def _connect(self, check: Callable[[sa.Connection], object]) -> None:
        delay = 0.5
        for attempt in range(self._max_retries + 1):
            try:
                with self.engine.connect() as conn:
                    check(conn)
                return
            except _CONNECT_ERRORS as err:
                if attempt >= self._max_retries:
                    raise
                LOG.warning(
                    "%s: connecting failed (%s); retrying in %.1fs",
                    self.description,
                    self._mask(str(err).splitlines()[0]),
                    delay,
                )
                time.sleep(delay)
                delay = min(delay * 2, 30.0)


class SQLAlchemyBackend(base.Backend):
    """Keeps logbooks in a SQL database.

    Configuration keys (all but ``connection`` optional):

    * ``connection``: the database URL, e.g. ``sqlite:////var/lib/app/flows.db``,
      ``postgresql://user:password@host/db`` (``postgresql+psycopg://`` is the same),
      ``mysql://user:password@host/db`` or ``mariadb://...`` (PyMySQL; ``mysql+pymysql://``).
    * ``busy_timeout`` (seconds, default 30): how long a SQLite writer waits for another.
    * ``lock_timeout`` (seconds, default 30; 0 waits forever): how long a PostgreSQL, MySQL or
      MariaDB statement waits for a lock another transaction holds (a row read ``FOR UPDATE``).
    * ``statement_timeout`` (seconds, default 120; 0 means no limit): how long any PostgreSQL
      or MariaDB statement may run before the server cancels it.
    * ``max_retries`` (default 0): extra attempts to connect when validating, with backoff.
    * ``idle_timeout``, ``max_pool_size``, ``max_overflow``, ``pool_timeout``,
      ``connect_timeout``, ``isolation_level``, ``echo``, ``engine_args``: engine and pool
      settings (``engine_args`` is passed to :func:`sqlalchemy.create_engine` last).

    A wait that runs out fails with :class:`~flowengine.exceptions.BackendError` naming the
    database and the record.

    Args:
        conf: The configuration.
        engine: An engine to use instead of creating one; it is not disposed by :meth:`close`,
            and neither the SQLite sharing hooks nor the PostgreSQL timeouts are added to it.

    Raises:
        ValueError: If the configuration is invalid.
        ImportError: If the database driver is missing.
    """

    def __init__(self, conf: dict[str, Any] | None, engine: sa.Engine | None = None) -> None:
        super().__init__(conf)
        if engine is not None:
            self._engine = engine
            self._owns_engine = False
            options = SQLOptions.from_conf({"connection": engine.url, **self._conf})
        else:
            options = SQLOptions.from_conf(self._conf)
            self._engine = create_engine(options)
            self._owns_engine = True
        given = self._conf.get("connection")
        url = (mask_urls(given) if isinstance(given, str)
               else options.url.render_as_string(hide_password=True))
        self._store = _SQLStore(self._engine, options.max_retries, url)
        self._validated = False
        LOG.debug("Created %s", self._store.description)

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine."""
        return self._engine

    def get_connection(self) -> StoreConnection:
        """Return a connection; the first one checks the database can be reached.

        The schema is checked when the connection is first used (or by its ``validate()``), so
        a store that needs ``flowengine db upgrade``, or a TaskFlow store, is refused where the
        caller reports storage errors, with a message naming the command to run.

        Raises:
            flowengine.exceptions.BackendError: If the database cannot be reached.
        """
        conn = StoreConnection(self, self._store)
        if not self._validated:
            conn.reach()
            self._validated = True
        return conn

    def close(self) -> None:
        """Close pooled connections (of an engine this backend created)."""
        if self._owns_engine:
            self._engine.dispose()
        self._validated = False
