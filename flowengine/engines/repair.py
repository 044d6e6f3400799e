"""Repairing a flow its engine could not finish: what an operator does instead of editing rows.

A revert that raises leaves its atom ``REVERT_FAILURE`` and the flow ``FAILURE``; an execute
whose cause was outside the flow (a quota, a host down) leaves the flow reverted, or failed.
Three repairs put such a flow right, each done by an engine on the stored flow, in the process
that asks, and each recorded (who, when, why, what) in the flow's and the atoms' metadata
(:data:`META_REPAIRS`), announced on the engine's ``interventions`` notifier (the event stream's
``flow-repaired``) and shown by ``flowengine show`` and the dashboard:

``retry-reverts`` (:data:`RETRY_REVERTS`)
    The failed reverts run again (the cause is fixed), each with what its execute returned,
    then the remaining reverts in order: the flow ends ``REVERTED``.
``mark-reverted ATOM`` (:data:`MARK_REVERTED`)
    An operator vouches that what ATOM did is undone (the resource is gone): ATOM is stored
    ``REVERTED`` without its revert running, and the remaining reverts run.
``retry-from ATOM`` (:data:`RETRY_FROM`)
    ATOM's execute failed and its cause is fixed: ATOM and everything after it run again,
    with the results of the atoms before it kept (those undone run again too); the flow's
    earlier cancel and deadline no longer apply.

A repair is refused while any engine or conductor holds the flow (:func:`holder`), naming where
it runs, and when the flow is not in a state the repair fits. ``engine.repair`` asks for one
before a run; :func:`repair_stored` (and the three functions named after the repairs) load the
stored flow, repair it and run it; ``flowengine repair`` does the same from a shell.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import networkx as nx

from flowengine import flow as flow_base
from flowengine import states
from flowengine.atom import Atom
from flowengine.engines import suspend_requests as sr
from flowengine.engines.actions import META_REVERT_INPUT
from flowengine.engines.stopping import META_CANCELLED, META_DEADLINE
from flowengine.persistence.base import Backend

if TYPE_CHECKING:  # engine.py imports this module: the engine types only for checking
    from flowengine.engines.compiler import Compilation
    from flowengine.engines.engine import ActionEngine
    from flowengine.engines.runtime import Runtime
    from flowengine.storage import Storage

__all__ = ["ClaimBoard", "ListedEntity", "ListedJob", "MARK_REVERTED", "META_REPAIRS",
           "RETRY_FROM", "RETRY_REVERTS", "Repair", "RepairRefused", "holder", "mark_reverted",
           "repair_stored", "retry_from", "retry_reverts"]

LOG = logging.getLogger(__name__)

#: Flow and atom metadata: the repairs made, oldest first (each a :meth:`Repair.record`).
META_REPAIRS = "repairs"
RETRY_REVERTS = "retry-reverts"
MARK_REVERTED = "mark-reverted"
RETRY_FROM = "retry-from"
#: Every repair, by name.
ACTIONS = (RETRY_REVERTS, MARK_REVERTED, RETRY_FROM)
#: What the engine's ``interventions`` notifier announces as a repair is made.
REPAIRED = "repaired"
#: Flow states a repair takes a flow from.
_REPAIRABLE = {RETRY_REVERTS: (states.FAILURE,), MARK_REVERTED: (states.FAILURE,),
               RETRY_FROM: (states.FAILURE, states.REVERTED)}
#: Atom states an operator may vouch for as undone: its revert failed, or never ran.
_VOUCHABLE = frozenset((states.REVERT_FAILURE, states.SUCCESS, states.FAILURE,
                        states.REVERTING, states.RUNNING))


class RepairRefused(Exception):
    """A repair that cannot be made now (the message names the flow, and why)."""


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclasses.dataclass(frozen=True)
class Repair:
    """One repair an operator asks for.

    Attributes:
        action: :data:`RETRY_REVERTS`, :data:`MARK_REVERTED` or :data:`RETRY_FROM`.
        atom: The atom it is about (None for ``retry-reverts``).
        reason: Why (required to mark an atom reverted: the operator vouches for it).
        by: Who asks.
        at: When, ISO 8601 in UTC to the second.
    """

    action: str
    atom: str | None
    reason: str | None
    by: str
    at: str

    @classmethod
    def now(cls, action: str, atom: str | None = None, reason: str | None = None,
            by: str = "engine.repair",
            clock: Callable[[], datetime.datetime] = _utc_now) -> Repair:
        """A repair asked for now.

        Raises:
            ValueError: an unknown action, an atom missing (or given to ``retry-reverts``), no
                reason to mark an atom reverted, or no ``by``.
        """
        if action not in ACTIONS:
            raise ValueError(f"Unknown repair {action!r}: use one of {', '.join(ACTIONS)}")
        if action == RETRY_REVERTS and atom is not None:
            raise ValueError("retry-reverts runs every failed revert again: it takes no atom")
        if action != RETRY_REVERTS and not atom:
            raise ValueError(f"{action} needs the name of the atom it is about")
        reason = reason.strip() if isinstance(reason, str) else None
        if action == MARK_REVERTED and not reason:
            raise ValueError("mark-reverted needs a reason: the operator vouches that what the "
                             "atom did is undone, and says how they know")
        if not isinstance(by, str) or not by.strip():
            raise ValueError(f"A repair needs who asks for it (by), got {by!r}")
        return cls(action, atom, reason or None, by.strip(),
                   clock().isoformat(timespec="seconds"))

    def record(self, atoms: Iterable[str] = ()) -> dict[str, Any]:
        """What is stored of it, with the atoms it changed."""
        return {"action": self.action, "atom": self.atom, "reason": self.reason,
                "by": self.by, "at": self.at, "atoms": list(atoms)}

    def __str__(self) -> str:
        about = f" {self.atom}" if self.atom else ""
        why = f": {self.reason}" if self.reason else ""
        return f"{self.action}{about} by {self.by} at {self.at}{why}"


# -- who holds a flow ------------------------------------------------------------------------


class ListedJob(Protocol):
    """A job as a repair reads it off a jobboard (a :class:`flowengine.jobs.base.Job`)."""

    @property
    def uuid(self) -> str:
        """Its uuid."""

    @property
    def name(self) -> str:
        """Its name."""

    @property
    def details(self) -> Mapping[str, Any]:
        """Its details (``flow_uuid`` names the flow it runs)."""


class ListedEntity(Protocol):
    """An entity registered on a jobboard (a :class:`flowengine.types.entity.Entity`)."""

    @property
    def name(self) -> str:
        """Its unique name (a conductor's)."""

    @property
    def metadata(self) -> Mapping[str, Any]:
        """What it tells of itself (``hostname``, ``pid``...)."""


#: The kind of job a board lists (and is asked the owner of).
J = TypeVar("J", bound=ListedJob)


class ClaimBoard(Protocol[J]):
    """What a repair asks of a jobboard (TaskFlow's JobBoard API): who claimed a flow's job.

    Typed by its shape: the jobs layer sits above the engines', which cannot import it.
    """

    def iterjobs(self, only_unclaimed: bool = False, ensure_fresh: bool = False) -> Iterator[J]:
        """The posted jobs."""

    def find_owner(self, job: J) -> str | None:
        """The name of whoever claimed ``job`` (None: unclaimed)."""

    def iter_entities(self, kind: str | None = None) -> Iterable[ListedEntity]:
        """The entities registered on the board (conductors), of ``kind``."""


def holder(meta: dict[str, Any], flow_uuid: str,
           board: ClaimBoard[J] | None = None) -> str | None:
    """Who holds the flow (an engine running it, a conductor's claim on its job), or None.

    Args:
        meta: The stored flow detail's metadata.
        flow_uuid: The flow detail's uuid.
        board: A connected jobboard (TaskFlow's JobBoard API) whose claims count, or None.
    """
    where = meta.get(sr.META_RUNNING_ON)
    if isinstance(where, dict) and not sr.gone(where):
        return (f"its {where.get('engine')} in pid {where.get('pid')} on {where.get('host')} "
                f"(running since {where.get('since')})")
    return None if board is None else _claimed_by(board, flow_uuid)


def _claimed_by(board: ClaimBoard[J], flow_uuid: str) -> str | None:
    for job in board.iterjobs(only_unclaimed=False, ensure_fresh=True):
        if (job.details or {}).get("flow_uuid") != flow_uuid:
            continue
        try:
            owner = board.find_owner(job)
        except Exception:  # consumed or trashed since it was listed
            continue
        if not owner:
            continue
        found = next((e.metadata for e in board.iter_entities("conductor") if e.name == owner),
                     None) or {}
        host, pid = found.get("hostname"), found.get("pid")
        where = f" (pid {pid} on {host})" if host or pid else ""
        return f"conductor {owner}{where}, which claimed its job {job.name!r} ({job.uuid})"
    return None


# -- what a repair changes --------------------------------------------------------------------


def check(storage: Storage, compilation: Compilation, repair: Repair) -> None:
    """Raise :class:`RepairRefused` unless ``repair`` fits the flow as it is stored."""
    name, uuid, state = storage.flow_name, storage.flow_uuid, storage.get_flow_state()
    flow = f"flow {name!r} ({uuid})"
    wanted = _REPAIRABLE[repair.action]
    if state not in wanted:
        raise RepairRefused(f"{flow} is {state}: {repair.action} repairs a "
                            f"{' or '.join(wanted)} flow")
    atoms = {atom.name: atom for atom in compilation.iter_atoms()}
    if repair.atom is not None and repair.atom not in atoms:
        raise RepairRefused(f"{flow} has no atom {repair.atom!r} (its atoms: "
                            f"{', '.join(sorted(atoms))})")
    failed = [n for n in atoms if storage.get_atom_state(n) == states.REVERT_FAILURE]
    if repair.action == RETRY_REVERTS and not failed:
        raise RepairRefused(f"{flow} has no failed revert to run again")
    if repair.action == MARK_REVERTED:
        assert repair.atom is not None
        atom_state = storage.get_atom_state(repair.atom)
        if atom_state not in _VOUCHABLE or (
                atom_state != states.REVERT_FAILURE
                and storage.get_atom_intention(repair.atom) != states.REVERT):
            raise RepairRefused(f"atom {repair.atom!r} of {flow} is {atom_state}: only an atom "
                                f"whose revert failed (or is still due) can be marked reverted")
    if repair.action == RETRY_FROM:
        assert repair.atom is not None
        if failed:
            raise RepairRefused(
                f"the revert of {', '.join(map(repr, failed))} in {flow} failed: what they did "
                f"may be half undone; repair that first (retry-reverts, or mark-reverted)")
        if _execute_failure(storage, repair.atom) is None:
            raise RepairRefused(f"atom {repair.atom!r} of {flow} did not fail its execute "
                                f"(it is {storage.get_atom_state(repair.atom)}): retry-from "
                                f"runs on from a failed execute")


def _execute_failure(storage: Storage, atom: str) -> Any:
    detail = storage.flow_detail.find(storage.get_atom_uuid(atom))
    return None if detail is None else detail.failure


def apply(runtime: Runtime, repair: Repair) -> list[str]:
    """Make ``repair`` in the stored flow (before its engine runs it); return the atoms it
    changed. The engine's storage writes every change through."""
    storage, compilation = runtime.storage, runtime.compilation
    check(storage, compilation, repair)
    if repair.action == RETRY_REVERTS:
        changed = [a.name for a in compilation.iter_atoms()
                   if storage.get_atom_state(a.name) == states.REVERT_FAILURE]
    elif repair.action == MARK_REVERTED:
        assert repair.atom is not None
        changed = [repair.atom]
        kept = _meta(storage, repair.atom).get(META_REVERT_INPUT)
        storage.save(repair.atom, None, states.REVERTED,
                     meta={META_REVERT_INPUT: None} if kept else None)
    else:
        changed = _run_on_from(runtime, repair.atom or "")
    record = repair.record(changed)
    for name in changed:
        earlier = list(_meta(storage, name).get(META_REPAIRS) or [])
        storage.update_atom_metadata(name, {META_REPAIRS: [*earlier, record]})
    earlier = list(storage.flow_meta.get(META_REPAIRS) or [])
    storage.update_flow_metadata({META_REPAIRS: [*earlier, record]})
    LOG.info("Flow %r (%s) repaired: %s (atoms: %s)", storage.flow_name, storage.flow_uuid,
             repair, ", ".join(changed) or "none")
    return changed


def _meta(storage: Storage, atom: str) -> dict[str, Any]:
    detail = storage.flow_detail.find(storage.get_atom_uuid(atom))
    return detail.meta if detail is not None else {}


def _run_on_from(runtime: Runtime, name: str) -> list[str]:
    """Put ``name`` and all after it back to PENDING, and every atom not undone back to its
    result; the flow's earlier cancel and deadline are dropped (a new run of it)."""
    storage, compilation = runtime.storage, runtime.compilation
    start = compilation.atoms[name]
    after = {start} | {node for node in nx.descendants(compilation.execution_graph, start)
                       if isinstance(node, Atom)}
    again = [atom for atom in compilation.iter_atoms()
             if atom in after or storage.get_atom_state(atom.name) != states.SUCCESS]
    kept = [atom for atom in compilation.iter_atoms() if atom not in again]
    runtime.reset_atoms(again, states.PENDING, states.EXECUTE, force=True)
    runtime.reset_atoms(kept, None, states.EXECUTE)
    for key in (META_CANCELLED, META_DEADLINE):
        storage.flow_meta.pop(key, None)
    if storage.get_flow_state() == states.REVERTED:
        storage.set_flow_state(states.PENDING)  # a reverted flow runs again from its atoms
    return [atom.name for atom in again]


# -- repairing a stored flow ------------------------------------------------------------------


def repair_stored(backend: Backend, flow_uuid: str, action: str, atom: str | None = None,
                  reason: str | None = None, by: str = "engines.repair",
                  board: ClaimBoard[J] | None = None,
                  flow: flow_base.Flow | Atom | None = None,
                  engine: str = "serial", **options: Any) -> ActionEngine:
    """Repair a stored flow and run it to its end, in this process; return the engine.

    The flow is rebuilt from its stored factory unless ``flow`` is given; the engine runs it
    with ``options`` (a worker-based one needs its broker options and workers). What the run
    ends in is stored (``engine.storage.get_flow_state()``); its failure is logged, not raised.

    Raises:
        RepairRefused: an engine or conductor holds the flow (its host and pid named), or the
            repair does not fit the flow's state.
        ValueError: a bad repair (see :meth:`Repair.now`).
    """
    from flowengine import engines

    request = Repair.now(action, atom, reason, by)
    with contextlib.closing(backend.get_connection()) as conn:
        fd = conn.get_flow_details(flow_uuid)
    held = holder(fd.meta, fd.uuid, board)
    if held is not None:
        raise RepairRefused(f"flow {fd.name!r} ({fd.uuid}) is held by {held}: it cannot be "
                            f"repaired while it runs")
    if flow is None:
        flow = engines.flow_from_detail(fd)
    loaded = engines.load(flow, flow_detail=fd, backend=backend, engine=engine, **options)
    loaded.repair(request.action, request.atom, request.reason, request.by)
    try:
        loaded.run()
    except Exception as err:  # the flow's own outcome is stored and shown
        LOG.info("Repaired flow %s ended %s: %s", fd.uuid, loaded.storage.get_flow_state(),
                 err)
    return loaded


def retry_reverts(backend: Backend, flow_uuid: str, reason: str | None = None,
                  by: str = "engines.repair", **kwargs: Any) -> ActionEngine:
    """Run a flow's failed reverts again, then its remaining ones (see :func:`repair_stored`)."""
    return repair_stored(backend, flow_uuid, RETRY_REVERTS, None, reason, by, **kwargs)


def mark_reverted(backend: Backend, flow_uuid: str, atom: str, reason: str,
                  by: str = "engines.repair", **kwargs: Any) -> ActionEngine:
    """Store ``atom`` as reverted on an operator's word, then run the remaining reverts (see
    :func:`repair_stored`)."""
    return repair_stored(backend, flow_uuid, MARK_REVERTED, atom, reason, by, **kwargs)


def retry_from(backend: Backend, flow_uuid: str, atom: str, reason: str | None = None,
               by: str = "engines.repair", **kwargs: Any) -> ActionEngine:
    """Run a flow on from ``atom``, whose execute failed (see :func:`repair_stored`)."""
    return repair_stored(backend, flow_uuid, RETRY_FROM, atom, reason, by, **kwargs)
