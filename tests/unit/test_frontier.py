"""Readiness counters: what can run or revert next."""

from __future__ import annotations

from flowengine import states, task
from flowengine.engines.compiler import PatternCompiler
from flowengine.engines.frontier import Frontier
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf


class Noop(task.Task):
    def execute(self) -> None:
        return None


def _frontier(flow: object, **state: str) -> tuple[Frontier, dict]:
    compilation = PatternCompiler(flow).compile()
    atom_states = {name: state.get(name, states.PENDING) for name in compilation.atoms}
    return Frontier(compilation, atom_states), compilation.atoms


def test_only_the_first_atom_of_a_linear_flow_is_ready() -> None:
    frontier, atoms = _frontier(lf.Flow("f").add(Noop("a"), Noop("b")))
    assert frontier.preds_done(atoms["a"])
    assert not frontier.preds_done(atoms["b"])
    frontier.state_changed(atoms["a"], states.SUCCESS)
    assert frontier.preds_done(atoms["b"])
    assert atoms["b"] in frontier.take_candidates()


def test_a_wide_flow_unblocks_its_successor_only_when_all_finish() -> None:
    wide = uf.Flow("u").add(*[Noop(f"w{i}") for i in range(5)])
    frontier, atoms = _frontier(lf.Flow("f").add(wide, Noop("after")))
    for i in range(4):
        frontier.state_changed(atoms[f"w{i}"], states.SUCCESS)
        assert not frontier.preds_done(atoms["after"])
    frontier.state_changed(atoms["w4"], states.IGNORE)
    assert frontier.preds_done(atoms["after"])
    # Going back (a retry resets an atom) blocks the successor again.
    frontier.state_changed(atoms["w0"], states.PENDING)
    assert not frontier.preds_done(atoms["after"])


def test_revert_waits_for_successors_to_be_undone() -> None:
    frontier, atoms = _frontier(lf.Flow("f").add(Noop("a"), Noop("b")),
                                a=states.SUCCESS, b=states.SUCCESS)
    assert not frontier.succs_undone(atoms["a"])
    assert frontier.succs_undone(atoms["b"])
    frontier.state_changed(atoms["b"], states.REVERTING)
    assert not frontier.succs_undone(atoms["a"])
    frontier.state_changed(atoms["b"], states.REVERTED)
    assert frontier.succs_undone(atoms["a"])


def test_counters_start_from_stored_states() -> None:
    frontier, atoms = _frontier(lf.Flow("f").add(Noop("a"), Noop("b"), Noop("c")),
                                a=states.SUCCESS, b=states.SUCCESS)
    assert frontier.preds_done(atoms["c"])
    assert not frontier.succs_undone(atoms["a"])


def test_revert_waits_for_what_ran_behind_an_ignored_atom() -> None:
    # a -> b (ignored by a decider) -> c: c ran, so a reverts only once c has (TaskFlow waits
    # for every descendant, not only the direct successors).
    flow = lf.Flow("f").add(Noop("a"), Noop("b"), Noop("c"))
    frontier, atoms = _frontier(flow, a=states.SUCCESS, b=states.IGNORE, c=states.FAILURE)
    assert not frontier.succs_undone(atoms["a"])
    frontier.state_changed(atoms["c"], states.REVERTING)
    assert not frontier.succs_undone(atoms["a"])
    frontier.state_changed(atoms["c"], states.REVERTED)
    assert frontier.succs_undone(atoms["a"])
    # Run again (a retry): c no longer counts as undone, so neither does b for a.
    frontier.state_changed(atoms["c"], states.RUNNING)
    assert not frontier.succs_undone(atoms["a"])
