"""A request a consumer took and never started, when that consumer is killed, still runs once.

The worker is busy (one thread, held by a gated task), so a bare kombu consumer (a "thief"
process) takes the flow's next request and never settles it; the test kills it with SIGKILL.
RabbitMQ hands the request back at once (the connection closed). Redis hands it back once it
has been unsettled for the consumers' ``visibility_timeout`` (shortened here through the
transport options, as an operator would). Either way the worker that receives it again hands it
back to the engine, which sends it again, and the task runs exactly once. Where the engine lets
short tasks start quietly (RabbitMQ, by default), a short task says nothing before its outcome,
so the engine cannot tell a request its taker never started from one that killed its taker at
once: the lost attempt counts, once its taker fails to prove it is alive. Elsewhere every task
says RUNNING first, so a request handed back without one never started, and is sent again
free.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from typing import Any

import fault_tasks as ft
import pytest
from fault_support import WAIT, EngineRuns, Stage, logs
from wbe_harness import Broker, ProtocolClient, request_body, subprocess_env

from flowengine import engines, states
from flowengine.flows import linear_flow as lf

pytestmark = pytest.mark.integration

TOPIC = "stranded"
#: Redis: hand out again what a consumer left unsettled this long, and look every poll.
REDIS_OPTIONS = {"visibility_timeout": 2, "unacked_restore_throttle": 1}

THIEF = r"""
import sys

import kombu

import flowengine.worker_based.broker.transport_beanstalk  # registers beanstalk:// with kombu

url, queue_name = sys.argv[1], sys.argv[2]
with kombu.Connection(url) as conn:
    queue = kombu.Queue(queue_name, no_declare=True)

    def took(_body, message):
        if message.properties.get("type") != "REQUEST":
            message.ack()  # discovery queries go to the topic too
            return
        print(message.properties["correlation_id"], flush=True)  # and never settle it

    with conn.Consumer([queue], callbacks=[took], prefetch_count=1,
                       accept=["application/json"]):
        print("ready", flush=True)
        while True:
            conn.drain_events()
"""


def test_a_request_whose_taker_died_unstarted_runs_once(
    broker: Broker, exchange: str, fleet_factory: Any, stage: Stage, runs: EngineRuns,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.INFO, logger="flowengine.worker_based")
    options = REDIS_OPTIONS if broker.name == "redis" else {}
    fleet = fleet_factory(broker, exchange, env=stage.env, worker_args=[
        arg for key, value in options.items() for arg in ("--transport-option", f"{key}={value}")])
    [worker] = fleet.start(TOPIC, [ft.__name__], threads=1)
    client = ProtocolClient(broker.url, exchange)
    thief = None
    try:
        client.publish(TOPIC, request_body(f"{ft.__name__}.Gate", "blocker"))
        stage.ledger.wait_for("blocker", ft.EXECUTE_START)  # the worker's one slot is taken
        thief = subprocess.Popen(
            [sys.executable, "-c", THIEF, broker.url, f"{exchange}_{TOPIC}"],
            stdout=subprocess.PIPE, text=True, env=subprocess_env())
        assert thief.stdout is not None and thief.stdout.readline().strip() == "ready"

        flow = lf.Flow("stranded").add(ft.Step("stranded"))
        engine = engines.load(flow, engine="worker-based", **fleet.engine_options(
            TOPIC, transition_timeout=WAIT, transport_options=options))
        run = runs.start(engine)
        taken = thief.stdout.readline().strip()
        assert taken, "the thief took nothing"
        thief.send_signal(signal.SIGKILL)
        thief.wait(WAIT)
        killed_at = time.time()
        stage.gates.open("blocker")

        assert run.join(WAIT * 2, details=lambda: logs([worker])) is None
        assert engine.storage.get_flow_state() == states.SUCCESS
        [start] = stage.ledger.starts("stranded")
        assert start["pid"] == worker.pid
        # The attempt the thief took came back and was sent again. With quiet starts nothing
        # said it had not started (a short task says nothing before its outcome), so it cost
        # an attempt; without, no RUNNING reply means it never started.
        said = ("is lost: the broker redelivered it" if engine.worker_executor.quiet_starts
                else "never started: the broker redelivered it")
        assert any(taken in m and said in m
                   for m in (r.getMessage() for r in caplog.records)), caplog.text
        print(f"\n[{broker}] taken by a consumer killed unstarted -> ran "
              f"{start['t'] - killed_at:.3f}s after the kill")
    finally:
        if thief is not None and thief.poll() is None:
            thief.kill()
            thief.wait(WAIT)
        stage.gates.open("blocker")
        client.close()
