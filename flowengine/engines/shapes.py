"""A flow's shape, stored with it, and what a resumed engine does when its code changed shape.

A flow's *shape* is what its code made of it: each atom's name, kind, class and version, and
which atoms wait for which (the links between atoms, through nested flows). An engine stores
the shape in the flow detail (metadata ``shape``) the first time it prepares a flow stored with
its factory (``engines.load_from_factory``, jobs: what another process rebuilds, perhaps with
newer code; other flows' metadata stays what TaskFlow stores). An engine
that later prepares the same flow detail (a resume, perhaps after a deploy) compares the shape
its flow factory yields now with the stored one. If they differ and the flow has progress (an
atom left PENDING), it refuses, with the difference (atoms added, removed and changed, links
added and removed), unless a migration is registered for the flow: resuming stored work with
other code is a decision, not an accident. A minor version change (``1.0`` -> ``1.1``) is not a
change of shape; a major one is.

A *migration* (:func:`register_migration`) names the flow (its factory's import path or its
name) and may adjust the stored records once the new atoms exist (mark one done, inject a
value); the new shape is then stored. ``flowengine check --backend URI`` reports the stored
flows the current code cannot resume.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine import states
from flowengine.atom import Atom
from flowengine.engines.compiler import RETRY, Compilation

__all__ = ["META_SHAPE", "FlowShapeChanged", "Migration", "ShapeChange", "difference",
           "migration_for", "register_migration", "shape_of", "unregister_migration"]

#: Flow detail metadata key holding the shape the flow was stored with.
META_SHAPE = "shape"
#: Flow detail metadata key holding how the flow is rebuilt (engines.save_factory_details).
_FACTORY = "factory"

Shape = dict[str, Any]


def _version(atom: Atom) -> str:
    version = atom.version
    return ".".join(str(part) for part in version) if isinstance(version, tuple | list) \
        else str(version)


def _links(compilation: Compilation, atom: Atom) -> set[str]:
    """The atoms that wait for ``atom``, reached through structural (flow) nodes only."""
    graph = compilation.execution_graph
    found: set[str] = set()
    pending = list(graph.successors(atom))
    seen: set[int] = set()
    while pending:
        node = pending.pop()
        if isinstance(node, Atom):
            found.add(node.name)
        elif id(node) not in seen:
            seen.add(id(node))
            pending.extend(graph.successors(node))
    return found


def shape_of(compilation: Compilation) -> Shape:
    """The shape of a compiled flow (JSON: stored in the flow detail); worked out once per
    compilation (engines of one flow shape share it)."""
    cached: Shape | None = getattr(compilation, "_shape", None)
    if cached is not None:
        return cached
    atoms = {}
    links = []
    for atom in compilation.iter_atoms():
        cls = type(atom)
        atoms[atom.name] = {"kind": compilation.kind(atom), "version": _version(atom),
                            "class": f"{cls.__module__}.{cls.__qualname__}"}
        links += [[atom.name, target] for target in sorted(_links(compilation, atom))]
    shape = {"atoms": dict(sorted(atoms.items())), "links": sorted(links)}
    compilation._shape = shape  # type: ignore[attr-defined]
    return shape


@dataclasses.dataclass(frozen=True)
class ShapeChange:
    """How a flow's shape changed between the stored one and the code's.

    Attributes:
        added: Atoms the code has that the stored flow has not (name -> its description).
        removed: Atoms the stored flow has that the code has not.
        changed: Atoms whose kind, class or major version changed: name -> (stored, now).
        links_added: ``(atom, atom that now waits for it)`` pairs.
        links_removed: Pairs no longer linked.
    """

    added: Mapping[str, str] = dataclasses.field(default_factory=dict)
    removed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    changed: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    links_added: tuple[tuple[str, str], ...] = ()
    links_removed: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.links_added
                    or self.links_removed)

    def describe(self) -> list[str]:
        """One line per difference, as ``flowengine check`` and refusals show them."""
        lines = [f"added atom {name!r} ({what})" for name, what in self.added.items()]
        lines += [f"removed atom {name!r} ({what})" for name, what in self.removed.items()]
        lines += [f"changed atom {name!r}: {old} -> {new}"
                  for name, (old, new) in self.changed.items()]
        lines += [f"added link {a!r} -> {b!r}" for a, b in self.links_added]
        lines += [f"removed link {a!r} -> {b!r}" for a, b in self.links_removed]
        return lines


def _describe_atom(atom: Mapping[str, Any]) -> str:
    kind = "retry " if atom.get("kind") == RETRY else ""
    return f"{kind}{atom.get('class')} {atom.get('version')}"


def _major(atom: Mapping[str, Any]) -> tuple[Any, ...]:
    return (atom.get("kind"), atom.get("class"), str(atom.get("version") or "").split(".")[0])


def difference(stored: Shape, now: Shape) -> ShapeChange:
    """What changed from the ``stored`` shape to the one the code yields ``now``."""
    old_atoms, new_atoms = dict(stored.get("atoms") or {}), dict(now.get("atoms") or {})
    old_links = {tuple(link) for link in stored.get("links") or ()}
    new_links = {tuple(link) for link in now.get("links") or ()}
    return ShapeChange(
        added={n: _describe_atom(a) for n, a in sorted(new_atoms.items()) if n not in old_atoms},
        removed={n: _describe_atom(a) for n, a in sorted(old_atoms.items())
                 if n not in new_atoms},
        changed={n: (_describe_atom(old_atoms[n]), _describe_atom(a))
                 for n, a in sorted(new_atoms.items())
                 if n in old_atoms and _major(old_atoms[n]) != _major(a)},
        links_added=tuple(sorted(new_links - old_links)),  # type: ignore[arg-type]
        links_removed=tuple(sorted(old_links - new_links)))  # type: ignore[arg-type]


class FlowShapeChanged(exc.TaskFlowException):
    """A stored flow with progress was resumed by code that yields another shape, and no
    migration is registered for it.

    Attributes:
        flow_name: The flow's name.
        flow_uuid: The flow detail's uuid.
        change: What changed.
    """

    def __init__(self, flow_name: str, flow_uuid: str, factory: str | None,
                 change: ShapeChange) -> None:
        named = factory or flow_name
        super().__init__(
            f"Flow {flow_name!r} ({flow_uuid}) cannot be resumed: it was stored by another "
            f"shape of its code and no migration is registered for it "
            f"(flowengine.migrations.register_migration({named!r}, ...)):\n  "
            + "\n  ".join(change.describe()))
        self.flow_name, self.flow_uuid, self.change = flow_name, flow_uuid, change


#: Adjusts a stored flow to its new shape: called with the change and the engine's storage,
#: once every atom of the new shape has a record.
Migration = Callable[[ShapeChange, Any], None]

_MIGRATIONS: dict[str, Migration] = {}
_MIGRATIONS_LOCK = threading.Lock()


def _accept(change: ShapeChange, storage: Any) -> None:
    """The default migration: new atoms run as any pending atom, removed ones are forgotten."""


def register_migration(flow: str, migrate: Migration | None = None) -> Migration:
    """Let stored flows of ``flow`` resume with the code's new shape.

    Args:
        flow: The flow's factory (its import path, as stored: ``"orders.flows.make"``) or its
            name.
        migrate: Called as ``migrate(change, storage)`` before the resumed flow runs, when the
            new atoms have records: it may set their states (``storage.set_atom_state``), inject
            values, or raise to refuse. None: accept the new shape as it is (new atoms run when
            their turn comes).

    Returns:
        ``migrate`` (so it can decorate: ``@functools.partial(register_migration, "f")``).
    """
    found = migrate or _accept
    with _MIGRATIONS_LOCK:
        _MIGRATIONS[flow] = found
    return found


def unregister_migration(flow: str) -> None:
    """Forget the migration of ``flow`` (if any)."""
    with _MIGRATIONS_LOCK:
        _MIGRATIONS.pop(flow, None)


def migration_for(flow_detail: Any) -> Migration | None:
    """The migration registered for a flow detail (by its factory, then its name)."""
    factory = (flow_detail.meta or {}).get(_FACTORY) or {}
    with _MIGRATIONS_LOCK:
        for name in (factory.get("name"), flow_detail.name):
            if name and name in _MIGRATIONS:
                return _MIGRATIONS[name]
    return None


def recorded(flow_detail: Any) -> bool:
    """Whether ``flow_detail`` records its shape: a flow stored with its factory (another
    process, perhaps running newer code, rebuilds it from that). Other flows are resumed by
    the program holding their flow objects, and their metadata stays what TaskFlow stores."""
    return _FACTORY in (flow_detail.meta or {})


def has_progress(flow_detail: Any) -> bool:
    """Whether any atom of the stored flow left PENDING (something ran, or was decided)."""
    return any(ad.state not in (None, states.PENDING) for ad in flow_detail
               if not ad.name.startswith("_"))


def check(flow_detail: Any,
          compilation: Compilation) -> tuple[ShapeChange | None, Shape | None]:
    """Compare the stored shape with ``compilation``'s: ``(change to migrate, shape to
    record)``; the shape is None for a flow that records none (see :func:`recorded`).

    The change is None when there is nothing to do (same shape, none stored, or no progress to
    keep consistent).

    Raises:
        FlowShapeChanged: If the shape changed, the flow has progress and no migration is
            registered for it.
    """
    stored = (flow_detail.meta or {}).get(META_SHAPE)
    if not stored and not recorded(flow_detail):
        return None, None
    now = shape_of(compilation)
    if not stored or not has_progress(flow_detail):
        return None, now
    change = difference(stored, now)
    if not change:
        return None, now
    if migration_for(flow_detail) is None:
        factory = ((flow_detail.meta or {}).get(_FACTORY) or {}).get("name")
        raise FlowShapeChanged(flow_detail.name, flow_detail.uuid, factory, change)
    return change, now
