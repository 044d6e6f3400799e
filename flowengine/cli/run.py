"""``flowengine run``: run a flow (or resume a stored one), watching each atom as it goes.

Exit codes are :mod:`flowengine.cli.exits`': 0 success, 3 reverted, 4 FAILURE, 5 suspended,
6 halted (its progress could not be recorded), 7 cancelled, 1 import/load errors, 2 usage
errors. :func:`run_stored` runs a stored flow the same way for ``cancel`` and ``repair``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import Any

import click
from rich.console import Console

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.cli import exits, loading, records, stored_run, telemetry
from flowengine.cli import formatting as fmt
from flowengine.cli.broker import broker_kwargs
from flowengine.cli.flow_options import backend_option, engine_options
from flowengine.cli.options import json_option, parse_pairs, show_envvars, split_env_list
from flowengine.cli.signals import suspend_on_signals
from flowengine.cli.watch import RunWatcher, open_view
from flowengine.engines import factory_policy, stopping
from flowengine.persistence import base, models
from flowengine.persistence.backends._uri import mask_urls
from flowengine.secrets import Secret
from flowengine.utils import persistence_utils as p_utils

#: The logbook ``run --backend`` saves new flows in unless ``--book`` names another.
DEFAULT_BOOK = "flowengine-cli"


@dataclasses.dataclass
class Request:
    """What to run: a new flow from ``spec``, or the stored flow ``resume_id``."""

    spec: str | None
    resume_id: str | None
    engine: str
    options: dict[str, Any]
    store: dict[str, Any]
    args: list[Any]
    kwargs: dict[str, Any]
    backend: base.Backend | None
    backend_uri: str | None
    book: str
    broker: dict[str, Any]
    events: bool | None
    metrics: bool
    topics: list[str] = dataclasses.field(default_factory=list)
    metrics_port: int | None = None
    #: Options given on the command line or in the environment (a resume keeps the others).
    explicit: frozenset[str] = frozenset()
    #: Seconds the flow may run before it is cancelled (``--deadline``).
    deadline: float | None = None
    #: ``(reason, by)``: cancel the flow as the run starts (``flowengine cancel``).
    cancel: tuple[str, str] | None = None
    #: ``(action, atom, reason, by)``: repair the flow as the run starts (``flowengine repair``).
    repair: tuple[str, str | None, str | None, str] | None = None

    def engine_options(self) -> dict[str, Any]:
        """The options ``engines.load`` gets for this request's engine."""
        options: dict[str, Any] = {} if self.deadline is None else {"deadline": self.deadline}
        if not telemetry.is_worker_based(self.engine):
            return options
        return {**self.broker, "topics": self.topics, **options,
                **telemetry.engine_options(self.events, self.metrics_port)}


@show_envvars
@click.command("run")
@click.argument("spec", metavar=f"[{loading.SPEC_METAVAR}]", required=False)
@engine_options
@backend_option(required=False)
@click.option("--book", envvar="FLOWENGINE_BOOK", default=DEFAULT_BOOK, show_default=True,
              help="Logbook new flows are saved in (with --backend).")
@click.option("--resume", "resume_id", metavar="FLOW_ID", envvar="FLOWENGINE_RESUME",
              help="Resume this stored flow (uuid or its start) instead of starting a new one.")
@loading.store_option
@loading.secret_option
@loading.factory_options
@loading.allow_factories_option("with --resume, a stored flow's factory may come from any "
                                "module outside those")
@telemetry.telemetry_options
@click.option("--deadline", type=click.FloatRange(min=0, min_open=True), default=None,
              envvar="FLOWENGINE_DEADLINE", metavar="SECONDS",
              help="Cancel the flow (undoing what it did) if it has not ended SECONDS after it "
                   "first started; stored, so a resumed flow keeps it.")
@click.option("--plain", is_flag=True, envvar="FLOWENGINE_PLAIN",
              help="One line per change instead of the live table (always so when stdout is "
                   "not a terminal).")
