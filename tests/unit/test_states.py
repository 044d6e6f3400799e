"""Tests for flowengine.states."""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable

import pytest

from flowengine import exceptions as exc
from flowengine import states as st

ALL_STATES = sorted(st.FLOW_STATES | st.RETRY_STATES | st.JOB_STATES | st.ENGINE_STATES)


def test_constant_values_are_their_names() -> None:
    for name in ("PENDING", "RUNNING", "SUCCESS", "FAILURE", "REVERTING", "REVERTED",
                 "REVERT_FAILURE", "SUSPENDING", "SUSPENDED", "RESUMING", "RETRYING", "IGNORE",
                 "CLAIMED", "COMPLETE", "UNCLAIMED", "EXECUTE", "REVERT", "RETRY",
                 "SCHEDULING", "WAITING", "ANALYZING", "UNDEFINED", "GAME_OVER"):
        assert getattr(st, name) == name
    assert st.INTENTIONS == ("EXECUTE", "IGNORE", "REVERT", "RETRY")


def test_tables_are_frozen() -> None:
    for table in (st.ALLOWED_FLOW_TRANSITIONS, st.IGNORED_FLOW_TRANSITIONS,
                  st.ALLOWED_TASK_TRANSITIONS, st.ALLOWED_RETRY_TRANSITIONS,
                  st.ALLOWED_JOB_TRANSITIONS, st.ATOM_FINISHED_STATES):
        assert isinstance(table, frozenset)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (st.PENDING, st.RUNNING, True),
        (st.RUNNING, st.SUSPENDING, True),
        (st.SUSPENDING, st.SUCCESS, True),
        (st.SUCCESS, st.RUNNING, True),
        (st.RESUMING, st.SUSPENDED, True),
        (st.RUNNING, st.RUNNING, False),
        (st.SUCCESS, st.SUSPENDING, False),  # suspend after the end: ignored
        (st.REVERTED, st.RESUMING, False),
    ],
)
def test_flow_transitions(old: str, new: str, expected: bool) -> None:
    assert st.check_flow_transition(old, new) is expected


def test_forbidden_flow_transition_names_both_states() -> None:
    with pytest.raises(exc.InvalidState, match="'SUCCESS' to 'REVERTED'"):
        st.check_flow_transition(st.SUCCESS, st.REVERTED)
    with pytest.raises(exc.InvalidState, match="Flow"):
        st.check_flow_transition(st.PENDING, st.SUCCESS)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (st.PENDING, st.RUNNING, True),
        (st.PENDING, st.IGNORE, True),
        (st.REVERTING, st.REVERT_FAILURE, True),
        (st.IGNORE, st.PENDING, True),
        (st.SUCCESS, st.RETRYING, False),
        (st.RUNNING, st.RUNNING, False),
        (st.REVERT_FAILURE, st.PENDING, False),
        (st.PENDING, st.SUCCESS, False),
    ],
)
def test_task_transitions(old: str, new: str, expected: bool) -> None:
    assert st.check_task_transition(old, new) is expected


def test_retry_adds_retrying() -> None:
    assert st.check_retry_transition(st.SUCCESS, st.RETRYING)
    assert st.check_retry_transition(st.RETRYING, st.RUNNING)
    assert st.check_retry_transition(st.REVERTING, st.REVERTED)
    assert not st.check_retry_transition(st.RETRYING, st.SUCCESS)
    assert st.ALLOWED_RETRY_TRANSITIONS - st.ALLOWED_TASK_TRANSITIONS == {
        (st.SUCCESS, st.RETRYING),
        (st.RETRYING, st.RUNNING),
    }


def test_job_transitions() -> None:
    assert st.check_job_transition(st.UNCLAIMED, st.CLAIMED)
    assert st.check_job_transition(st.CLAIMED, st.COMPLETE)
    assert st.check_job_transition(st.CLAIMED, st.UNCLAIMED)
    assert st.check_job_transition(st.CLAIMED, st.CLAIMED) is False
    with pytest.raises(exc.InvalidState, match="Job transition from 'COMPLETE' to 'CLAIMED'"):
        st.check_job_transition(st.COMPLETE, st.CLAIMED)


def _outcome(check: Callable[[str, str], bool], old: str, new: str) -> object:
    try:
        return check(old, new)
    except Exception as err:
        # Compared by name: ours and TaskFlow's InvalidState are different classes.
        return type(err).__name__


@pytest.mark.parametrize(
    "name",
    ["check_flow_transition", "check_task_transition", "check_retry_transition",
     "check_job_transition"],
)
def test_every_pair_matches_taskflow(name: str) -> None:
    tf_states = importlib.import_module("taskflow.states")  # a test dependency
    ours, theirs = getattr(st, name), getattr(tf_states, name)
    for old, new in itertools.product(ALL_STATES, repeat=2):
        assert _outcome(ours, old, new) == _outcome(theirs, old, new), (old, new)


def test_finished_and_active_atom_states_partition_the_non_pending_states() -> None:
    assert st.ATOM_ACTIVE_STATES.isdisjoint(st.ATOM_FINISHED_STATES)
    assert st.ATOM_ACTIVE_STATES | st.ATOM_FINISHED_STATES | {st.PENDING} == st.RETRY_STATES
