"""A dead letter: parked without its secret, with an expiry, and not re-sent once its flow ended.

A task takes an API token from a ``Secret`` store value and hangs on worker A. Worker B joins,
then A stops at once (no grace): the engine loses the attempt, and with ``max_attempts=1`` the
atom fails with ``WorkerLost``, the request is parked as a dead letter and the flow reverts on
B. The letter lists which secret arguments were removed and when it expires; requeueing it is
refused twice over: the flow has finished (nothing would record the outcome), and the token is
gone. The same checks run in ``flowengine dead-letters requeue ID --backend URI`` (``--force``,
``--resume``) and in the dashboard. Kombu's in-memory transport stands in for a broker.

Run: python examples/wbe_dead_letters.py
"""

from __future__ import annotations

import contextlib
import datetime
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from flowengine import engines, task
from flowengine.flows import linear_flow
from flowengine.persistence import backends
from flowengine.secrets import Secret
from flowengine.worker_based import requeue_rules
from flowengine.worker_based.dead_letter_keeping import RequeueRefused
from flowengine.worker_based.dead_letters import DeadLetters
from flowengine.worker_based.worker import Worker

EXCHANGE = "wbe-dead-letters"
TOPIC = "provisioning"
TRANSPORT = "memory"
#: Set once the example is done with the hanging task (so worker A's thread can end).
RELEASE = threading.Event()
STARTED = threading.Event()


class Provision(task.Task):
    """Calls a cloud API with a token; on worker A it hangs."""

    def execute(self, api_token: str) -> str:
        STARTED.set()
        RELEASE.wait(30)
        return "server-1"

    def revert(self, api_token: str, **kwargs: Any) -> None:
        print("provision: reverted")


@contextlib.contextmanager
def serving(name: str) -> Iterator[Worker]:
    worker = Worker(exchange=EXCHANGE, topic=TOPIC, tasks=[Provision], threads_count=1,
                    transport=TRANSPORT)
    thread = threading.Thread(target=worker.run, kwargs={"display_banner": False}, daemon=True)
    thread.start()
    if not worker.wait(timeout=10):
        raise RuntimeError(f"worker {name} did not start consuming within 10s")
    try:
        yield worker
    finally:
        worker.stop(grace=0)
        thread.join(timeout=10)


def iso(when: float | None) -> str:
    return "-" if when is None else datetime.datetime.fromtimestamp(
        when, datetime.UTC).isoformat(timespec="seconds")


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        backend = backends.fetch(f"sqlite:///{folder}/flows.db")
        with contextlib.closing(backend.get_connection()) as conn:
            conn.upgrade()
        engine = engines.load(
            linear_flow.Flow("provision-server").add(Provision("provision")),
            engine="worker-based", backend=backend, exchange=EXCHANGE, topics=[TOPIC],
            transport=TRANSPORT, max_attempts=1, dead_letter_ttl=7 * 24 * 3600,
            store={"api_token": Secret("tok-3f9a-never-shown")})
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                engine.run()
                outcome.append(None)
            except Exception as err:
                outcome.append(err)

        with serving("worker-a") as worker_a:
            running = threading.Thread(target=run, daemon=True)
            running.start()
            if not STARTED.wait(10):
                raise RuntimeError("the task did not start on worker A within 10s")
            with serving("worker-b"):
                worker_a.stop(grace=0)  # A goes offline holding the request
                running.join(timeout=30)
        RELEASE.set()
        print(f"flow: {engine.storage.get_flow_state()} ({type(outcome[0]).__name__})")

        letters = DeadLetters(EXCHANGE, transport=TRANSPORT)
        try:
            [letter] = letters.list()
            print(f"dead letter: task {letter.task_name}, reason: {letter.reason[:45]}...")
            print(f"secret arguments removed: {', '.join(letter.removed_arguments)}")
            print(f"expires: {iso(letter.expires_at)} (parked {iso(letter.parked_at)})")
            verdict = requeue_rules.judge(letter, requeue_rules.flow_state(backend, letter))
            print(f"requeue allowed: {verdict.allowed}: {verdict.message}")
            try:
                letters.requeue(letter.id)
            except RequeueRefused as err:
                print(f"sent as it is? no: {str(err)[:120]}...")
            print(f"still parked: {[kept.id for kept in letters.list()] == [letter.id]}")
        finally:
            letters.close()
        backend.close()


if __name__ == "__main__":
    main()
