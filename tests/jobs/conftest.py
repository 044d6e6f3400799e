"""Fixtures of the jobboard and conductor suites: one ``board`` per real backend.

``board_factory`` makes connected boards sharing one fresh namespace (so several boards, or
conductors, see the same jobs); everything they made is closed and wiped when the test ends.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import boards
import pytest

from flowengine.jobs.base import JobBoard

BACKENDS = ("redis", "zookeeper", "etcd")
#: The fixture that gives each backend's server.
SERVER_FIXTURES = {"redis": "redis_url", "zookeeper": "zookeeper_hosts", "etcd": "etcd_endpoint"}


@pytest.fixture(params=BACKENDS)
def board_backend(request: pytest.FixtureRequest) -> str:
    """Each jobboard backend in turn."""
    return str(request.param)


BoardFactory = boards.BoardFactory


@pytest.fixture
def board_server(request: pytest.FixtureRequest, board_backend: str) -> Any:
    """What the backend's factory takes as ``server``."""
    return request.getfixturevalue(SERVER_FIXTURES[board_backend])


@pytest.fixture
def board_namespace() -> str:
    """A namespace no other test uses."""
    return f"fe-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def board_factory(board_backend: str, board_server: Any,
                  board_namespace: str) -> Iterator[BoardFactory]:
    """Makes connected boards of the backend, all on one namespace; closes and wipes them."""
    maker = getattr(boards, f"make_{board_backend}_board")
    made: list[JobBoard] = []

    def make(**options: Any) -> JobBoard:
        board = maker(board_server, board_namespace, **options)
        made.append(board)
        board.connect()
        return board

    yield make
    for board in made:
        board.close()
    getattr(boards, f"wipe_{board_backend}")(board_server, board_namespace)


@pytest.fixture
def board(board_factory: BoardFactory) -> JobBoard:
    """A connected board with short claims (2 s), so expiry tests stay quick."""
    return board_factory(claim_ttl=2.0)
