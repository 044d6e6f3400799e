"""The judge of a run's compensation, one check at a time, over hand-written ledger lines."""

from __future__ import annotations

from typing import Any

from flowengine.testing import judge
from flowengine.testing import ledger as lg


class Lines:
    """Writes a run's ledger lines the way the kit's interceptor does."""

    def __init__(self) -> None:
        self.ledger = lg.MemoryLedger()
        self._ids = 0

    def call(self, atom: str, action: str, outcome: str = lg.RETURNED, repeat: bool = False,
             after_failure: bool = False, effects: tuple[tuple[str, Any, Any], ...] = ()) -> None:
        self._ids += 1
        call = str(self._ids)
        self.ledger.append(lg.CALL, atom=atom, action=action, call=call, repeat=repeat,
                           after_failure=after_failure)
        for key, before, after in effects:
            self.ledger.append(lg.EFFECT, atom=atom, action=action, call=call, op="put",
                               key=key, before=before, after=after)
        self.ledger.append(lg.RETURN, atom=atom, action=action, call=call, outcome=outcome,
                           repeat=repeat)

    def fault(self, atom: str, action: str) -> None:
        self.ledger.append(lg.FAULT, atom=atom, action=action, outcome=lg.FAILED)

    def judge(self, **options: Any) -> list[tuple[str, str]]:
        return [(f.atom, f.check)
                for f in judge.compensation(self.ledger.entries(), **options)]


def test_a_clean_compensation_has_no_finding() -> None:
    lines = Lines()
    lines.call("a", "execute")
    lines.call("b", "execute")
    lines.fault("c", "execute")
    lines.call("c", "revert", after_failure=True)
    lines.call("b", "revert")
    lines.call("a", "revert")
    assert lines.judge(dependencies=[("a", "b"), ("b", "c"), ("a", "c")]) == []


def test_a_completed_execute_never_reverted_is_found() -> None:
    lines = Lines()
    lines.call("a", "execute")
    lines.fault("b", "execute")
    assert lines.judge() == [("a", judge.NOT_REVERTED)]
    assert lines.judge(all_reverted=False) == []  # a revert failed: the engine stopped


def test_a_second_revert_of_one_execute_is_found() -> None:
    lines = Lines()
    lines.call("a", "execute")
    lines.call("a", "revert")
    lines.call("a", "revert")
    assert lines.judge() == [("a", judge.REVERTED_TWICE)]


def test_reverting_what_something_depends_on_first_is_found() -> None:
    lines = Lines()
    lines.call("a", "execute")
    lines.call("b", "execute")
    lines.call("a", "revert")
    lines.call("b", "revert")
    assert lines.judge(dependencies=[("a", "b")]) == [("a", judge.ORDER)]


def test_a_revert_with_no_execute_tried_is_found_unless_the_atom_takes_it() -> None:
    lines = Lines()
    lines.call("a", "revert")
    assert lines.judge() == [("a", judge.WITHOUT_EXECUTE)]
    assert lines.judge(tolerant=frozenset({"a"})) == []


def test_a_revert_that_changes_things_its_failed_execute_never_did_is_found() -> None:
    lines = Lines()
    lines.fault("a", "execute")
    lines.call("a", "revert", after_failure=True, effects=(("free", 1, 2),))
    assert lines.judge() == [("a", judge.ASSUMES_EXECUTE)]
    assert lines.judge(tolerant=frozenset({"a"})) == []


def test_a_repeated_revert_that_changes_things_again_is_not_idempotent() -> None:
    lines = Lines()
    lines.call("a", "execute")
    lines.call("a", "revert", effects=(("balance", 0, 100),))
    lines.call("a", "revert", repeat=True, effects=(("balance", 100, 200),))
    found = judge.compensation(lines.ledger.entries())
    assert [(f.atom, f.check) for f in found] == [("a", judge.NOT_IDEMPOTENT)]
    assert "changed balance from 100 to 200" in found[0].message


def test_a_repeated_revert_that_raises_is_not_idempotent() -> None:
    lines = Lines()
    lines.call("a", "execute")
    lines.call("a", "revert")
    lines.call("a", "revert", repeat=True, outcome=lg.RAISED)
    assert lines.judge() == [("a", judge.NOT_IDEMPOTENT)]


def test_a_repeated_revert_that_changes_nothing_is_idempotent() -> None:
    lines = Lines()
    lines.call("a", "execute")
    lines.call("a", "revert", effects=(("seat", "held", None),))
    lines.call("a", "revert", repeat=True, effects=(("seat", None, None),))
    assert lines.judge() == []


def test_a_retried_atom_owes_one_revert_per_execute() -> None:
    lines = Lines()
    lines.call("a", "execute")
    lines.call("a", "revert")
    lines.call("a", "execute")
    lines.call("a", "revert")
    assert lines.judge() == []
