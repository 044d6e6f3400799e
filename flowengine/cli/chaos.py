"""``flowengine chaos``: run a flow on real workers while killing, freezing and restarting them
and the engine, then certify what happened.

Exit codes: 0 certified, 8 not certified (:mod:`flowengine.cli.exits`), 1 the flow cannot be
built or a process cannot start, 2 usage errors. See :mod:`flowengine.testing.chaos`.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any

import click

from flowengine.cli import exits, loading
from flowengine.cli.board_options import board_options
from flowengine.cli.broker import broker_kwargs, broker_options
from flowengine.cli.options import json_option, parse_pairs, show_envvars
from flowengine.cli.rehearse import own_exchange

#: Seconds a conductor's claim lasts unless told otherwise (TaskFlow's 30 would make every
#: conductor fault a half-minute stall).
DEFAULT_CLAIM_TTL = 5.0


@show_envvars
@click.command("chaos")
@click.argument("spec", metavar=loading.SPEC_METAVAR)
@click.option("--duration", envvar="FLOWENGINE_DURATION", type=click.FloatRange(min=1.0),
              required=True, help="Seconds of chaos (faults are applied this long).")
@click.option("--workers", envvar="FLOWENGINE_WORKERS", type=click.IntRange(min=1), default=3,
              show_default=True, help="Worker processes (slots the faults strike).")
@click.option("--seed", envvar="FLOWENGINE_SEED", type=int, default=None,
              help="The schedule's seed (default: a random one, printed): the same seed "
                   "replays the same faults at the same moments.")
@click.option("--concurrency", envvar="FLOWENGINE_CONCURRENCY", type=click.IntRange(min=1),
              default=8, show_default=True, help="Flows the engine runs at once.")
@click.option("--settle", envvar="FLOWENGINE_SETTLE", type=click.FloatRange(min=1.0),
              default=60.0, show_default=True,
              help="Seconds the flows get to end once the chaos is over (what still runs "
                   "then hung).")
@click.option("--lease-timeout", envvar="FLOWENGINE_LEASE_TIMEOUT",
              type=click.FloatRange(min=0.5), default=5.0, show_default=True,
              help="The engine's lease on a running request (a freeze lasts past it).")
@click.option("--threads", envvar="FLOWENGINE_THREADS", type=click.IntRange(min=1), default=4,
              show_default=True, help="Task threads of each worker.")
@click.option("--backend", "backend_uri", envvar="FLOWENGINE_BACKEND", default=None,
              help="Where the flows are stored (default: SQLite in the work folder).")
@click.option("--workdir", envvar="FLOWENGINE_WORKDIR", default=None,
              type=click.Path(file_okay=False),
              help="Work folder for the store, the logs and each process's output (default: "
                   "a new temporary folder, kept).")
@board_options(required=False)
@click.option("--conductors", envvar="FLOWENGINE_CONDUCTORS", type=click.IntRange(min=1),
              default=3, show_default=True,
              help="Conductor processes (slots the faults strike), with --board.")
@click.option("--claim-ttl", envvar="FLOWENGINE_CLAIM_TTL", type=click.FloatRange(min=1.0),
              default=None,
              help="Seconds a conductor's claim lasts (a freeze lasts past it), with --board "
                   "[default: the board option claim_ttl, else 5].")
@click.option("--max-jobs", envvar="FLOWENGINE_MAX_JOBS", type=click.IntRange(min=1), default=4,
              show_default=True, help="Jobs each conductor runs at once, with --board.")
@broker_options
@loading.store_option
@loading.factory_options
@json_option("Print the certificate as JSON.")
@click.pass_context
def chaos_command(ctx: click.Context, spec: str, duration: float, workers: int,
                  seed: int | None, concurrency: int, settle: float, lease_timeout: float,
                  threads: int, backend_uri: str | None, workdir: str | None,
                  board_uri: str | None, board_options: tuple[str, ...], conductors: int,
                  claim_ttl: float | None, max_jobs: int,
                  store: tuple[str, ...], factory_args: tuple[str, ...],
                  factory_kwargs: tuple[str, ...], as_json: bool, **broker: Any) -> None:
    """Certify the flow MODULE:FACTORY names under chaos.

    \b
    Runs instances of it on worker processes on the broker given (default: the embedded
    filesystem transport) while killing (SIGKILL), freezing (SIGSTOP past the lease, then
    SIGCONT) and restarting workers and the engine process (which resumes its flows from the
    store), on a seeded schedule. Certifies that every flow ended SUCCESS or REVERTED, that no
    completed atom ran again and that every fault recovered; prints the worst and median
    recovery times and the seed that replays the schedule.
    --board posts the flows as jobs on that jobboard (under a location of the session's own)
    instead, run by --conductors conductor processes, which the schedule kills, freezes
    (SIGSTOP past the claim) and restarts as well as the workers; the certificate then also
    says that every job was consumed with its flow SUCCESS or REVERTED, none left on the board
    (claimed or not), trashed or lost.
    --taskflow-compat runs TaskFlow's own workers (taskflow 6) instead, with
    FLOWENGINE_TASK_LIBRARY=taskflow, and TaskFlow's topology.
    Exit codes: 0 certified, 8 not certified, 1 cannot build the flow or start a process,
    2 usage errors.
    """
    from flowengine.testing import processes
    from flowengine.testing.chaos import orchestra

    loading.build_flow(spec, loading.import_target(spec), loading.parse_args(factory_args),
                       parse_pairs(factory_kwargs, "factory keyword argument"))
    connection = broker_kwargs(**broker)
    connection["exchange"] = own_exchange(ctx, connection["exchange"], "chaos")
    taskflow = bool(connection["taskflow_compat"])
    if taskflow and not connection["url"]:
        raise click.UsageError("--taskflow-compat needs --url: TaskFlow's workers need a broker")
    board = None
    if board_uri is not None:
        if taskflow:
            raise click.UsageError("--board runs flowengine's conductors: it cannot be given "
                                   "with --taskflow-compat")
        options = parse_pairs(board_options, "board option")
        options["claim_ttl"] = float(claim_ttl if claim_ttl is not None
                                     else options.get("claim_ttl", DEFAULT_CLAIM_TTL))
        board = orchestra.Board(board_uri, options, conductors, max_jobs)
    elif board_options or claim_ttl is not None:
        raise click.UsageError("--board-option and --claim-ttl need --board")
    chosen = seed if seed is not None else random.SystemRandom().randrange(1, 10**6)
    folder = Path(workdir or tempfile.mkdtemp(prefix=f"flowengine-chaos-{chosen}-"))
    if connection["url"] is None and connection["transport"] is None:
        # The embedded transport, in the work folder: the session's processes alone share it.
        connection.update(transport="flowengine-fs",
                          transport_options={"data_folder": str(folder.resolve() / "fs")})
    settings = orchestra.Settings(
        spec=spec, args=loading.parse_args(factory_args),
        kwargs=parse_pairs(factory_kwargs, "factory keyword argument"),
        store=parse_pairs(store, "store value"), duration=duration, workers=workers,
        seed=chosen, broker=processes.BrokerOptions(**connection), workdir=folder,
        backend=backend_uri, concurrency=concurrency, settle=settle,
        lease_timeout=lease_timeout, threads=threads, taskflow=taskflow, board=board)
    try:
        certificate = orchestra.Session(settings, lambda line: click.echo(line, err=True)).run()
    except (RuntimeError, ValueError) as err:
        raise loading.LoadError(f"the chaos session could not run: {err}") from err
    if as_json:
        click.echo(json.dumps(certificate.to_json(), indent=2))
    else:
        click.echo(certificate.text())
    raise SystemExit(exits.OK if certificate.passed else exits.FINDINGS)
