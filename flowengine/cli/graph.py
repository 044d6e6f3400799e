"""``flowengine graph`` and ``flowengine check``: a flow's compiled graph, and whether it can run.

Neither runs an atom: ``graph`` compiles the flow and draws it; ``check`` also validates that
every atom's inputs are provided (by other atoms or by ``--store``), as ``engine.run`` would
before starting.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import click

from flowengine import engines
from flowengine import exceptions as exc
from flowengine.cli import exits, formatting, graph_view, loading, stored_flows
from flowengine.cli import orphans as orphan_cli
from flowengine.cli.board_options import board_options
from flowengine.cli.flow_options import backend_option
from flowengine.cli.options import json_option, parse_pairs, show_envvars
from flowengine.engines.compiler import FLOW, RETRY, TASK


def _load_flow(spec: str, factory_args: tuple[str, ...], factory_kwargs: tuple[str, ...]) -> Any:
    target = loading.import_target(spec)
    return loading.build_flow(spec, target, loading.parse_args(factory_args),
                              parse_pairs(factory_kwargs, "factory keyword argument"))


@show_envvars
@click.command("graph")
@click.argument("spec", metavar=loading.SPEC_METAVAR)
@click.option("--format", "fmt", envvar="FLOWENGINE_FORMAT", default="dot",
              show_default=True, type=click.Choice(sorted(graph_view.RENDERERS)),
              help="dot (Graphviz), mermaid, or json.")
@loading.factory_options
def graph_command(spec: str, fmt: str, factory_args: tuple[str, ...],
                  factory_kwargs: tuple[str, ...]) -> None:
    """Print the compiled graph of the flow MODULE:FACTORY names.

    Atoms are nodes (retry controllers drawn apart from tasks); an edge means its target waits
    for its source; nested flows are clusters; edges guarded by a link decider are marked.
    """
    flow = _load_flow(spec, factory_args, factory_kwargs)
    engine = engines.load(flow)
    try:
        engine.compile()
    except (exc.TaskFlowException, TypeError) as err:
        raise loading.LoadError(f"flow {getattr(flow, 'name', spec)!r} does not compile: "
                                f"{type(err).__name__}: {err}") from err
    click.echo(graph_view.RENDERERS[fmt](graph_view.build(engine.compilation)))


@show_envvars
@click.command("check")
@click.argument("spec", metavar=f"[{loading.SPEC_METAVAR}]", required=False)
@loading.store_option
@loading.factory_options
@click.option("--orphans", is_flag=True, envvar="FLOWENGINE_ORPHANS",
              help="Check the stored flows instead: report those orphaned on --board (stored "
                   "unfinished, their job lost, held by no conductor). Needs --board and "
                   "--backend.")
@board_options(required=False)
@backend_option(required=False)
@json_option("With --orphans: print each orphaned flow as a line of JSON.")
@click.pass_context
def check_command(ctx: click.Context, spec: str | None, store: tuple[str, ...],
                  factory_args: tuple[str, ...], factory_kwargs: tuple[str, ...],
                  orphans: bool, board_uri: str | None, board_options: tuple[str, ...],
                  backend_uri: str | None, as_json: bool) -> None:
    """Compile and validate the flow MODULE:FACTORY names, without running it; or, with
    --backend and no MODULE:FACTORY, check that the current code can resume every unfinished
    flow stored there; or (--orphans) report the flows a jobboard lost.

    Prints OK with counts (exit 0), or the error naming the atoms at fault (exit 1):
    MissingDependencies for inputs nothing provides (give them with --store), Duplicate
    names, cycles. With --backend: one line per unfinished flow, OK or why it cannot be
    resumed (its factory does not import, or now yields another shape and no migration is
    registered: the atoms added, removed and changed); exit 1 if any cannot. With --orphans:
    OK (exit 0), or the orphaned flows (exit 1); re-post their jobs with `flowengine jobs
    repost-orphans`.
    """
    if orphans:
        if board_uri is None or backend_uri is None:
            raise click.UsageError("--orphans needs --board and --backend: the board the jobs "
                                   "were posted to, and where their flows are stored")
        code = orphan_cli.report(board_uri, board_options, backend_uri, as_json)
        if spec is None or code:
            ctx.exit(code)
    elif spec is None:
        if backend_uri is None:
            raise click.UsageError("give MODULE:FACTORY, --backend to check stored flows, or "
                                   "--orphans")
        ctx.exit(stored_flows.check_stored(backend_uri))
    flow = _load_flow(spec, factory_args, factory_kwargs)
    given = parse_pairs(store, "store value")
    engine = engines.load(flow, store=given)
    try:
        engine.compile()
        engine.validate()
    except exc.MissingDependencies as err:
        for line in formatting.missing_inputs(getattr(flow, "name", spec), err):
            click.echo(line, err=True)
        ctx.exit(exits.ERROR)
    except (exc.TaskFlowException, TypeError, ValueError, NotImplementedError) as err:
        message = err.pformat() if isinstance(err, exc.TaskFlowException) else str(err)
        click.echo(f"error: flow {getattr(flow, 'name', spec)!r}: {type(err).__name__}: "
                   f"{message}", err=True)
        ctx.exit(exits.ERROR)
    compilation = engine.compilation
    kinds = Counter(compilation.kind(node) for node in compilation.execution_graph)
    links = len(graph_view.build(compilation).edges)
    click.echo(f"OK: flow {flow.name!r}: {_count(kinds[TASK] + kinds[RETRY], 'atom')} "
               f"({_count(kinds[TASK], 'task')}, {_count(kinds[RETRY], 'retry', 'retries')}) "
               f"in {_count(kinds[FLOW], 'flow')}, {_count(links, 'link')}")
    needed = sorted(getattr(flow, "requires", ()))
    if needed:
        click.echo(f"inputs it needs from outside (--store): {', '.join(needed)}")


def _count(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n} {singular if n == 1 else plural or singular + 's'}"
