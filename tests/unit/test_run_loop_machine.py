"""The run loop follows the frozen automaton machine through a transition table."""

from __future__ import annotations

import pytest
from automaton import exceptions as machine_errors

from flowengine import engines, states, task
from flowengine.engines import machine
from flowengine.flows import linear_flow


class Noop(task.Task):
    def execute(self) -> None:
        return None


def test_the_table_holds_exactly_the_machines_transitions() -> None:
    assert sorted(machine._NEXT.items()) == sorted(
        ((start, event), end) for start, event, end in machine.MACHINE)
    assert machine._TERMINAL == {states.SUCCESS, states.REVERTED, states.FAILURE,
                                 states.SUSPENDED}
    # Every state that is not an end has its handler.
    assert set(machine._HANDLERS) == set(machine.MACHINE.states) - machine._TERMINAL - {
        states.UNDEFINED}


def test_an_event_a_state_does_not_take_is_an_error_naming_both() -> None:
    with pytest.raises(machine_errors.NotFound, match="'WAITING'.*'completed'"):
        machine._next_state(states.WAITING, machine.FINISH)


def test_a_run_walks_the_table_from_start_to_success() -> None:
    flow = linear_flow.Flow("two").add(Noop("a"), Noop("b"))
    seen = list(engines.load(flow, engine="serial").run_iter())
    # run_iter hides the loop's own GAME_OVER, which every end state is reached from.
    path = [states.UNDEFINED, *seen[:-1], states.GAME_OVER, seen[-1]]
    allowed = {(start, end) for (start, _event), end in machine._NEXT.items()}
    assert seen[0] == states.RESUMING and seen[-1] == states.SUCCESS
    assert [pair for pair in zip(path, path[1:]) if pair not in allowed] == []