@json_option()
@click.pass_context
def run_command(ctx: click.Context, spec: str | None, engine_name: str, topics: tuple[str, ...],
                backend_uri: str | None, book: str, resume_id: str | None,
                store: tuple[str, ...], secret: tuple[str, ...], factory_args: tuple[str, ...],
                factory_kwargs: tuple[str, ...], allow_factories: str | None,
                events: bool | None, metrics_port: int | None, deadline: float | None,
                plain: bool, as_json: bool, **broker: Any) -> None:
    """Run the flow MODULE:FACTORY names (a flow factory, or a flow object).

    \b
    Exit codes: 0 SUCCESS, 3 REVERTED (the failure was undone), 4 FAILURE (a revert
    failed), 5 SUSPENDED (SIGINT/SIGTERM; resume with --resume), 6 halted (its progress
    could not be recorded: nothing was reverted; resume with --resume once the backend is
    back), 7 cancelled (flowengine cancel, the dashboard or --deadline; what it did was
    reverted), 1 cannot import, build or validate the flow, 2 usage errors.
    """
    if spec is None and resume_id is None:
        raise click.UsageError("give the flow to run as MODULE:FACTORY, or --resume FLOW_ID")
    if resume_id is not None and backend_uri is None:
        raise click.UsageError("--resume needs --backend: where the flow was saved")
    if metrics_port is not None:
        metrics_port = telemetry.serve_metrics(metrics_port)
    request = Request(
        spec=spec, resume_id=resume_id, engine=engine_name, options={},
        store={**parse_pairs(store, "store value"),
               **{k: Secret(v) for k, v in parse_pairs(secret, "secret value").items()}},
        args=loading.parse_args(factory_args),
        kwargs=parse_pairs(factory_kwargs, "factory keyword argument"),
        backend=None if backend_uri is None else records.open_backend(backend_uri, create=True),
        backend_uri=backend_uri, book=book, broker=broker_kwargs(**broker), events=events,
        metrics=metrics_port is not None, topics=split_env_list(tuple(topics)),
        metrics_port=metrics_port, explicit=stored_run.explicit_options(ctx), deadline=deadline)
    request.options = request.engine_options()
    policy = loading.factory_policy_of(allow_factories)
    try:
        with factory_policy.applying(policy):
            engine = _load(request)
        _validate(engine)
        code = _run(engine, request, plain=plain, as_json=as_json)
    finally:
        if request.backend is not None:
            request.backend.close()
    ctx.exit(code)


def run_stored(ctx: click.Context, flow_id: str, backend: base.Backend, backend_uri: str,
               engine_name: str, topics: tuple[str, ...], broker: dict[str, Any], *,
               cancel: tuple[str, str] | None = None,
               repair: tuple[str, str | None, str | None, str] | None = None,
               plain: bool = True, as_json: bool = False) -> int:
    """Run a stored flow here as ``run --resume`` does (its stored engine and broker unless
    the command gives others), cancelled or repaired as it starts; return the exit code.

    Raises:
        RepairRefused: the repair does not fit the flow (checked before anything runs).
    """
    request = Request(
        spec=None, resume_id=flow_id, engine=engine_name, options={}, store={}, args=[],
        kwargs={}, backend=backend, backend_uri=backend_uri, book=DEFAULT_BOOK,
        broker=broker, events=None, metrics=False, topics=split_env_list(tuple(topics)),
        explicit=stored_run.explicit_options(ctx), cancel=cancel, repair=repair)
    request.options = request.engine_options()
    engine = _load(request)
    if repair is not None:
        engine.repair(*repair)  # refused before the flow is validated (which may reset it)
    _validate(engine)
    return _run(engine, request, plain=plain, as_json=as_json)


def _load(request: Request) -> Any:
    """The engine, loaded with a new flow or the stored one; a new flow is saved (with how to
    rebuild it) only once it validates and the engine accepted it, so a flow that cannot run
    or a bad --engine leaves nothing behind."""
    flow_detail = None
    target = None
    if request.resume_id is not None:
        assert request.backend is not None and request.backend_uri is not None
        with contextlib.closing(request.backend.get_connection()) as conn:
            flow_detail = records.find_flow(conn, request.resume_id, request.backend_uri,
                                            param_hint="--resume")
        _reuse_stored_run(request, flow_detail)
    if request.spec is not None:
        target = loading.import_target(request.spec)
        flow = loading.build_flow(request.spec, target, request.args, request.kwargs)
    else:
        flow = _rebuild(flow_detail)
    is_new = flow_detail is None
    if is_new and request.backend is not None:
        # The real engine writes through to the backend as it compiles: check on a copy first.
        _validate(engines.load(flow, store=request.store))
    if flow_detail is None:
        flow_detail = p_utils.create_flow_detail(flow)
    try:
        engine = engines.load(flow, flow_detail=flow_detail, backend=request.backend,
                              engine=request.engine, **request.options)
    except exc.NotFound as err:
        raise click.BadParameter(str(err), param_hint="--engine") from err
    except (TypeError, ValueError) as err:
        raise loading.LoadError(f"cannot load flow {flow.name!r} into engine "
                                f"{request.engine!r}: {err}") from err
    if is_new and request.backend is not None:
        flow_detail.meta[stored_run.META_KEY] = stored_run.record(
            request.engine, request.broker, request.topics)
        _save_new(flow_detail, flow, target, request)
    if request.store:
        engine.storage.inject(request.store)
    return engine


