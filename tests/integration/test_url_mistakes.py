"""Mistakes in a broker URL or exchange name: one line naming the part that is wrong.

A scheme typo is refused before anything connects (kombu would raise a KeyError from deep
inside); a host name that does not exist is not retried like a broker that is down; an engine
that finds no worker at all names its exchange, and the queues of its topics the broker has on
other exchanges where the broker can list them (beanstalkd, Redis, flowengine-fs).
"""

from __future__ import annotations

import pathlib
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import kombu
import pytest

from flowengine import engines, exceptions, task
from flowengine.flows import linear_flow
from flowengine.worker_based import backoff as bo
from flowengine.worker_based.broker import transport_fs  # noqa: F401 - registers it
from flowengine.worker_based.broker.connection import BrokerURLError

pytestmark = pytest.mark.integration

FLOWENGINE = [sys.executable, "-m", "flowengine.cli.main"]
ROOT = pathlib.Path(__file__).resolve().parents[2]


class Noop(task.Task):
    def execute(self) -> None:
        return None


def _flow() -> linear_flow.Flow:
    return linear_flow.Flow("mistakes").add(Noop())


def test_a_scheme_typo_is_one_line_naming_the_scheme() -> None:
    with pytest.raises(BrokerURLError) as caught:
        engines.run(_flow(), engine="worker-based", url="redsi://127.0.0.1:6379/0",
                    topics=["t"])
    message = str(caught.value)
    assert "'redsi'" in message and "did you mean 'redis'" in message
    assert "\n" not in message


@pytest.mark.parametrize("command", [["workers"],
                                     ["worker", "--topic", "t", "--task", "event_tasks"]])
def test_the_cli_prints_a_scheme_typo_in_one_line(command: list[str]) -> None:
    proc = subprocess.run([*FLOWENGINE, *command, "--url", "amqq://guest:secret@127.0.0.1//"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          cwd=pathlib.Path(__file__).parent)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Unknown transport 'amqq'" in lines[0] and "did you mean 'amqp'" in lines[0]
    assert "secret" not in lines[0]


def _resolver_says_no() -> str:
    try:
        socket.getaddrinfo("no-such-broker.invalid", 5672)
    except socket.gaierror as err:
        if err.errno in bo._NO_SUCH_HOST:
            return "no-such-broker.invalid"
        pytest.fail(f"this machine's resolver answers {err} for a .invalid name")
    pytest.fail("a .invalid name resolved")


def test_a_host_name_that_does_not_exist_is_not_retried() -> None:
    host = _resolver_says_no()
    # A down broker is retried for the whole transition timeout (a minute here) and ends in
    # BrokerUnreachable; a name that does not exist ends at the first attempt, saying so.
    with pytest.raises(exceptions.ExecutionFailure) as caught:
        engines.run(_flow(), engine="worker-based", url=f"amqp://guest:guest@{host}:5672//",
                    topics=["t"], transition_timeout=60)
    assert not isinstance(caught.value, bo.BrokerUnreachable)
    assert f"the host name '{host}' does not resolve" in str(caught.value)


def test_a_worker_whose_broker_host_does_not_exist_says_so_in_one_line() -> None:
    host = _resolver_says_no()
    proc = subprocess.run([*FLOWENGINE, "worker", "--topic", "t", "--task", "event_tasks",
                           "--no-events", "--url", f"amqp://guest:secret@{host}:5672//"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          cwd=pathlib.Path(__file__).parent)
    assert proc.returncode == 1
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert "The worker on topic 't' cannot reach the broker" in error
    assert f"the host name '{host}' does not resolve" in error and "secret" not in error


def test_only_a_definite_no_from_the_resolver_stops_the_retries() -> None:
    stop = threading.Event()
    backoff = bo.Backoff(bo.RetryOptions(interval_start=0, jitter=0), "Connecting",
                         "amqp://guest:***@broker.example:5672//", stop)
    with pytest.raises(bo.BrokerRefused, match="'broker.example' does not resolve"):
        backoff(_wrapped(socket.gaierror(socket.EAI_NONAME, "Name unknown")))
    backoff(_wrapped(socket.gaierror(socket.EAI_AGAIN, "Temporary failure")))  # retried
    assert backoff.attempt == 1


def _wrapped(err: BaseException) -> BaseException:
    """``err`` as a client library raises it: inside its own connection error."""
    try:
        try:
            raise err
        except socket.gaierror as inner:
            raise ConnectionError(f"Error connecting: {inner}") from inner
    except ConnectionError as outer:
        return outer


@pytest.fixture
def exchanges(beanstalk_url: str) -> Iterator[tuple[str, str]]:
    """A worker topic's queue on one exchange, and a misspelt name of that exchange."""
    right = f"mistakes-{uuid.uuid4().hex[:8]}"
    wrong = right.replace("mistakes", "mistaeks")
    exchange = kombu.Exchange(right, type="direct")
    queue = kombu.Queue(f"{right}_cells", exchange, routing_key="cells")
    with kombu.Connection(beanstalk_url) as conn:
        kombu.Producer(conn.channel(), exchange).publish(
            {"waiting": True}, routing_key="cells", declare=[queue], serializer="json")
    try:
        yield right, wrong
    finally:
        with kombu.Connection(beanstalk_url) as conn, conn.channel() as channel:
            # The engine's request waits in the misspelt exchange's queue.
            for name in (queue.name, f"{wrong}_cells"):
                channel.queue_delete(name)
            for name in (right, wrong):
                channel.exchange_delete(name)


def test_no_worker_found_names_the_exchange_and_where_the_topic_is(
        beanstalk_url: str, exchanges: tuple[str, str]) -> None:
    right, wrong = exchanges
    with pytest.raises(exceptions.RequestTimeout) as caught:
        engines.run(_flow(), engine="worker-based", url=beanstalk_url, exchange=wrong,
                    topics=["cells"], transition_timeout=1)
    message = str(caught.value)
    assert f"topic(s) 'cells' of exchange '{wrong}'" in message
    assert f"the broker has queues for 'cells' on exchange(s) '{right}'" in message


def test_a_missing_extra_is_named_in_one_line(tmp_path: pathlib.Path) -> None:
    # The Redis transport's import fails as it does without the redis extra (no redis client).
    (tmp_path / "redis").mkdir()
    (tmp_path / "redis" / "__init__.py").write_text("raise ImportError('no redis here')\n")
    proc = subprocess.run([*FLOWENGINE, "workers", "--url", "redis://127.0.0.1:6379/0"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={"PYTHONPATH": f"{tmp_path}:{ROOT}",
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: The Redis transport needs the 'redis' extra: pip install 'flowengine[redis]' "
        "(no redis here)"], proc.stderr


def test_an_exchange_typo_on_the_embedded_transport_names_the_right_one(
        tmp_path: pathlib.Path) -> None:
    options = {"data_folder": str(tmp_path / "queues")}
    with kombu.Connection("localhost", transport="flowengine-fs",
                          transport_options=options) as conn:
        exchange = kombu.Exchange("orders", type="direct")
        kombu.Queue("orders_cells", exchange, routing_key="cells")(conn.channel()).declare()
    with pytest.raises(exceptions.RequestTimeout) as caught:
        engines.run(_flow(), engine="worker-based", transport="flowengine-fs",
                    transport_options=options, exchange="ordres", topics=["cells"],
                    transition_timeout=1)
    message = str(caught.value)
    assert "topic(s) 'cells' of exchange 'ordres'" in message
    assert message.endswith("the broker has queues for 'cells' on exchange(s) 'orders'")
