"""The ``flowengine`` command."""

from __future__ import annotations

import click

from flowengine import __version__
from flowengine.cli.dead_letters import dead_letters_group
from flowengine.cli.worker import worker_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="flowengine")
def cli() -> None:
    """Run and operate flowengine flows and workers."""


cli.add_command(worker_command)
cli.add_command(dead_letters_group)


def main() -> None:
    """Console-script entry point."""
    cli(auto_envvar_prefix="FLOWENGINE")


if __name__ == "__main__":
    main()