def _reuse_stored_run(request: Request, flow_detail: models.FlowDetail) -> None:
    """Resume on the engine (and broker) the flow ran on, unless the command says otherwise."""
    stored = stored_run.stored(flow_detail)
    if stored is None:
        return
    engine, broker, topics = stored_run.merge(stored, request.engine, request.broker,
                                              request.topics, request.explicit)
    request.engine, request.broker, request.topics = engine, broker, topics
    request.options = request.engine_options()


def _rebuild(flow_detail: Any) -> Any:
    loading.ensure_cwd_on_path()
    try:
        return engines.flow_from_detail(flow_detail)
    except ValueError as err:
        raise loading.LoadError(f"{err}; give MODULE:FACTORY to rebuild it") from err
    except Exception as err:
        factory = flow_detail.meta.get("factory", {}).get("name")
        raise loading.LoadError(f"cannot rebuild flow {flow_detail.uuid} with its saved factory "
                                f"{factory!r}: {type(err).__name__}: {err}") from err


def _save_new(flow_detail: models.FlowDetail, flow: Any, target: Any, request: Request) -> None:
    """Save a new flow detail in its logbook, with what rebuilds its flow (for --resume)."""
    backend = request.backend
    assert backend is not None and request.spec is not None
    with contextlib.closing(backend.get_connection()) as conn:
        book = next((b for b in conn.get_logbooks(lazy=True) if b.name == request.book),
                    None) or models.LogBook(request.book)
        book.add(flow_detail)
        conn.save_logbook(book)
    if callable(target) and flow is not target:
        with contextlib.suppress(ValueError):  # a lambda or nested function: use the spec
            engines.save_factory_details(flow_detail, target, request.args, request.kwargs,
                                         backend=backend)
            return
    engines.save_factory_details(flow_detail, loading.flow_from_spec,
                                 [request.spec, request.args, request.kwargs], {},
                                 backend=backend)


def _validate(engine: Any) -> None:
    try:
        engine.compile()
        engine.validate()
    except exc.MissingDependencies as err:
        lines = fmt.missing_inputs(engine.storage.flow_name, err, engine.storage.flow_uuid)
        raise loading.LoadError("\n".join(lines).removeprefix("error: ")) from err
    except (exc.TaskFlowException, TypeError, ValueError, NotImplementedError) as err:
        message = err.pformat() if isinstance(err, exc.TaskFlowException) else str(err)
        raise loading.LoadError(f"flow {engine.storage.flow_name!r} cannot run: "
                                f"{type(err).__name__}: {message}") from err


@dataclasses.dataclass
class Outcome:
    """How a run ended."""

    state: str
    code: int
    elapsed: float
    reverted: list[str]
    revert_failed: list[str]
    error: BaseException | None


def _run(engine: Any, request: Request, *, plain: bool, as_json: bool) -> int:
    console = Console(highlight=False, soft_wrap=True)
    live = not (as_json or plain) and console.is_interactive
    storage = engine.storage
    watcher = RunWatcher(engine)
    title = f"flow {storage.flow_name} ({storage.flow_uuid}) on {request.engine}"
    view: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if not as_json:
        if not live:
            click.echo(title)
        view = open_view(watcher, console, title, click.echo, plain=not live)
    error: BaseException | None = None
    suspending = False
    started = time.monotonic()
    # With --json, stdout holds the JSON alone: what tasks print goes to stderr.
    quiet = contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()
    reporting: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if not telemetry.is_worker_based(request.engine):
        reporting = telemetry.reporting(engine, request.events, request.metrics, request.broker)
    if request.cancel is not None:
        engine.cancel(*request.cancel)
    with watcher, reporting, quiet, \
            suspend_on_signals(engine, lambda text: click.echo(text, err=True)) as stop, view:
        try:
            for _state in engine.run_iter():
                if stop.is_set() and not suspending:
                    suspending = True
                    engine.suspend()
        except KeyboardInterrupt:
            click.echo("interrupted while suspending", err=True)
            _echo_resume_hint(engine, request, err=True)
            return exits.INTERRUPTED
        except Exception as err:
            error = err
    state = storage.get_flow_state()
    code = exits.for_flow_state(state)
    if isinstance(error, exc.RunHalted):
        code = exits.HALTED
    elif isinstance(error, exc.FlowCancelled):
        code = exits.CANCELLED
    elif error is not None and state not in (states.REVERTED, states.FAILURE):
        code = exits.ERROR  # the engine failed before running any atom (broker, storage)
    outcome = Outcome(state, code, time.monotonic() - started, watcher.reverted,
                      watcher.revert_failed, error)
    if as_json:
        _echo_json(engine, request, outcome)
    else:
        _echo_summary(engine, request, outcome, watcher, table=not live)
    return code


