"""The ``flowengine`` command.

Each subcommand's module is imported only when that subcommand runs (or shows its own help):
``flowengine --help`` and a light command never pay for what the others import (the engine's
graph library and schemas, kombu, the Redis client, OpenTelemetry). The command list and the
one-line summaries ``--help`` shows are kept here for that; a test checks they match the
commands' own.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any, NamedTuple

import click

from flowengine import __version__


class Entry(NamedTuple):
    """Where a subcommand lives, and the first paragraph of its help."""

    module: str
    attr: str
    summary: str


#: Subcommands in the order ``--help`` lists them (alphabetical, as click's own).
COMMANDS: dict[str, Entry] = {
    "cancel": Entry("flowengine.cli.cancel", "cancel_command",
                    "Cancel FLOW_ID (its uuid, or the start of it): its running tasks are asked "
                    "to stop, what has not started never runs, and what completed is reverted "
                    "in reverse order."),
    "chaos": Entry("flowengine.cli.chaos", "chaos_command",
                   "Certify the flow MODULE:FACTORY names under chaos."),
    "check": Entry("flowengine.cli.graph", "check_command",
                   "Compile and validate the flow MODULE:FACTORY names, without running it; or, "
                   "with --backend and no MODULE:FACTORY, check that the current code can "
                   "resume every unfinished flow stored there; or (--orphans) report the flows "
                   "a jobboard lost."),
    "conductor": Entry("flowengine.cli.conductor", "conductor_command",
                       "Claim jobs from the board and run them until SIGTERM or SIGINT."),
    "conductors": Entry("flowengine.cli.jobs", "conductors_command",
                        "List the conductors alive on the board."),
    "dashboard": Entry("flowengine.cli.dashboard", "dashboard_command",
                       "Serve a web dashboard of the stored flows, the live workers and the "
                       "dead letters."),
    "db": Entry("flowengine.cli.db", "db_group",
                "A persistence store's layout, and moving a TaskFlow store to flowengine."),
    "dead-letters": Entry("flowengine.cli.dead_letters", "dead_letters_group",
                          "Requests parked after their last attempt was lost."),
    "events": Entry("flowengine.cli.events", "events_command",
                    "Print the events engines and workers publish, as they happen."),
    "flows": Entry("flowengine.cli.flows", "flows_command",
                   "List stored flows: state, atom counts by state, last update."),
    "graph": Entry("flowengine.cli.graph", "graph_command",
                   "Print the compiled graph of the flow MODULE:FACTORY names."),
    "jobs": Entry("flowengine.cli.jobs", "jobs_group",
                  "List, post, inspect, trash and re-post jobs on a jobboard."),
    "locks": Entry("flowengine.cli.locks", "locks_command",
                   "List the locks and concurrency limits on the board's service: for each, who "
                   "holds it and who waits for it, in the order they will get it."),
    "rehearse": Entry("flowengine.cli.rehearse", "rehearse_command",
                      "Rehearse the reverts of the flow MODULE:FACTORY names."),
    "repair": Entry("flowengine.cli.repair", "repair_command",
                    "Repair FLOW_ID (its uuid, or the start of it) and run it to its end here."),
    "run": Entry("flowengine.cli.run", "run_command",
                 "Run the flow MODULE:FACTORY names (a flow factory, or a flow object)."),
    "show": Entry("flowengine.cli.flows", "show_command",
                  "Show one stored flow (FLOW_ID: its uuid, or the start of it) and its atoms."),
    "suspend": Entry("flowengine.cli.suspend", "suspend_command",
                     "Ask the engine running FLOW_ID to suspend it: its running atoms finish, "
                     "nothing new starts, and the flow ends SUSPENDED (resume it with "
                     "``flowengine run --resume``)."),
    "topics": Entry("flowengine.cli.topics", "topics_command",
                    "Worker topics: list what waits on them, pause and resume their workers."),
    "worker": Entry("flowengine.cli.worker", "worker_command",
                    "Serve remote task requests until SIGTERM or SIGINT."),
    "workers": Entry("flowengine.cli.workers", "workers_command",
                     "List the live workers: id, topics, tasks, capacity, free slots, "
                     "in-flight requests."),
}


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's subcommands by name, each imported from :data:`COMMANDS` on first use."""

    def __init__(self) -> None:
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            entry = COMMANDS[name]  # KeyError: no such command
            self._loaded[name] = getattr(importlib.import_module(entry.module), entry.attr)
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*COMMANDS, *self._loaded]))

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self._loaded))


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use (see :class:`LazyCommands`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands()

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # As click's own, from the summaries kept here rather than the imported commands.
        limit = formatter.width - 6 - max(len(name) for name in self.list_commands(ctx))
        rows = [(name, click.Command(name, help=COMMANDS[name].summary).get_short_help_str(limit))
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="flowengine")
def cli() -> None:
    """Run and operate flowengine flows and workers."""


def one_line(err: BaseException) -> str | None:
    """What to print instead of a traceback for ``err``: a broker URL naming no transport, a
    flowengine-fs data folder that processes of another PID namespace use, or an optional
    dependency that is not installed (its message names the extra). None for anything else,
    which keeps its traceback."""
    connection = sys.modules.get("flowengine.worker_based.broker.connection")
    if connection is not None and isinstance(err, connection.BrokerURLError):
        return str(err)
    namespaces = sys.modules.get("flowengine.worker_based.broker.transport_fs_namespace")
    if namespaces is not None and isinstance(err, namespaces.ForeignNamespace):
        return str(err)
    if isinstance(err, ImportError) and "pip install 'flowengine[" in str(err):
        return str(err)
    return None


def main() -> None:
    """Console-script entry point."""
    # Every option names its environment variable itself; click's derived names (from the
    # command and parameter: FLOWENGINE_EVENTS_AS_JSON) would be second, undocumented ones.
    try:
        cli()
    except Exception as err:
        message = one_line(err)
        if message is None:
            raise
        click.echo(f"error: {message}", err=True)
        raise SystemExit(1) from err


if __name__ == "__main__":
    main()
