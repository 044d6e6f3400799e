"""Loading and running engines: ``load``, ``run`` and the factory/detail helpers."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import urllib.parse
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias

from flowengine import exceptions as exc
from flowengine import flow as flow_base
from flowengine.atom import Atom
from flowengine.engines import factory_policy, run_record
from flowengine.engines.engine import ActionEngine
from flowengine.engines.factory_policy import FactoryPolicy
from flowengine.persistence.base import Backend
from flowengine.persistence.models import FlowDetail, LogBook

LOG = logging.getLogger(__name__)

ENGINES_NAMESPACE = "flowengine.engines"
ENGINE_DEFAULT = "default"

# Engine names and where their classes live; imported on demand so that this layer never
# imports the worker-based layer above it.
_ENGINES: dict[str, str] = {
    "default": "flowengine.engines.engine:SerialActionEngine",
    "serial": "flowengine.engines.engine:SerialActionEngine",
    "parallel": "flowengine.engines.engine:ParallelActionEngine",
    "worker-based": "flowengine.worker_based.engine:WorkerBasedActionEngine",
    "workers": "flowengine.worker_based.engine:WorkerBasedActionEngine",
}

_FACTORY_META = "factory"

#: A persistence backend, or its configuration: a URI string or a dict (``{"connection":
#: URI, ...}``), built (and upgraded) by the helper that is given it.
BackendSpec: TypeAlias = Backend | str | Mapping[str, Any]


def _backend_from_conf(conf: str | Mapping[str, Any]) -> Backend:
    """Build a backend from a URI or dict and bring its storage layout up to date."""
    from flowengine.persistence import backends as p_backends

    backend = p_backends.fetch(conf if isinstance(conf, str) else dict(conf))
    try:
        with contextlib.closing(backend.get_connection()) as conn:
            conn.upgrade()
    except BaseException:
        backend.close()
        raise
    return backend


@contextlib.contextmanager
def _owned_backend(backend: BackendSpec | None,
                   keep: bool = True) -> Iterator[tuple[Backend | None, bool]]:
    """Yield ``(backend, owned)``.

    A backend built here from a URI or dict is owned: closed on leaving, unless ``keep`` and the
    block succeeded (its new owner, an engine, closes it later). A backend object is the
    caller's and passes through untouched.
    """
    if not isinstance(backend, (str, Mapping)):
        if backend is not None and not callable(getattr(backend, "get_connection", None)):
            # Else an AttributeError from deep inside the storage, naming no argument.
            raise TypeError(f"backend must be a persistence backend, or its URI string or "
                            f"dict, not {backend!r}")
        yield backend, False
        return
    built = _backend_from_conf(backend)
    kept = False
    try:
        yield built, True
        kept = keep
    finally:
        if not kept:
            built.close()


def _extract_engine(engine: Any, **kwargs: Any) -> tuple[str, dict[str, Any]]:
    """Split ``engine`` (a name or a URI like ``parallel://?max_workers=4``) into kind+options."""
    options: dict[str, Any] = {}
    conf = kwargs.pop("engine_conf", None)
    if isinstance(conf, Mapping):
        conf = dict(conf)
        engine = conf.pop("engine", engine)
        options.update(conf)
    elif isinstance(conf, str):
        engine = conf
    if not isinstance(engine, str):
        raise TypeError(f"Engine must be a name or a URI string, not {engine!r}")
    kind = engine
    if "://" in engine:
        parsed = urllib.parse.urlsplit(engine)
        kind = parsed.scheme
        for key, values in urllib.parse.parse_qs(parsed.query).items():
            options[key] = values[-1] if len(values) == 1 else values
    options.update(kwargs)
    return kind, options


def _engine_class(kind: str) -> type:
    try:
        target = _ENGINES[kind]
    except KeyError:
        known = ", ".join(sorted(_ENGINES))
        raise exc.NotFound(f"Could not find engine {kind!r} (known engines: {known})") from None
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)  # type: ignore[no-any-return]


def _load(
    flow: flow_base.Flow | Atom,
    store: Mapping[str, Any] | None,
    flow_detail: FlowDetail | None,
    book: LogBook | None,
    backend: Backend | None,
    owned: bool,
    engine: str | None,
    kwargs: dict[str, Any],
) -> tuple[ActionEngine, weakref.finalize | None]:
    """Load an engine; return it with the finalizer closing its owned backend (or None)."""
    from flowengine.utils import persistence_utils as p_utils

    if flow_detail is not None and not isinstance(flow_detail, FlowDetail):
        raise TypeError(f"flow_detail must be a FlowDetail, not {flow_detail!r}")
    if book is not None and not isinstance(book, LogBook):
        raise TypeError(f"book must be a LogBook, not {book!r}")
    kind, options = _extract_engine(engine, **kwargs)
    cls = _engine_class(kind)
    if flow_detail is None:
        flow_detail = p_utils.create_flow_detail(flow, book=book, backend=backend)
    engine_obj = cls(flow, flow_detail, backend, options)
    if run_record.is_worker_based(kind) and run_record.META_KEY not in flow_detail.meta:
        # How it runs (secrets masked), for a resume elsewhere (the dashboard); stored with the
        # flow detail's next save, as the run starts.
        flow_detail.meta[run_record.META_KEY] = run_record.record(
            engine if isinstance(engine, str) and engine.split("://", 1)[0] == kind else kind,
            options,
            list(options.get("topics") or []))
    closer = None
    if owned and backend is not None:
        # Nobody else holds a backend built from a URI: close it when the engine goes away.
        closer = weakref.finalize(engine_obj, backend.close)
    if store:
        engine_obj.storage.inject(store)
    return engine_obj, closer