def _failures(engine: Any) -> list[tuple[str, str, Any]]:
    storage = engine.storage
    return ([(name, "execute", f) for name, f in storage.get_execute_failures().items()]
            + [(name, "revert", f) for name, f in storage.get_revert_failures().items()])


def _echo_json(engine: Any, request: Request, outcome: Outcome) -> None:
    storage = engine.storage
    found = {
        "flow": storage.flow_name,
        "uuid": storage.flow_uuid,
        "engine": request.engine,
        "state": outcome.state,
        "halted": isinstance(outcome.error, exc.RunHalted),
        "cancelled": storage.flow_meta.get(stopping.META_CANCELLED),
        "exit_code": outcome.code,
        "elapsed": outcome.elapsed,
        "saved": request.backend is not None,
        "reverted": outcome.reverted,
        "revert_failed": outcome.revert_failed,
        "failures": [{"atom": name, "action": action, **(records.failure_record(f) or {})}
                     for name, action, f in _failures(engine)],
        "error": None if outcome.error is None else f"{type(outcome.error).__name__}: "
                                                    f"{outcome.error}",
        "atoms": [records.atom_record(ad) for ad in records.atoms_of(storage.flow_detail)],
    }
    # The records in memory hold the flow's secrets in clear; what is printed must not.
    click.echo(fmt.to_json(storage.masked(found), sort_keys=True))


def _echo_summary(engine: Any, request: Request, outcome: Outcome, watcher: RunWatcher,
                  table: bool) -> None:
    storage = engine.storage
    if table:
        rows = [[s.name, s.kind, s.state, fmt.duration(s.duration), s.note]
                for s in watcher.statuses()]
        click.echo("")
        for line in fmt.table(["ATOM", "KIND", "STATE", "TIME", ""], rows):
            click.echo(line)
    if isinstance(outcome.error, exc.RunHalted):
        click.echo(f"flow {storage.flow_name} ({storage.flow_uuid}): halted after "
                   f"{fmt.duration(outcome.elapsed)} (exit code {outcome.code}): its progress "
                   f"could not be recorded, so nothing more ran and nothing was reverted")
        click.echo(f"error: {outcome.error.cause or outcome.error}", err=True)
        _echo_resume_hint(engine, request)
        return
    click.echo(f"flow {storage.flow_name} ({storage.flow_uuid}): {outcome.state} after "
               f"{fmt.duration(outcome.elapsed)} (exit code {outcome.code})")
    cancelled = stopping.CancelRequest.from_record(storage.flow_meta.get(stopping.META_CANCELLED))
    if cancelled is not None:
        click.echo(cancelled)
    if outcome.reverted:
        click.echo("revert order: " + " -> ".join(
            f"{name} (revert failed)" if name in outcome.revert_failed else name
            for name in outcome.reverted))
    for name, action, failure in _failures(engine):
        if cancelled is not None and failure.check(exc.FlowCancelled):
            continue  # a task that stopped as its flow's cancel asked
        kind = failure.exc_type_names[0] if failure.exc_type_names else "Failure"
        click.echo(f"failure: {name} ({action}) {kind}: {failure.exception_str}")
        for line in failure.pformat(traceback=True).splitlines()[1:]:
            click.echo(f"    {line}")
    if outcome.error is not None and not _failures(engine):
        click.echo(f"error: {type(outcome.error).__name__}: {outcome.error}", err=True)
    if outcome.state not in (states.SUCCESS, states.REVERTED, states.FAILURE):
        _echo_resume_hint(engine, request)


def _echo_resume_hint(engine: Any, request: Request, err: bool = False) -> None:
    """How to resume the flow (it is resumed on the engine and broker it ran on)."""
    if request.backend_uri is None:
        click.echo("not saved (no --backend): this run cannot be resumed", err=err)
        return
    hint = (f"resume with: flowengine run --resume {engine.storage.flow_uuid} "
            f"--backend {mask_urls(request.backend_uri)}")
    if stored_run.needs_url(request.broker):
        hint += " --url <the broker URL, with its password>"
    click.echo(hint, err=err)
