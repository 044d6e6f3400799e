"""Pausing a topic: the PAUSE message, a worker's pause state (injected clock), the commands.

Real worker processes paused and resumed on each broker: tests/integration/test_topic_pause.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from manual_clock import ManualClock  # tests/ is on sys.path (rootdir conftest)

from flowengine import exceptions as exc
from flowengine.cli.main import cli
from flowengine.cli.workers import WorkerTable
from flowengine.worker_based import pause as ps


def test_a_pause_message_is_validated() -> None:
    ps.Pause.validate(ps.Pause("t", True, 2.5).to_dict())
    ps.Pause.validate(ps.Pause("t", False).to_dict())
    for bad in ({"topic": "t"}, {"topic": "", "paused": True},
                {"topic": "t", "paused": True, "seconds": 0},
                {"topic": "t", "paused": True, "seconds": ps.MAX_SECONDS + 1},
                {"topic": "t", "paused": "yes"}, {"topic": "t", "paused": True, "x": 1}):
        with pytest.raises(exc.InvalidFormat, match="Pause message data"):
            ps.Pause.validate(bad)


def test_a_pause_for_seconds_ends_by_itself_and_says_so() -> None:
    clock, changes = ManualClock(), []
    state = ps.PauseState(lambda *change: changes.append(change), clock=clock)
    assert not state.paused and state.remaining is None
    state.set(True, 10.0)
    assert state.paused and state.remaining == 10.0
    clock.advance(9.5)
    assert state.paused and state.remaining == 0.5
    clock.advance(0.5)
    assert not state.paused and state.remaining is None
    assert changes == [(True, 10.0), (False, None)]


def test_a_pause_without_seconds_lasts_until_resumed() -> None:
    clock, changes = ManualClock(), []
    state = ps.PauseState(lambda *change: changes.append(change), clock=clock)
    state.set(False)  # not paused: nothing changes, nothing is announced
    state.set(True)
    clock.advance(10 * ps.MAX_SECONDS)
    assert state.paused and state.remaining is None
    state.set(True, 5.0)  # paused again, now for a while: announced again
    state.set(False)
    assert not state.paused
    assert changes == [(True, None), (True, 5.0), (False, None)]


def test_workers_table_shows_pause_events_and_heartbeats() -> None:
    table = WorkerTable()
    beat: dict[str, Any] = {"type": "worker-heartbeat", "worker": "w1", "topic": "t",
                            "paused": False, "timestamp": 1.0}
    table.on_event(beat)
    assert table.live()[0]["paused"] is False
    table.on_event({"type": "topic-paused", "worker": "w1", "topic": "t", "seconds": None})
    assert table.live()[0]["paused"] is True
    table.on_event({"type": "topic-resumed", "worker": "w1", "topic": "t"})
    assert table.live()[0]["paused"] is False


def test_topics_commands_refuse_bad_input() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["topics", "pause", "t", "--for", "0"])
    assert result.exit_code == 2 and "--for" in result.output
    result = runner.invoke(cli, ["topics", "pause"])
    assert result.exit_code == 2 and "TOPIC" in result.output
    result = runner.invoke(cli, ["topics", "pause", "t", "--taskflow-compat"])
    assert result.exit_code == 2 and "TaskFlow workers" in result.output
    help_text = runner.invoke(cli, ["topics", "--help"]).output
    assert "pause" in help_text and "resume" in help_text and "list" in help_text