def load(
    flow: flow_base.Flow | Atom,
    store: Mapping[str, Any] | None = None,
    flow_detail: FlowDetail | None = None,
    book: LogBook | None = None,
    backend: BackendSpec | None = None,
    namespace: str = ENGINES_NAMESPACE,
    engine: str = ENGINE_DEFAULT,
    **kwargs: Any,
) -> ActionEngine:
    """Load a flow into an engine, ready to run.

    A backend given as a URI or dict is built (and upgraded) here and closed when the engine is
    garbage collected; a backend object is never closed.

    Args:
        flow: the flow (or atom) to run.
        store: values injected into storage before running.
        flow_detail: an existing flow detail to use (resume); created when None.
        book: the logbook a new flow detail is added to.
        backend: a persistence backend, or its configuration (URI string or dict).
        namespace: kept for TaskFlow compatibility; unused.
        engine: engine name (``serial``/``default``, ``parallel``, ``worker-based``) or URI.
        **kwargs: engine options.
    """
    with _owned_backend(backend) as (backend, owned):
        return _load(flow, store, flow_detail, book, backend, owned, engine, kwargs)[0]


def run(
    flow: flow_base.Flow | Atom,
    store: Mapping[str, Any] | None = None,
    flow_detail: FlowDetail | None = None,
    book: LogBook | None = None,
    backend: BackendSpec | None = None,
    namespace: str = ENGINES_NAMESPACE,
    engine: str = ENGINE_DEFAULT,
    **kwargs: Any,
) -> dict[str, Any]:
    """Load and run a flow; return everything it stored (``storage.fetch_all()``).

    A backend given as a URI or dict is closed before this returns.
    """
    with _owned_backend(backend) as (backend, owned):
        engine_obj, closer = _load(flow, store, flow_detail, book, backend, owned, engine, kwargs)
    try:
        engine_obj.run()
        return engine_obj.storage.fetch_all()  # type: ignore[no-any-return]
    finally:
        if closer is not None:
            closer()


def _callable_name(function: Callable[..., Any]) -> str:
    """The dotted name a factory is stored under, found as TaskFlow (oslo's reflection) does.

    A bound method is named after its owner's module, a function after its own, and any other
    callable after its type; a class of metaclass ``type`` is named after itself (one with another
    metaclass, such as a Flow subclass, after its metaclass, so TaskFlow refuses it).
    """
    owner = function.__self__ if inspect.ismethod(function) else None
    if owner is not None:
        module = (owner if isinstance(owner, type) else type(owner)).__module__
        return f"{module}.{function.__qualname__}"
    if inspect.isfunction(function):
        return f"{function.__module__}.{function.__qualname__}"
    kind = type(function)
    if kind is type:
        kind = function  # type: ignore[assignment]
    return f"{kind.__module__}.{kind.__qualname__}"


def _fetch_factory(name: str) -> Callable[..., Any]:
    """Import ``module.attribute`` as TaskFlow does: one attribute of an importable module.

    Raises:
        ImportError: naming the factory, whatever stopped the import.
    """
    module_name, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)  # type: ignore[no-any-return]
    except (ImportError, ValueError, AttributeError) as err:
        raise ImportError(f"Could not import flow factory {name!r}: {err}") from err


def _fetch_validate_factory(
    flow_factory: str | Callable[..., Any],
) -> tuple[str, Callable[..., Any]]:
    """Return the name a factory is stored under and the factory itself.

    Raises:
        ImportError: ``flow_factory`` is a name that cannot be imported.
        ValueError: ``flow_factory`` is a callable its own name does not import back (a lambda,
            a nested function, a method, a renamed or deleted function): another process could
            never rebuild the flow, so it is refused when saved, not when resumed.
    """
    if isinstance(flow_factory, str):
        return flow_factory, _fetch_factory(flow_factory)
    name = _callable_name(flow_factory)
    try:
        reimported: Any = _fetch_factory(name)
    except ImportError:
        reimported = None
    if reimported is None or reimported != flow_factory:
        raise ValueError(f"Flow factory {flow_factory!r} is not reimportable by name {name}")
    return name, flow_factory


