"""Engines: load a flow and run it (serially, on threads, or on remote workers)."""

from flowengine.engines.delays import RetryWait
from flowengine.engines.engine import ActionEngine, ParallelActionEngine, SerialActionEngine
from flowengine.engines.helpers import (
    ENGINE_DEFAULT,
    ENGINES_NAMESPACE,
    flow_from_detail,
    load,
    load_from_detail,
    load_from_factory,
    run,
    save_factory_details,
)

__all__ = [
    # loading and running
    "load",
    "run",
    "load_from_factory",
    "save_factory_details",
    "flow_from_detail",
    "load_from_detail",
    "ENGINE_DEFAULT",
    "ENGINES_NAMESPACE",
    # engine classes
    "ActionEngine",
    "SerialActionEngine",
    "ParallelActionEngine",
    # what engine.retry_waits announces
    "RetryWait",
]
