"""Shared pytest fixtures; each block below belongs to one area and stands alone."""

from __future__ import annotations

# ---- postgres fixtures (persistence) -------------------------------------------------------------
# A real PostgreSQL server at 127.0.0.1:5432 (started by `.ci/services.sh start`), user postgres,
# trust auth, database `flowengine`. Each test gets its own PostgreSQL schema (namespace), so tests
# never see each other's tables. Unreachable server: the test fails when CI=true, else it skips.
import os
import uuid
from collections.abc import Iterator

import pytest

POSTGRES_URL = os.environ.get(
    "FLOWENGINE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/flowengine"
)


def _postgres_unavailable(reason: str) -> None:
    message = f"PostgreSQL test server unavailable ({reason}); run `.ci/services.sh start`"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The test server's URL, after checking it answers."""
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
        _postgres_unavailable(f"{type(err).__name__}: {str(err).splitlines()[0]}")
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
