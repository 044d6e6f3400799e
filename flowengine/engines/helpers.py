"""Loading and running engines: ``load``, ``run`` and the factory/detail helpers."""

from __future__ import annotations

import importlib
import logging
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flowengine import exceptions as exc

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


def _backend_from_conf(conf: Any) -> Any:
    """Build a backend from a URI or dict and bring its storage layout up to date."""
    from flowengine.persistence import backends as p_backends

    backend = p_backends.fetch(conf if isinstance(conf, str) else dict(conf))
    conn = backend.get_connection()
    try:
        conn.upgrade()
    finally:
        conn.close()
    return backend


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


def load(
    flow: Any,
    store: Mapping[str, Any] | None = None,
    flow_detail: Any = None,
    book: Any = None,
    backend: Any = None,
    namespace: str = ENGINES_NAMESPACE,
    engine: str = ENGINE_DEFAULT,
    **kwargs: Any,
) -> Any:
    """Load a flow into an engine, ready to run.

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
    from flowengine.utils import persistence_utils as p_utils

    kind, options = _extract_engine(engine, **kwargs)
    if isinstance(backend, (str, Mapping)):
        backend = _backend_from_conf(backend)
    if flow_detail is None:
        flow_detail = p_utils.create_flow_detail(flow, book=book, backend=backend)
    engine_obj = _engine_class(kind)(flow, flow_detail, backend, options)
    if store:
        engine_obj.storage.inject(store)
    return engine_obj


def run(
    flow: Any,
    store: Mapping[str, Any] | None = None,
    flow_detail: Any = None,
    book: Any = None,
    backend: Any = None,
    namespace: str = ENGINES_NAMESPACE,
    engine: str = ENGINE_DEFAULT,
    **kwargs: Any,
) -> dict[str, Any]:
    """Load and run a flow; return everything it stored (``storage.fetch_all()``)."""
    engine_obj = load(flow, store=store, flow_detail=flow_detail, book=book, backend=backend,
                      namespace=namespace, engine=engine, **kwargs)
    engine_obj.run()
    return engine_obj.storage.fetch_all()  # type: ignore[no-any-return]


def _callable_name(function: Callable[..., Any]) -> str:
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise ValueError(f"Flow factory {function!r} must be a module-level function or class")
    return f"{module}.{qualname}"


def _import_callable(name: str) -> Callable[..., Any]:
    module_name, _, attr = name.rpartition(".")
    while module_name:
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError:
            module_name, _, head = module_name.rpartition(".")
            attr = f"{head}.{attr}"
            continue
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj  # type: ignore[no-any-return]
    raise ImportError(f"Could not import flow factory {name!r}")


def save_factory_details(
    flow_detail: Any,
    flow_factory: Callable[..., Any],
    factory_args: Sequence[Any] | None,
    factory_kwargs: Mapping[str, Any] | None,
    backend: Any = None,
) -> None:
    """Record in the flow detail how to rebuild its flow (so another process can resume it)."""
    flow_detail.meta[_FACTORY_META] = {
        "name": _callable_name(flow_factory),
        "args": list(factory_args or ()),
        "kwargs": dict(factory_kwargs or {}),
    }
    if backend is not None:
        conn = backend.get_connection()
        try:
            conn.update_flow_details(flow_detail)
        finally:
            close = getattr(conn, "close", None)
            if close is not None:
                close()


def load_from_factory(
    flow_factory: Callable[..., Any],
    factory_args: Sequence[Any] | None = None,
    factory_kwargs: Mapping[str, Any] | None = None,
    store: Mapping[str, Any] | None = None,
    book: Any = None,
    backend: Any = None,
    namespace: str = ENGINES_NAMESPACE,
    engine: str = ENGINE_DEFAULT,
    **kwargs: Any,
) -> Any:
    """Build a flow with a factory, record the factory, and load it into an engine."""
    from flowengine.utils import persistence_utils as p_utils

    flow = flow_factory(*(factory_args or ()), **(factory_kwargs or {}))
    if isinstance(backend, (str, Mapping)):
        backend = _backend_from_conf(backend)
    flow_detail = p_utils.create_flow_detail(flow, book=book, backend=backend)
    save_factory_details(flow_detail, flow_factory, factory_args, factory_kwargs,
                         backend=backend)
    return load(flow, store=store, flow_detail=flow_detail, book=book, backend=backend,
                namespace=namespace, engine=engine, **kwargs)


def flow_from_detail(flow_detail: Any) -> Any:
    """Rebuild the flow of a flow detail saved with factory details.

    Raises:
        ValueError: the flow detail has no factory details.
        ImportError: the factory cannot be imported.
    """
    try:
        factory = flow_detail.meta[_FACTORY_META]
    except (KeyError, AttributeError, TypeError):
        raise ValueError(
            f"Cannot rebuild the flow of flow detail {getattr(flow_detail, 'uuid', '?')}: it "
            f"has no factory details"
        ) from None
    function = _import_callable(factory["name"])
    return function(*factory.get("args", ()), **factory.get("kwargs", {}))


def load_from_detail(
    flow_detail: Any,
    store: Mapping[str, Any] | None = None,
    backend: Any = None,
    namespace: str = ENGINES_NAMESPACE,
    engine: str = ENGINE_DEFAULT,
    **kwargs: Any,
) -> Any:
    """Rebuild a flow detail's flow and load it into an engine (to resume it)."""
    flow = flow_from_detail(flow_detail)
    return load(flow, flow_detail=flow_detail, store=store, backend=backend,
                namespace=namespace, engine=engine, **kwargs)
