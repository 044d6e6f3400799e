"""Shared pytest fixtures; each block below belongs to one area and stands alone."""

from __future__ import annotations

import os
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


@pytest.fixture
def postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """A URL whose connections use a fresh, empty schema, dropped after the test."""
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


# ---- end of postgres fixtures --------------------------------------------------------------------
