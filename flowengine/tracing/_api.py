"""Whether tracing is on, found without importing OpenTelemetry.

Tracing is on when the application has imported ``opentelemetry.trace`` (which it must have
done to configure anything) and set a tracer provider (or names one in
``OTEL_PYTHON_TRACER_PROVIDER``). Otherwise every hook returns after a dictionary lookup: the
OpenTelemetry API is never imported by flowengine itself, so an installed but unused API costs
no start-up time either.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType
from typing import Any

import flowengine

#: The instrumentation scope name of every flowengine span.
SCOPE = "flowengine"
#: What a missing API says.
MISSING = ("Tracing needs the OpenTelemetry API: install the 'otel' extra "
           "(pip install 'flowengine[otel]')")

# (provider, tracer): one tracer per configured provider, made on first use.
_cached: tuple[Any, Any] | None = None


_modules: tuple[ModuleType, ModuleType] | None = None


def otel() -> tuple[ModuleType, ModuleType]:
    """``(opentelemetry.trace, opentelemetry.context)``, for code that runs with tracing on
    (imported once: an import statement per span would cost more than the span)."""
    global _modules
    if _modules is None:
        import opentelemetry.context as context
        import opentelemetry.trace as trace

        _modules = (trace, context)
    return _modules


def imported(name: str) -> ModuleType | None:
    """Module ``name`` if it was imported to its end, else None.

    A module another thread is still importing is in ``sys.modules`` before its names are:
    read then, it raises AttributeError ("partially initialized module"). A conductor's threads
    hit that when one imported the API (a job carrying a trace) as another looked for it.
    """
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def trace_module() -> ModuleType | None:
    """``opentelemetry.trace`` if the application imported it, else None."""
    return imported("opentelemetry.trace")


def tracer() -> Any | None:
    """flowengine's tracer from the configured provider, or None when tracing is off."""
    global _cached
    trace = imported("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    cached = _cached
    if cached is not None and cached[0] is provider:
        return cached[1]
    made = provider.get_tracer(SCOPE, flowengine.__version__)
    _cached = (provider, made)
    return made


def enabled() -> bool:
    """Whether flowengine records spans (the API is imported and a provider is configured)."""
    return tracer() is not None


def flush(timeout: float = 5.0) -> None:
    """Export the spans the configured provider still buffers (before a process ends without
    running its exit handlers, as the worker command does)."""
    trace = imported("opentelemetry.trace")
    if trace is None:
        return
    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if force_flush is not None:
        try:
            force_flush(int(timeout * 1000))
        except Exception:  # an exporter that fails must not stop the process from exiting
            logging.getLogger(__name__).warning("Could not flush spans", exc_info=True)


def require() -> ModuleType:
    """``opentelemetry.trace``, imported.

    Raises:
        ImportError: naming the extra to install when the API is missing.
    """
    try:
        import opentelemetry.trace as trace
    except ImportError as err:
        raise ImportError(MISSING) from err
    return trace
