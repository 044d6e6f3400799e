"""Fixtures for unit tests: a real worker over an in-process transport, and a store of each
backend kind."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from timed_stores import BACKENDS, TimedStore, open_store
from wb_requester import Requester  # tests/unit is on sys.path (pytest rootdir insertion)


@pytest.fixture(params=["memory", "fs"])
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """Proxy keyword arguments for kombu's memory transport, then flowengine's filesystem one."""
    if request.param == "memory":
        return {"transport": "memory"}
    return {"transport_options": {"data_folder": str(tmp_path / "fs")}}


@pytest.fixture
def exchange() -> str:
    # The memory transport's broker state is process-wide: every test gets its own exchange.
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def requester(exchange: str, transport: dict[str, Any]) -> Iterator[Requester]:
    """The engine's side of the wire, consuming replies on its own queue."""
    requester = Requester(exchange, transport)
    yield requester
    requester.close()


@pytest.fixture(params=BACKENDS)
def timed_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TimedStore]:
    """A fresh store of each backend kind: memory, dir, SQLite and PostgreSQL."""
    store = open_store(request.param, request, tmp_path)
    try:
        yield store
    finally:
        store.backend.close()
