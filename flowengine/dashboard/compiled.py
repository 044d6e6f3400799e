"""A stored flow rebuilt from its saved factory and compiled: its graph and its atoms' wiring.

Rebuilding a flow imports and calls the factory its record names, and whoever can write a
record or post a job chooses that name: so the dashboard rebuilds a flow only when the operator
allowed its factory's module (``flowengine dashboard --allow-factories MODULE``, never with
``--read-only``; see :mod:`flowengine.engines.factory_policy`). Otherwise, and for flows saved
without factory details, a page draws the stored atoms alone. Compiling uses a throwaway
in-memory engine, never the flow's stored records. Results are cached per flow uuid, since a
flow's shape does not change while the dashboard shows it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from typing import Any

from flowengine import engines
from flowengine.cli import graph_view
from flowengine.dashboard import layout
from flowengine.engines.factory_policy import FactoryPolicy, FactoryRefused
from flowengine.persistence import models

LOG = logging.getLogger(__name__)

#: Compiled flows kept.
CACHE_SIZE = 64
#: The dashboard's default: no stored factory is imported.
NO_FACTORIES = FactoryPolicy(modules=())


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What the dashboard needs from a compiled flow."""

    kinds: dict[str, str]
    edges: list[tuple[str, str]]
    #: Each atom's ``{argument: stored name}`` and its secret arguments.
    rebind: dict[str, dict[str, str]]
    secret_args: dict[str, tuple[str, ...]]
    #: Stored name -> (providing atom, index in its result or None for the whole result).
    provided_by: dict[str, tuple[str, Any]]


class Compiler:
    """Rebuilds and compiles stored flows, keeping the last :data:`CACHE_SIZE`.

    Args:
        policy: The factories it may import and call (none by default: nothing is rebuilt).
    """

    def __init__(self, policy: FactoryPolicy = NO_FACTORIES) -> None:
        self.policy = policy
        self._cache: collections.OrderedDict[str, Compiled | str] = collections.OrderedDict()
        self._lock = threading.Lock()

    def compile(self, fd: models.FlowDetail) -> Compiled | str:
        """The compiled flow of ``fd``, or why it cannot be had (a sentence)."""
        with self._lock:
            found = self._cache.get(fd.uuid)
        if found is None:
            found = _compile(fd, self.policy)
            with self._lock:
                self._cache[fd.uuid] = found
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        return found


def _compile(fd: models.FlowDetail, policy: FactoryPolicy) -> Compiled | str:
    from flowengine.cli import loading

    factory = fd.meta.get("factory") if isinstance(fd.meta, dict) else None
    if not isinstance(factory, dict):
        return "the flow was saved without factory details, so its graph cannot be rebuilt"
    if not policy.allows_any:
        return (f"its graph is not rebuilt: that would import and call its stored factory "
                f"{str(factory.get('name'))!r}, and this dashboard allows no factory module "
                f"(start it with --allow-factories MODULE to draw graphs)")
    loading.ensure_cwd_on_path()
    try:
        flow = engines.flow_from_detail(fd, policy=policy)
        engine = engines.load(flow)
        engine.compile()
    except ValueError:
        return "the flow was saved without factory details, so its graph cannot be rebuilt"
    except FactoryRefused as err:
        return f"its graph is not rebuilt: {err}"
    except Exception as err:
        LOG.info("Cannot rebuild flow %s: %s", fd.uuid, err, exc_info=True)
        return f"the flow's saved factory cannot rebuild it here: {type(err).__name__}: {err}"
    graph = graph_view.build(engine.compilation)
    atoms = list(engine.compilation.iter_atoms())
    provided_by = {name: (atom.name, index) for atom in atoms
                   for name, index in atom.save_as.items()}
    return Compiled(
        kinds=graph.kinds,
        edges=[(e.source, e.target) for e in graph.edges],
        rebind={atom.name: dict(atom.rebind) for atom in atoms},
        secret_args={atom.name: tuple(getattr(atom, "secret_args", ())) for atom in atoms},
        provided_by=provided_by)


def drawing(compiled: Compiled | str, names: list[str]) -> layout.Layout:
    """The graph's layout; without a compiled flow, the stored atoms in one column."""
    if isinstance(compiled, str):
        return layout.layout(dict.fromkeys(names, "task"), [])
    kinds = dict(compiled.kinds)
    for name in names:
        kinds.setdefault(name, "task")
    return layout.layout(kinds, compiled.edges)


def inputs_of(compiled: Compiled, name: str, results: dict[str, Any],
              injected: dict[str, Any]) -> dict[str, Any]:
    """The arguments atom ``name`` was given, as far as stored results tell them."""
    found: dict[str, Any] = {}
    for arg, source in compiled.rebind.get(name, {}).items():
        if source in injected:
            found[arg] = injected[source]
            continue
        provider = compiled.provided_by.get(source)
        if provider is None or provider[0] not in results:
            continue
        value, index = results[provider[0]], provider[1]
        try:
            found[arg] = value if index is None else value[index]
        except (KeyError, IndexError, TypeError):
            continue
    return found
