"""``flowengine rehearse``: fail a flow at every point and judge how it undoes its work.

Exit codes: 0 no finding, 8 a finding (:mod:`flowengine.cli.exits`), 1 the flow cannot be
built or a run cannot be made, 2 usage errors. See :mod:`flowengine.testing.rehearsal`.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from flowengine.cli import exits, loading
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.options import json_option, parse_pairs, show_envvars

#: Engines a rehearsal runs on.
ENGINES = ("serial", "parallel", "worker-based")


def own_exchange(ctx: click.Context, exchange: str, prefix: str) -> str:
    """The exchange given, or one of the tool's own (``prefix-...``) when left at its default:
    the tool's requests must never reach the production workers of a shared broker."""
    if ctx.get_parameter_source("exchange") is ParameterSource.DEFAULT:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"
    return exchange


@show_envvars
@click.command("rehearse")
@click.argument("spec", metavar=loading.SPEC_METAVAR)
@click.option("--engine", "engine_name", envvar="FLOWENGINE_ENGINE", default="serial",
              show_default=True, type=click.Choice(ENGINES),
              help="The engine the flow runs on.")
@click.option("--workers", envvar="FLOWENGINE_WORKERS", type=click.IntRange(min=0), default=0,
              show_default=True,
              help="Worker processes for the worker-based engine, on the broker given (none: "
                   "the embedded filesystem transport); 0: workers in this process, on the "
                   "in-process memory transport.")
@click.option("--threads", envvar="FLOWENGINE_THREADS", type=click.IntRange(min=1), default=4,
              show_default=True, help="Task threads of each worker.")
@click.option("--timeout", envvar="FLOWENGINE_TIMEOUT", type=click.FloatRange(min=0.1),
              default=60.0, show_default=True, help="Real seconds one run may take.")
@broker_options
@loading.store_option
@loading.factory_options
@json_option("Print the report as JSON.")
@click.pass_context
def rehearse_command(ctx: click.Context, spec: str, engine_name: str, workers: int,
                     threads: int, timeout: float, store: tuple[str, ...],
                     factory_args: tuple[str, ...], factory_kwargs: tuple[str, ...],
                     as_json: bool, **broker: Any) -> None:
    """Rehearse the reverts of the flow MODULE:FACTORY names.

    \b
    Runs it once without a fault, then once per task with its execute failing, once per
    task with its revert failing, and once with every revert made twice; judges each run
    from the ledger of calls and side effects (see doc/proving.rst); prints a matrix,
    failure point by task, and a verdict.
    Exit codes: 0 no finding, 8 a finding, 1 cannot build or run the flow, 2 usage errors.
    """
    from flowengine.testing import processes, rehearsal

    if workers and engine_name != "worker-based":
        raise click.UsageError("--workers needs --engine worker-based")
    target = loading.import_target(spec)
    args = loading.parse_args(factory_args)
    kwargs = parse_pairs(factory_kwargs, "factory keyword argument")
    values = parse_pairs(store, "store value")
    loading.build_flow(spec, target, args, kwargs)  # a flow that cannot be built fails here

    def factory() -> Any:
        return loading.build_flow(spec, target, args, kwargs)

    connection = broker_kwargs(**broker)
    connection["exchange"] = own_exchange(ctx, connection["exchange"], "rehearse")
    with tempfile.TemporaryDirectory(prefix="flowengine-rehearse-") as folder:
        stage: rehearsal.Stage
        if workers:
            stage = rehearsal.ProcessStage(
                Path(folder), processes.BrokerOptions(**connection), workers, threads,
                timeout)
        else:
            stage = rehearsal.KitStage(engine_name, timeout)

        def progress(label: str) -> None:
            if not as_json:
                click.echo(f"rehearsing: {label}", err=True)

        try:
            report = rehearsal.rehearse(factory, values, stage, progress)
        except (RuntimeError, ValueError) as err:
            raise loading.LoadError(f"the rehearsal of {spec} could not run: {err}") from err
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, default=repr))
    else:
        click.echo(report.text())
    raise SystemExit(exits.OK if report.safe else exits.FINDINGS)
