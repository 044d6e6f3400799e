"""Judging a run's compensation from its ledger lines.

What a flow promises when it fails is that the work it completed is undone, once, in the right
order, and that undoing is safe. :func:`compensation` checks it over the lines of one run:

- every completed ``execute`` is reverted exactly once (:data:`NOT_REVERTED`,
  :data:`REVERTED_TWICE`);
- an atom is reverted before the atoms it depends on (:data:`ORDER`);
- no atom is reverted without any ``execute`` of it tried (:data:`WITHOUT_EXECUTE`);
- a revert whose ``execute`` never completed (its ``result`` is a failure) leaves the observed
  world as it was (:data:`ASSUMES_EXECUTE`): there is nothing of its own to undo;
- a revert made twice (``revert_twice``) has the outcome of one: its second call changes
  nothing and does not fail (:data:`NOT_IDEMPOTENT`).

An atom marked tolerant (:func:`flowengine.testing.reverts_without_execute`) may be reverted
without its execute, and change things then. ``flowengine rehearse`` and
:meth:`~flowengine.testing.ledger.Ledger.assert_compensated` both judge with this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flowengine.testing.ledger import Entry

NOT_REVERTED = "not reverted"
REVERTED_TWICE = "reverted twice"
ORDER = "revert order"
WITHOUT_EXECUTE = "revert without execute"
ASSUMES_EXECUTE = "revert assumes its execute ran"
NOT_IDEMPOTENT = "revert not idempotent"

#: ``(earlier, later)`` atom pairs: ``later`` depends on ``earlier``, so it is reverted first.
Dependencies = Iterable[tuple[str, str]]


@dataclasses.dataclass(frozen=True)
class Finding:
    """Something a run's compensation got wrong.

    Attributes:
        atom: The atom at fault.
        check: Which check it fails (:data:`NOT_REVERTED`, :data:`ORDER`...).
        message: What happened, naming what it changed.
    """

    atom: str
    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.atom}: {self.check}: {self.message}"


@dataclasses.dataclass
class _Atom:
    owed: bool = False  # an execute completed and is not reverted yet
    tried: bool = False  # an execute was tried since the last revert
    reverted_since: int = 0  # reverts since the last execute tried
    last_revert: int | None = None  # seq of its latest (first-made) revert
    first_call: dict[str, str] = dataclasses.field(default_factory=dict)


def compensation(entries: Sequence[Entry], dependencies: Dependencies = (),
                 tolerant: frozenset[str] = frozenset(),
                 all_reverted: bool = True) -> list[Finding]:
    """The findings over one run's ledger lines (none: the compensation holds).

    Args:
        entries: The run's lines, oldest first.
        dependencies: ``(earlier, later)`` pairs for the order check.
        tolerant: Atoms whose revert may run without their execute, and change things.
        all_reverted: Whether every completed execute had to be reverted (the flow ended
            REVERTED); False when a revert failed and the engine stopped undoing.
    """
    from flowengine.testing import ledger as lg

    atoms: dict[str, _Atom] = {}
    findings: list[Finding] = []
    # Per revert call (by call id): the atom, whether it is a repeat, whether it came after a
    # failed execute; effects and returns are judged against it.
    reverts: dict[str, tuple[str, bool, bool]] = {}
    first_outcome: dict[str, str] = {}  # atom -> how its latest first-made revert ended
    for entry in entries:
        name = entry.atom
        if name is None:
            continue
        atom = atoms.setdefault(name, _Atom())
        if entry.action == "execute" and entry.kind in (lg.CALL, lg.FAULT):
            atom.tried, atom.reverted_since = True, 0
        elif entry.kind == lg.RETURN and entry.action == "execute":
            if entry.outcome == lg.RETURNED:
                atom.owed = True
        elif entry.kind == lg.CALL and entry.action == "revert":
            if entry.call is not None:
                reverts[entry.call] = (name, entry.repeat, entry.after_failure)
            if entry.repeat:
                continue
            if not atom.tried and name not in tolerant:
                findings.append(Finding(name, WITHOUT_EXECUTE,
                                        "reverted, though no execute of it was ever tried"))
            elif atom.reverted_since >= 1 and not atom.owed:
                findings.append(Finding(name, REVERTED_TWICE,
                                        f"reverted {atom.reverted_since + 1} times for one "
                                        f"execute"))
            atom.reverted_since += 1
            atom.owed = False
            atom.last_revert = entry.seq
        elif entry.kind == lg.FAULT and entry.action == "revert":
            atom.reverted_since += 1  # the injected revert failure stands for a revert
            atom.owed = False
        elif entry.kind == lg.RETURN and entry.action == "revert" and entry.call in reverts:
            _, repeat, _ = reverts[entry.call]
            if not repeat:
                first_outcome[name] = entry.outcome or ""
            elif entry.outcome == lg.RAISED and first_outcome.get(name) == lg.RETURNED:
                findings.append(Finding(name, NOT_IDEMPOTENT,
                                        f"its second revert raised {entry.error}, the first "
                                        f"did not"))
        elif entry.kind == lg.EFFECT and entry.changed and entry.call in reverts:
            owner, repeat, after_failure = reverts[entry.call]
            if repeat:
                findings.append(Finding(owner, NOT_IDEMPOTENT,
                                        f"its second revert changed {entry.key} from "
                                        f"{entry.before!r} to {entry.after!r}"))
            elif after_failure and owner not in tolerant:
                findings.append(Finding(owner, ASSUMES_EXECUTE,
                                        f"its execute never completed, yet its revert changed "
                                        f"{entry.key} from {entry.before!r} to "
                                        f"{entry.after!r}"))
    if all_reverted:
        findings += [Finding(name, NOT_REVERTED, "its execute completed and was never reverted")
                     for name, atom in atoms.items() if atom.owed]
    for earlier, later in dependencies:
        first, then = atoms.get(earlier), atoms.get(later)
        if (first is not None and then is not None and first.last_revert is not None
                and then.last_revert is not None and first.last_revert < then.last_revert):
            findings.append(Finding(earlier, ORDER,
                                    f"reverted before {later}, which depends on it"))
    return findings
