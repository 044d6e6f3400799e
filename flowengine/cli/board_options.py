"""The --board options shared by the conductor and jobs commands, and opening the board."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from flowengine.cli.options import parse_pairs, split_from_env
from flowengine.persistence.backends._uri import mask_urls

if TYPE_CHECKING:  # imported when a board is opened: most commands never open one
    from flowengine.jobs.base import JobBoard
    from flowengine.persistence.base import Backend


def board_options(command: Callable[..., Any] | None = None, *, required: bool = True) -> Any:
    """Add --board (a jobboard URI) and --board-option (key=value, repeatable); as
    ``@board_options`` or ``@board_options(required=False)``."""
    if command is None:
        return lambda decorated: board_options(decorated, required=required)
    decorators = [
        click.option("--board", "board_uri", envvar="FLOWENGINE_BOARD", required=required,
                     help="Jobboard URI: redis://host:6379/0?namespace=app, "
                          "zookeeper://host:2181/path, etcd://host:2379/path."),
        click.option("--board-option", "board_options", envvar="FLOWENGINE_BOARD_OPTION",
                     multiple=True, callback=split_from_env,
                     help="Jobboard conf key=value (claim_ttl, max_attempts, namespace...). "
                          "Repeatable."),
    ]
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


def board_conf(board_uri: str, board_options: tuple[str, ...]) -> dict[str, Any]:
    """The conf dict of the options."""
    return {**parse_pairs(board_options, "board option"), "board": board_uri}


@contextlib.contextmanager
def open_board(board_uri: str, board_options: tuple[str, ...],
               persistence: Backend | None = None,
               name: str = "flowengine-cli") -> Iterator[JobBoard]:
    """The connected board the options name; closed on leaving.

    Raises:
        click.BadParameter: The URI or an option is not understood.
        click.ClickException: The board cannot be reached.
    """
    from flowengine import exceptions as exc
    from flowengine.jobs import backends

    try:
        board = backends.fetch(name, board_conf(board_uri, board_options),
                               persistence=persistence)
    except (exc.NotFound, ValueError, TypeError) as err:
        raise click.BadParameter(str(err), param_hint="--board") from err
    try:
        board.connect()
    except exc.TaskFlowException as err:
        raise click.ClickException(f"cannot connect to {mask_urls(board_uri)}: {err}") from err
    with contextlib.closing(board):
        yield board