def save_factory_details(
    flow_detail: FlowDetail,
    flow_factory: str | Callable[..., Any],
    factory_args: Sequence[Any] | None,
    factory_kwargs: Mapping[str, Any] | None,
    backend: BackendSpec | None = None,
) -> None:
    """Record in the flow detail how to rebuild its flow (so another process can resume it).

    Args:
        flow_detail: the flow detail whose ``meta["factory"]`` is set.
        flow_factory: the factory, or its import path (``"package.module.function"``).
        factory_args: its positional arguments.
        factory_kwargs: its keyword arguments.
        backend: when given (a backend, or its URI or dict), the flow detail is saved to it.

    Raises:
        ValueError: the factory cannot be imported back by its name.
        ImportError: the factory is given by a name that cannot be imported.
    """
    name, _ = _fetch_validate_factory(flow_factory)
    factory = {"name": name, "args": list(factory_args or ()),
               "kwargs": dict(factory_kwargs or {})}
    if not flow_detail.meta:
        flow_detail.meta = {_FACTORY_META: factory}
    else:
        flow_detail.meta[_FACTORY_META] = factory
    if backend is None:
        return
    with _owned_backend(backend, keep=False) as (built, _):
        assert built is not None  # given, so built or passed through
        with contextlib.closing(built.get_connection()) as conn:
            conn.update_flow_details(flow_detail)


def load_from_factory(
    flow_factory: str | Callable[..., Any],
    factory_args: Sequence[Any] | None = None,
    factory_kwargs: Mapping[str, Any] | None = None,
    store: Mapping[str, Any] | None = None,
    book: LogBook | None = None,
    backend: BackendSpec | None = None,
    namespace: str = ENGINES_NAMESPACE,
    engine: str = ENGINE_DEFAULT,
    **kwargs: Any,
) -> ActionEngine:
    """Build a flow with a factory (or its import path), record the factory, load it.

    Raises:
        ValueError: the factory cannot be imported back by its name.
        ImportError: the factory is given by a name that cannot be imported.
    """
    from flowengine.utils import persistence_utils as p_utils

    _, factory = _fetch_validate_factory(flow_factory)
    flow = factory(*(factory_args or ()), **(factory_kwargs or {}))
    with _owned_backend(backend) as (backend, owned):
        flow_detail = p_utils.create_flow_detail(flow, book=book, backend=backend)
        save_factory_details(flow_detail, flow_factory, factory_args, factory_kwargs,
                             backend=backend)
        return _load(flow, store, flow_detail, book, backend, owned, engine, kwargs)[0]


def flow_from_detail(flow_detail: FlowDetail, *,
                     policy: FactoryPolicy | None = None) -> flow_base.Flow | Atom:
    """Rebuild the flow of a flow detail saved with factory details.

    The stored factory is imported and called only if ``policy`` (by default the one in
    force: :func:`flowengine.engines.factory_policy.current`) allows it: never one from the
    standard library, builtins or flowengine, and only a function or class written in Python.

    Raises:
        ValueError: the flow detail has no factory details.
        ImportError: the stored factory cannot be imported (the message names it).
        flowengine.engines.factory_policy.FactoryRefused: the policy refuses it (an
            ImportError; the message names the factory and the rule).
    """
    where = f"{getattr(flow_detail, 'name', '?')} {getattr(flow_detail, 'uuid', '?')}"
    try:
        factory = flow_detail.meta[_FACTORY_META]
    except (KeyError, AttributeError, TypeError):
        raise ValueError(
            f"Cannot reconstruct flow {where}: no factory information saved.") from None
    policy = policy or factory_policy.current()
    try:
        function = policy.fetch(str(factory["name"]))
    except KeyError:
        raise ImportError(f"Could not import factory for flow {where}: its factory details "
                          f"name no factory") from None
    except factory_policy.FactoryRefused as err:
        raise factory_policy.FactoryRefused(f"Refused to rebuild flow {where}: {err}") from err
    except (ImportError, ValueError, AttributeError) as err:
        raise ImportError(f"Could not import factory for flow {where}: Could not import flow "
                          f"factory {factory['name']!r}: {err}") from err
    with factory_policy.applying(policy):
        try:
            return function(*factory.get("args", ()), **factory.get("kwargs", {}))
        except factory_policy.FactoryRefused as err:  # a rebuilder refusing what it names
            raise factory_policy.FactoryRefused(f"Refused to rebuild flow {where}: stored "
                                                f"factory {factory['name']!r}: {err}") from err


def load_from_detail(
    flow_detail: FlowDetail,
    store: Mapping[str, Any] | None = None,
    backend: BackendSpec | None = None,
    namespace: str = ENGINES_NAMESPACE,
    engine: str = ENGINE_DEFAULT,
    **kwargs: Any,
) -> ActionEngine:
    """Rebuild a flow detail's flow and load it into an engine (to resume it)."""
    flow = flow_from_detail(flow_detail)
    return load(flow, flow_detail=flow_detail, store=store, backend=backend,
                namespace=namespace, engine=engine, **kwargs)
