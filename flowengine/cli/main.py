"""The ``flowengine`` command."""

from __future__ import annotations

import click

from flowengine import __version__
from flowengine.cli.conductor import conductor_command
from flowengine.cli.dashboard import dashboard_command
from flowengine.cli.db import db_group
from flowengine.cli.dead_letters import dead_letters_group
from flowengine.cli.events import events_command
from flowengine.cli.flows import flows_command, show_command
from flowengine.cli.graph import check_command, graph_command
from flowengine.cli.jobs import conductors_command, jobs_group
from flowengine.cli.locks import locks_command
from flowengine.cli.run import run_command
from flowengine.cli.suspend import suspend_command
from flowengine.cli.topics import topics_command
from flowengine.cli.worker import worker_command
from flowengine.cli.workers import workers_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="flowengine")
def cli() -> None:
    """Run and operate flowengine flows and workers."""


cli.add_command(worker_command)
cli.add_command(dead_letters_group)
cli.add_command(events_command)
cli.add_command(workers_command)
cli.add_command(topics_command)
cli.add_command(run_command)
cli.add_command(flows_command)
cli.add_command(show_command)
cli.add_command(suspend_command)
cli.add_command(graph_command)
cli.add_command(check_command)
cli.add_command(dashboard_command)
cli.add_command(conductor_command)
cli.add_command(jobs_group)
cli.add_command(conductors_command)
cli.add_command(locks_command)
cli.add_command(db_group)


def main() -> None:
    """Console-script entry point."""
    # Every option names its environment variable itself; click's derived names (from the
    # command and parameter: FLOWENGINE_EVENTS_AS_JSON) would be second, undocumented ones.
    cli()


if __name__ == "__main__":
    main()
