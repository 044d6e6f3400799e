"""Shared pytest fixtures; each block below belongs to one area and stands alone."""

from __future__ import annotations

import contextlib
import os
import pathlib
import uuid
from collections.abc import Iterator

import pytest
from servers import SERVERS, LocalServers  # tests/ is on sys.path (rootdir conftest)

# ---- local test servers (every fixture that needs RabbitMQ, Redis or PostgreSQL) -----------------
# See tests/servers.py: a missing server is started once, then fails (CI=true) or skips the test.


@pytest.fixture(scope="session")
def local_servers() -> LocalServers:
    """The one :class:`LocalServers` of this test session."""
    return SERVERS


# ---- postgres fixtures (persistence) -------------------------------------------------------------
# A real PostgreSQL server at 127.0.0.1:5432, user postgres, trust auth, database `flowengine`.
# Each test gets its own PostgreSQL schema (namespace), so tests never see each other's tables.

POSTGRES_URL = os.environ.get(
    "FLOWENGINE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/flowengine"
)


def _postgres_problem() -> str | None:
    try:
        import sqlalchemy as sa

        engine = sa.create_engine(
            POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://", 1),
            connect_args={"connect_timeout": 3},
        )
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as err:  # any driver or network error means "not available"
        return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
    return None


@pytest.fixture(scope="session")
def postgres_url(local_servers: LocalServers) -> str:
    """The test server's URL, after checking it answers."""
    local_servers.require("PostgreSQL test server", _postgres_problem)
    return POSTGRES_URL


@contextlib.contextmanager
def _fresh_schema(postgres_url: str) -> Iterator[str]:
    import sqlalchemy as sa

    schema = f"test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{postgres_url}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """A URL whose connections use a fresh, empty schema, dropped after the test."""
    with _fresh_schema(postgres_url) as url:
        yield url


@pytest.fixture
def another_postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """A second fresh schema, for tests that need two stores in one database."""
    with _fresh_schema(postgres_url) as url:
        yield url


# ---- end of postgres fixtures --------------------------------------------------------------------


# ---- Redis, coordination services and beanstalkd (jobboards, the beanstalk transport) ------------
# Real servers on 127.0.0.1 as `.ci/services.sh start` runs them. Each fixture checks that its
# server answers a protocol-level probe (not just an open port) and fails (CI=true) or skips
# otherwise.

REDIS_URL = os.environ.get("FLOWENGINE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ZOOKEEPER_HOSTS = os.environ.get("FLOWENGINE_TEST_ZOOKEEPER", "127.0.0.1:2181")
ETCD_HOST, ETCD_PORT = "127.0.0.1", int(os.environ.get("FLOWENGINE_TEST_ETCD_PORT", "2379"))
BEANSTALK_HOST = "127.0.0.1"
BEANSTALK_PORT = int(os.environ.get("FLOWENGINE_TEST_BEANSTALK_PORT", "11300"))


def _ask(host: str, port: int, request: bytes) -> bytes:
    import socket

    with socket.create_connection((host, port), timeout=3) as sock:
        sock.sendall(request)
        return sock.recv(4096)


def _redis_problem() -> str | None:
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as err:  # any client or network error means "not available"
        return f"{type(err).__name__}: {err}"
    return None


def _zookeeper_problem() -> str | None:
    host, _, port = ZOOKEEPER_HOSTS.split(",")[0].partition(":")
    try:
        answer = _ask(host, int(port or 2181), b"ruok")
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    return None if answer.startswith(b"imok") else f"answered {answer[:40]!r} to ruok"


def _etcd_problem() -> str | None:
    try:
        answer = _ask(ETCD_HOST, ETCD_PORT, b"GET /version HTTP/1.0\r\n\r\n")
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    return None if b"etcdserver" in answer else f"answered {answer[:60]!r} to GET /version"


def _beanstalk_problem() -> str | None:
    try:
        answer = _ask(BEANSTALK_HOST, BEANSTALK_PORT, b"stats\r\n")
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    return None if answer.startswith(b"OK ") else f"answered {answer[:40]!r} to stats"


@pytest.fixture(scope="session")
def redis_url(local_servers: LocalServers) -> str:
    """The shared test Redis's URL (jobboards, the dashboard's jobs page), after checking it
    answers PING."""
    local_servers.require(f"Redis test server at {REDIS_URL}", _redis_problem)
    return REDIS_URL


@pytest.fixture(scope="session")
def zookeeper_hosts(local_servers: LocalServers) -> str:
    """The test ZooKeeper's ``host:port`` list, after checking it answers ``ruok``."""
    local_servers.require(f"ZooKeeper test server at {ZOOKEEPER_HOSTS}", _zookeeper_problem)
    return ZOOKEEPER_HOSTS


@pytest.fixture(scope="session")
def etcd_endpoint(local_servers: LocalServers) -> tuple[str, int]:
    """The test etcd's (host, port), after checking its /version answers."""
    local_servers.require(f"etcd test server at {ETCD_HOST}:{ETCD_PORT}", _etcd_problem)
    return ETCD_HOST, ETCD_PORT


@pytest.fixture(scope="session")
def beanstalk_url(local_servers: LocalServers) -> str:
    """The test beanstalkd's ``beanstalk://`` URL, after checking it answers ``stats``."""
    local_servers.require(f"beanstalkd test server at {BEANSTALK_HOST}:{BEANSTALK_PORT}",
                          _beanstalk_problem)
    return f"beanstalk://{BEANSTALK_HOST}:{BEANSTALK_PORT}"


# ---- fresh virtual environments (the install tests, getting-started) -----------------------------
# See tests/fresh_venv.py: one wheelhouse per session, then a venv in a second or two.


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The folder of wheels fresh venvs install flowengine and its extras from."""
    import fresh_venv

    return fresh_venv.build_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


# ---- the cluster suite's servers (`.ci/cluster.sh`, `make test-cluster`) -------------------------
# Clustered RabbitMQ, Redis behind Sentinels, ZooKeeper and etcd ensembles, and MariaDB, apart
# from the shared servers above (see tests/cluster_servers.py). Tests that use them are marked
# `cluster`; the MariaDB fixture gives each test a database of its own, dropped after it.


@pytest.fixture(scope="session")
def cluster() -> None:
    """Every member of the cluster suite's servers answers (started if needed; the last test
    process that uses them stops them at the end of its session: see the hook below)."""
    import cluster_servers

    cluster_servers.use()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the cluster suite's servers if tests started them and this process was their last
    user. A hook, not the fixture's teardown: that one never runs when the fixture's setup failed
    (a start that went wrong half way), and trylast puts it after the session's teardown. On
    the pytest-xdist controller it stops what a worker that died without leaving started."""
    import cluster_servers

    cluster_servers.release()


@pytest.fixture
def mariadb_database_url(cluster: None) -> Iterator[str]:
    """A ``mysql://`` URL of a fresh, empty MariaDB database, dropped after the test."""
    import cluster_servers
    import sqlalchemy as sa

    name = f"test_{uuid.uuid4().hex[:12]}"
    # No pool: a test may restart the server between the two statements.
    admin = sa.create_engine(cluster_servers.MARIADB_URL.replace("mysql://", "mysql+pymysql://"),
                             poolclass=sa.pool.NullPool)
    with admin.begin() as conn:
        conn.execute(sa.text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    try:
        yield f"{cluster_servers.MARIADB_URL}/{name}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()
