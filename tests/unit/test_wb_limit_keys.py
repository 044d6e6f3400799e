"""Which limits a worker's request counts against, and how ``--limit`` is read."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from flowengine.cli.main import cli
from flowengine.cli.worker import parse_limit_options
from flowengine.worker_based.worker_side.limits import WorkerLimits, waiting_event


def test_a_request_counts_against_its_class_and_the_topic() -> None:
    limits = WorkerLimits({"topic": 5, "RebootHost": 3, "ops.tasks.Drain": 2}, "hosts", "redis://x")
    assert limits.keys("ops.tasks.RebootHost") == [("RebootHost", 3), ("topic:hosts", 5)]
    assert limits.keys("ops.tasks.Drain") == [("ops.tasks.Drain", 2), ("topic:hosts", 5)]
    assert limits.keys("other.Drain") == [("topic:hosts", 5)]


def test_limits_need_a_coordination_service_and_whole_numbers() -> None:
    with pytest.raises(ValueError, match="limits need a coordination service"):
        WorkerLimits({"RebootHost": 3}, "hosts", None)
    with pytest.raises(ValueError, match=r"Worker limits: 'RebootHost' must map to a whole "
                                         r"number >= 1, not 0"):
        WorkerLimits({"RebootHost": 0}, "hosts", "redis://x")
    assert WorkerLimits(None, "hosts", None).limits == {}


def test_limit_options_are_read() -> None:
    assert parse_limit_options(("3", "RebootHost=2")) == {"topic": 3, "RebootHost": 2}
    for bad in ("0", "RebootHost=", "a=b=1", "x"):
        with pytest.raises(click.BadParameter, match=r"is not \[CLASS=\]N"):
            parse_limit_options((bad,))


def test_a_worker_limit_without_a_coordination_service_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["worker", "--topic", "t", "--task", "x:Y", "--limit", "3"])
    assert result.exit_code == 2
    assert "--limit needs --coordination" in result.output


def test_what_a_waiting_request_tells_its_engine() -> None:
    assert waiting_event({"key": "RebootHost"}) == {"progress": 0.0,
                                                    "waiting_for": {"key": "RebootHost"}}
    assert waiting_event(None) == {"progress": 0.0, "waiting_for": None}
