"""Building the SQLAlchemy engine from a backend configuration, and keeping secrets out of text.

SQLite files are opened so that several processes can share one: write-ahead logging (readers
never block the writer), a busy timeout (a writer waits for another instead of failing at once),
and write transactions that take the write lock when they begin (``BEGIN IMMEDIATE``), because a
transaction that reads first and upgrades to writing later can fail with "database is locked"
without waiting at all. PostgreSQL connections get a lock timeout and a statement timeout, so a
lock another transaction keeps fails a save instead of blocking it forever. MySQL and MariaDB
(through PyMySQL) get the same two bounds where the server has them: ``innodb_lock_wait_timeout``
on both, ``max_statement_time`` on MariaDB (MySQL's ``max_execution_time`` covers reads only).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sqlite3
import urllib.parse
import weakref
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy import pool as sa_pool

from flowengine.persistence.backends._uri import mask_urls, seconds_option
from flowengine.secrets import Masker

LOG = logging.getLogger(__name__)

#: Execution option a write session sets, so the SQLite begin hook takes the write lock at once.
WRITE_OPTION = "flowengine_write"

_DEFAULT_ISOLATION = {"postgresql": "READ COMMITTED", "mysql": "READ COMMITTED"}
_MEMORY_SQLITE = ("", ":memory:")
_OPTION_KEYS = (
    "echo",
    "idle_timeout",
    "max_pool_size",
    "max_overflow",
    "pool_timeout",
    "connect_timeout",
    "isolation_level",
    "busy_timeout",
    "lock_timeout",
    "statement_timeout",
    "max_retries",
)


def _as_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", "", "none"):
        return False
    raise ValueError(f"SQLAlchemy backend option '{key}' must be a boolean, not {value!r}")


def _as_int(conf: dict[str, Any], key: str, default: int | None) -> int | None:
    value = conf.get(key, default)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError) as err:
        message = f"SQLAlchemy backend option '{key}' must be an integer, not {value!r}"
        raise ValueError(message) from err


def _as_seconds(conf: dict[str, Any], key: str, default: float) -> float:
    return seconds_option(conf, key, default, "SQLAlchemy backend")


@dataclasses.dataclass(frozen=True)
class SQLOptions:
    """The SQLAlchemy backend's configuration, checked when built.

    Attributes:
        url: The database URL (driver made explicit: ``postgresql`` means psycopg 3).
        echo: Log every statement (SQLAlchemy's ``echo``).
        idle_timeout: Seconds after which pooled connections are recycled.
        max_pool_size: Pool size (server databases).
        max_overflow: Connections allowed beyond the pool (server databases).
        pool_timeout: Seconds to wait for a pooled connection (server databases).
        connect_timeout: Seconds to wait for a server connection (PostgreSQL, MySQL, MariaDB).
        isolation_level: Transaction isolation (``READ COMMITTED`` on PostgreSQL, MySQL and
            MariaDB by default).
        busy_timeout: Seconds a SQLite writer waits for another writer before failing.
        lock_timeout: Seconds a PostgreSQL, MySQL or MariaDB statement waits for a lock (a row
            another transaction holds ``FOR UPDATE``, say) before failing; 0 waits forever
            (MySQL counts whole seconds).
        statement_timeout: Seconds any PostgreSQL or MariaDB statement may run before it is
            cancelled; 0 means no limit.
        max_retries: Extra attempts :meth:`validate` makes to connect, with backoff.
        engine_args: Further ``create_engine`` arguments, overriding the ones above.
    """

    url: sa.URL
    echo: bool = False
    idle_timeout: int = 3600
    max_pool_size: int | None = None
    max_overflow: int | None = None
    pool_timeout: int | None = None
    connect_timeout: int = 10
    isolation_level: str | None = None
    busy_timeout: float = 30.0
    lock_timeout: float = 30.0
    statement_timeout: float = 120.0
    max_retries: int = 0
    engine_args: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_conf(cls, conf: dict[str, Any]) -> SQLOptions:
        """Build the options from a backend configuration dict.

        Raises:
            ValueError: If ``connection`` is missing or an option has the wrong type.
        """
        connection = conf.get("connection")
        if not connection:
            raise ValueError("SQLAlchemy backend needs a 'connection' URL; none given")
        # Options given as URI query parameters are ours, not the database driver's.
        url = normalize_url(str(connection)).difference_update_query(_OPTION_KEYS)
        engine_args = conf.get("engine_args") or {}
        if not isinstance(engine_args, dict):
            raise ValueError("SQLAlchemy backend option 'engine_args' must be a dict")
        return cls(
            url=url,
            echo=_as_bool(conf.get("echo", False), "echo"),
            idle_timeout=_as_int(conf, "idle_timeout", 3600) or 3600,
            max_pool_size=_as_int(conf, "max_pool_size", None),
            max_overflow=_as_int(conf, "max_overflow", None),
            pool_timeout=_as_int(conf, "pool_timeout", None),
            connect_timeout=_as_int(conf, "connect_timeout", 10) or 10,
            isolation_level=conf.get("isolation_level"),
            busy_timeout=_as_seconds(conf, "busy_timeout", 30.0),
            lock_timeout=_as_seconds(conf, "lock_timeout", 30.0),
            statement_timeout=_as_seconds(conf, "statement_timeout", 120.0),
            max_retries=max(0, _as_int(conf, "max_retries", 0) or 0),
            engine_args=dict(engine_args),
        )


#: The driver a bare scheme means: the one the extra of that database installs.
_DEFAULT_DRIVERS = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg",
                    "mysql": "mysql+pymysql", "mariadb": "mariadb+pymysql"}
#: The extra that installs each database's driver.
_EXTRAS = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql"}


def normalize_url(connection: str) -> sa.URL:
    """Parse a database URL, choosing the driver of its extra for a bare scheme: psycopg 3 for
    ``postgresql://`` (or ``postgres://``), PyMySQL for ``mysql://`` and ``mariadb://``."""
    try:
        url = sa.make_url(connection)
    except sa_exc.ArgumentError as err:
        raise ValueError(f"Not a database URL: {mask_urls(connection)!r}") from err
    driver = _DEFAULT_DRIVERS.get(url.drivername)
    if driver is not None:
        url = url.set(drivername=driver)
    if url.get_backend_name() in ("mysql", "mariadb") and "charset" not in url.query:
        # Four-byte UTF-8: MySQL's ``utf8`` is three bytes and refuses emoji in a result.
        url = url.update_query_dict({"charset": "utf8mb4"})
    return url


def describe(url: sa.URL) -> str:
    """Name a database in messages, password masked."""
    return f"sqlalchemy backend '{url.render_as_string(hide_password=True)}'"


def masker(url: sa.URL) -> Callable[[str], str]:
    """Return a function that removes ``url``'s password (plain and URL-quoted) from text."""
    password = url.password or ""
    secrets = Masker([password, urllib.parse.quote(password, safe="")] if password else [])

    def mask(text: str) -> str:
        return secrets.text(mask_urls(text))

    return mask


def _on_sqlite_connect(busy_timeout: float) -> Any:
    def on_connect(dbapi_conn: sqlite3.Connection, record: Any) -> None:
        # Let the begin hook issue BEGIN itself; the driver's implicit transactions cannot be
        # told to take the write lock up front.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            cursor.execute("PRAGMA foreign_keys = ON")
            try:
                cursor.execute("PRAGMA journal_mode = WAL")
                # In WAL mode NORMAL keeps every commit across a process crash (what resumption
                # needs) and only an OS crash can lose the last ones; FULL fsyncs every commit
                # and makes each state change cost milliseconds.
                cursor.execute("PRAGMA synchronous = NORMAL")
            except sqlite3.OperationalError as err:
                # A read-only database can still be read in the journal mode it already has.
                LOG.debug("SQLite: could not switch to WAL: %s", err)
        finally:
            cursor.close()

    return on_connect


def _on_postgresql_connect(lock_timeout: float, statement_timeout: float) -> Any:
    settings = (f"{int(lock_timeout * 1000)}ms", f"{int(statement_timeout * 1000)}ms")

    def on_connect(dbapi_conn: Any, record: Any) -> None:
        # Session settings, not startup options: they survive poolers that refuse those, and
        # leave any ``options`` of the URL alone. Committed, so no rollback undoes them.
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute("SELECT set_config('lock_timeout', %s, false),"
                           " set_config('statement_timeout', %s, false)", settings)
        finally:
            cursor.close()
        dbapi_conn.commit()

    return on_connect


def _on_mysql_connect(lock_timeout: float, statement_timeout: float) -> Any:
    # innodb_lock_wait_timeout counts whole seconds from 1 (0 would mean "fail at once", where
    # PostgreSQL's 0 means "wait forever": the longest wait the server allows stands in for it).
    lock_wait = max(1, round(lock_timeout)) if lock_timeout else 1073741824

    def on_connect(dbapi_conn: Any, record: Any) -> None:
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = %s", (lock_wait,))
            cursor.execute("SELECT VERSION()")
            if "mariadb" in str(cursor.fetchone()[0]).lower():
                cursor.execute("SET SESSION max_statement_time = %s", (statement_timeout,))
        finally:
            cursor.close()

    return on_connect


def _on_sqlite_begin(conn: sa.Connection) -> None:
    write = conn.get_execution_options().get(WRITE_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _forget_pool_in_child(ref: weakref.ref[sa.Engine]) -> Callable[[], None]:
    # A weak reference: fork hooks cannot be unregistered, and a strong one would keep every
    # engine ever created (one per backend built from a URI) alive for the process's lifetime.
    def forget() -> None:
        engine = ref()
        if engine is not None:
            engine.dispose(close=False)

    return forget


def create_engine(options: SQLOptions) -> sa.Engine:
    """Create the engine ``options`` describe, with SQLite's sharing hooks or PostgreSQL's timeouts.

    Raises:
        ImportError: If the database's driver is not installed (naming the extra to install).
    """
    url = options.url
    args: dict[str, Any] = {"echo": options.echo, "pool_recycle": options.idle_timeout}
    backend = url.get_backend_name()
    if backend == "sqlite":
        if (url.database or "") in _MEMORY_SQLITE:
            # One shared connection, or each connection would see its own empty database.
            args["poolclass"] = sa_pool.StaticPool
            args["connect_args"] = {"check_same_thread": False}
        else:
            # Pooled: opening a connection (and running the PRAGMAs) per save costs more than
            # the save. A forked child drops the parent's connections (see below).
            args["poolclass"] = sa_pool.QueuePool
            # Every transaction ends in COMMIT or ROLLBACK already; skip the extra reset.
            args["pool_reset_on_return"] = None
            args["connect_args"] = {"check_same_thread": False}
    else:
        args["pool_pre_ping"] = True
        for key, name in (
            ("pool_size", "max_pool_size"),
            ("max_overflow", "max_overflow"),
            ("pool_timeout", "pool_timeout"),
        ):
            if getattr(options, name) is not None:
                args[key] = getattr(options, name)
        if backend in ("postgresql", "mysql", "mariadb"):
            args["connect_args"] = {"connect_timeout": options.connect_timeout}
    isolation = options.isolation_level or _DEFAULT_ISOLATION.get(backend)
    if isolation:
        args["isolation_level"] = isolation
    args.update(options.engine_args)
    try:
        engine = sa.create_engine(url, **args)
        # Connections must not cross fork(): the child starts with an empty pool.
        os.register_at_fork(after_in_child=_forget_pool_in_child(weakref.ref(engine)))
    except (ImportError, sa_exc.NoSuchModuleError) as err:
        extra = _EXTRAS.get(backend)
        hint = f"pip install 'flowengine[{extra}]'" if extra else "install its DB-API driver"
        raise ImportError(
            f"{describe(url)}: the database driver is not installed ({err}); {hint}"
        ) from err
    if backend == "sqlite":
        event.listen(engine, "connect", _on_sqlite_connect(options.busy_timeout))
        event.listen(engine, "begin", _on_sqlite_begin)
    elif backend == "postgresql":
        # Without these a row lock another transaction keeps (or a statement that never ends)
        # blocks an engine forever; with them the engine gets an error naming the record.
        event.listen(engine, "connect",
                     _on_postgresql_connect(options.lock_timeout, options.statement_timeout))
    elif backend in ("mysql", "mariadb"):
        event.listen(engine, "connect",
                     _on_mysql_connect(options.lock_timeout, options.statement_timeout))
    return engine
