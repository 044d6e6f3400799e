"""The raw kombu request/response rate between two processes on one broker: the workers' ceiling.

A responder process consumes JSON requests from ``<exchange>_<topic>`` on a direct exchange and
answers each with a small JSON reply, routed by its ``reply_to`` and carrying its
``correlation_id``, as a worker does. Both ends ack after handling, declare durable queues and
publish persistent messages (flowengine's default topology; ``--transient`` for TaskFlow's).
The client measures:

* ``sequential``: one request at a time; the round-trip latency (p50, p95, mean).
* ``pipelined``: many in flight; a publisher thread sends ``n`` requests back to back while the
  main thread collects the replies; replies per second, and (Linux) the CPU time the client,
  the responder and the broker server spent per round trip (``cpu_ms_per_round_trip``).

No engine, schema, state machine or task runs here, so nothing built on kombu can answer faster on
the same broker and machine. A worker-based task costs one request and two replies (RUNNING, then
SUCCESS or FAILURE), so an engine's tasks/s is best compared with about 2/3 of the pipelined rate.

Brokers: ``redis`` (redis://127.0.0.1:6379/0), ``rabbitmq`` (amqp://guest:guest@127.0.0.1:5672//),
``beanstalk`` (beanstalk://127.0.0.1:11300, flowengine's beanstalkd transport), ``fs`` (the
flowengine-fs transport in a temporary folder); override the URLs with
``FLOWENGINE_BENCH_REDIS_URL`` / ``FLOWENGINE_BENCH_AMQP_URL`` / ``FLOWENGINE_BENCH_BEANSTALK_URL``.

Prints one JSON document. Example::

    python benchmarks/kombu_ceiling.py --brokers redis beanstalk --sequential 500 --pipelined 5000
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import kombu

import flowengine.worker_based.broker.transport_beanstalk  # noqa: F401  (registers "beanstalk")
import flowengine.worker_based.broker.transport_fs as transport_fs  # registers "flowengine-fs"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_usage as cpu  # noqa: E402

BROKERS = ("redis", "rabbitmq", "beanstalk", "fs")
#: The shape of a small worker-based REQUEST and RESPONSE, so serialization costs alike.
REQUEST_BODY = {
    "task_cls": "benchmarks.tasks.Noop",
    "task_name": "t0",
    "task_version": [1, 0],
    "action": "execute",
    "arguments": {},
}
REPLY_BODY = {"state": "SUCCESS", "data": {"result": None}}


@dataclasses.dataclass(frozen=True)
class Broker:
    """Where to connect: a URL, or a transport name with its options (flowengine-fs)."""

    name: str
    url: str | None = None
    transport: str | None = None
    transport_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def connection(self) -> kombu.Connection:
        return kombu.Connection(
            self.url or "localhost",
            transport=self.transport,
            transport_options=dict(self.transport_options),
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_broker(name: str, data_folder: str | None = None) -> Broker:
    """The broker called ``name``; ``fs`` needs a ``data_folder``."""
    if name == "redis":
        return Broker(
            name, os.environ.get("FLOWENGINE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
        )
    if name == "rabbitmq":
        url = os.environ.get("FLOWENGINE_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
        return Broker(name, url)
    if name == "beanstalk":
        return Broker(
            name, os.environ.get("FLOWENGINE_BENCH_BEANSTALK_URL", "beanstalk://127.0.0.1:11300")
        )
    if name == "fs":
        if not data_folder:
            raise ValueError("the fs broker needs a data folder")
        options = {
            "data_folder": data_folder,
            "polling_interval": transport_fs.DEFAULT_POLLING_INTERVAL,
        }
        return Broker(name, transport=transport_fs.TRANSPORT_NAME, transport_options=options)
    raise ValueError(f"unknown broker {name!r}; choose from {', '.join(BROKERS)}")


def _topology(exchange_name: str, persistent: bool) -> kombu.Exchange:
    return kombu.Exchange(exchange_name, type="direct", durable=persistent, auto_delete=False)


def _queue(exchange: kombu.Exchange, key: str, persistent: bool) -> kombu.Queue:
    return kombu.Queue(
        f"{exchange.name}_{key}", exchange, routing_key=key, durable=persistent, auto_delete=False
    )


# -- the responder (a separate process) ----------------------------------------------------


def respond(config: dict[str, Any]) -> None:
    """Answer every request until SIGTERM; print ``ready`` once consuming."""
    broker = Broker(**config["broker"])
    persistent = config["persistent"]
    exchange = _topology(config["exchange"], persistent)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Replies go out on their own connection: publishing on the consuming connection from
    # inside its callback makes py-amqp deliver more messages re-entrantly.
    with broker.connection() as conn, broker.connection() as pub_conn:
        producer = pub_conn.Producer(serializer="json")
        delivery_mode = 2 if persistent else 1

        def on_message(body: Any, message: Any) -> None:
            props = message.properties
            if "reply_to" not in props:  # not a request: nobody to answer
                message.ack()
                return
            producer.publish(
                REPLY_BODY, exchange=exchange, routing_key=props["reply_to"],
                correlation_id=props["correlation_id"], delivery_mode=delivery_mode,
            )  # fmt: skip
            message.ack()

        queue = _queue(exchange, config["topic"], persistent)
        with conn.Consumer([queue], callbacks=[on_message], accept=["json"]):
            print("ready", flush=True)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.2)


@contextlib.contextmanager
def responder(broker: Broker, exchange: str, topic: str, persistent: bool) -> Iterator[int]:
    """Run :func:`respond` in a child process for the duration of the block; yield its pid."""
    config = {"broker": broker.as_dict(), "exchange": exchange, "topic": topic,
              "persistent": persistent}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--respond", json.dumps(config)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for_line(proc, "ready", timeout=30.0)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_line(proc: subprocess.Popen[str], wanted: str, timeout: float) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(deadline - time.monotonic(), 0))
        if ready:
            line = proc.stdout.readline()
            if line.strip() == wanted:
                return
            if not line:
                raise RuntimeError(f"responder exited with code {proc.wait()} before '{wanted}'")
    raise TimeoutError(f"responder did not print '{wanted}' within {timeout}s")


# -- the client ------------------------------------------------------------------------------


class _Client:
    def __init__(self, broker: Broker, exchange: str, topic: str, persistent: bool) -> None:
        self._exchange = _topology(exchange, persistent)
        self._topic = topic
        self._reply_key = uuid.uuid4().hex
        self._delivery_mode = 2 if persistent else 1
        self._request_queue = _queue(self._exchange, topic, persistent)
        self._reply_queue = _queue(self._exchange, self._reply_key, persistent)
        self._conn = broker.connection()
        self._pub_conn = broker.connection()
        self._producer = self._pub_conn.Producer(serializer="json")
        self._received: dict[str, float] = {}
        self._consumer = self._conn.Consumer(
            [self._reply_queue], callbacks=[self._on_reply], accept=["json"]
        )
        self._consumer.consume()
        self._request_queue.bind(self._pub_conn.default_channel).declare()

    def _on_reply(self, _body: Any, message: Any) -> None:
        self._received[message.properties["correlation_id"]] = time.perf_counter()
        message.ack()

    def send(self, correlation_id: str, producer: Any = None) -> None:
        (producer or self._producer).publish(
            REQUEST_BODY, exchange=self._exchange, routing_key=self._topic,
            reply_to=self._reply_key, correlation_id=correlation_id,
            delivery_mode=self._delivery_mode,
        )  # fmt: skip

    def wait_for(self, count: int, deadline: float) -> bool:
        while len(self._received) < count:
            if time.monotonic() > deadline:
                return False
            with contextlib.suppress(TimeoutError):
                self._conn.drain_events(timeout=0.1)
        return True

    def sequential(self, n: int, deadline: float) -> dict[str, Any]:
        self._received.clear()
        latencies = []
        for i in range(n):
            if time.monotonic() > deadline:
                break
            sent = time.perf_counter()
            self.send(f"s{i}")
            if not self.wait_for(i + 1, deadline):
                break
            latencies.append(self._received[f"s{i}"] - sent)
        result: dict[str, Any] = {"n": len(latencies), "timed_out": len(latencies) < n}
        if latencies:
            latencies.sort()
            result.update(
                p50_ms=1000 * statistics.median(latencies),
                p95_ms=1000 * latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))],
                mean_ms=1000 * statistics.fmean(latencies),
                round_trips_per_s=len(latencies) / sum(latencies),
            )
        return result

    def pipelined(self, n: int, deadline: float) -> dict[str, Any]:
        self._received.clear()
        producer = self._producer

        def publish_all() -> None:
            for i in range(n):
                if time.monotonic() > deadline:
                    return
                self.send(f"p{i}", producer)

        started = time.perf_counter()
        publisher = threading.Thread(target=publish_all, name="ceiling-publisher")
        publisher.start()
        done = self.wait_for(n, deadline)
        publisher.join()
        elapsed = max(self._received.values(), default=time.perf_counter()) - started
        got = len(self._received)
        return {
            "n": got,
            "timed_out": not done,
            "seconds": elapsed,
            "replies_per_s": got / elapsed if elapsed > 0 else 0.0,
        }

    @property
    def queue_names(self) -> list[str]:
        return [self._request_queue.name, self._reply_queue.name]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._consumer.cancel()
        self._conn.release()
        self._pub_conn.release()


def purge(broker: Broker, exchange: str, queues: Iterable[str]) -> None:
    """Delete the queues and exchanges a run left on a server broker (not on ``fs``).

    ``exchange`` must be unique to the run: on Redis every key that names it is deleted, which
    includes kombu's binding sets and those of flowengine's ``<exchange>.events`` stream.
    """
    if not broker.url:
        return
    with contextlib.suppress(Exception), broker.connection() as conn:
        if broker.name == "redis":
            client = conn.default_channel.client
            for key in client.scan_iter(match=f"*{exchange}*"):
                client.delete(key)
            return
        for method, name in [("queue_delete", q) for q in queues] + [
            ("exchange_delete", exchange),
            ("exchange_delete", f"{exchange}.events"),
        ]:
            # A fresh channel each: a broker error closes the channel it happened on.
            with contextlib.suppress(Exception), conn.channel() as channel:
                getattr(channel, method)(name)


def measure(
    broker: Broker,
    sequential: int = 500,
    pipelined: int = 5000,
    persistent: bool = True,
    time_limit: float = 60.0,
    confirm_publish: bool = False,
) -> dict[str, Any]:
    """Measure one broker: ``sequential`` round trips, then ``pipelined`` requests in flight.

    Each phase gets ``time_limit`` seconds; a phase that runs out reports ``timed_out``.
    ``confirm_publish`` (AMQP only) makes every publish wait for the broker's confirmation,
    as flowengine's default topology does.
    """
    exchange = f"ceiling-{uuid.uuid4().hex[:8]}"
    topic = "echo"
    result: dict[str, Any] = {"broker": broker.name, "persistent": persistent}
    if confirm_publish and broker.name == "rabbitmq":
        options = dict(broker.transport_options, confirm_publish=True)
        broker = dataclasses.replace(broker, transport_options=options)
        result["confirm_publish"] = True
    try:
        client = _Client(broker, exchange, topic, persistent)
        try:
            with responder(broker, exchange, topic, persistent) as responder_pid:
                client.sequential(min(20, sequential), time.monotonic() + time_limit)  # warm up
                result["sequential"] = client.sequential(sequential, time.monotonic() + time_limit)
                watch = cpu.with_broker(
                    {"client": [os.getpid()], "responder": [responder_pid]}, broker.name)
                before = cpu.snapshot(watch)
                result["pipelined"] = client.pipelined(pipelined, time.monotonic() + time_limit)
                spent = cpu.per_unit_ms(before, cpu.snapshot(watch), result["pipelined"]["n"])
                if spent:
                    result["pipelined"]["cpu_ms_per_round_trip"] = spent
        finally:
            client.close()
            purge(broker, exchange, client.queue_names)  # once the responder has stopped
    except Exception as err:  # an unreachable broker is a result, not a crash
        result["error"] = f"{type(err).__name__}: {err}"
    return result


@contextlib.contextmanager
def brokers(names: list[str]) -> Iterator[list[Broker]]:
    """The named brokers; ``fs`` gets a temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="flowengine-bench-") as tmp:
        yield [make_broker(name, os.path.join(tmp, "fs")) for name in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", nargs="+", choices=BROKERS, default=list(BROKERS))
    parser.add_argument("--sequential", type=int, default=500, help="round trips, one at a time")
    parser.add_argument("--pipelined", type=int, default=5000, help="requests sent at once")
    parser.add_argument(
        "--transient",
        action="store_true",
        help="non-durable queues, transient messages (TaskFlow's topology)",
    )
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per phase")
    parser.add_argument(
        "--confirm-publish",
        action="store_true",
        help="RabbitMQ: wait for the broker to confirm every publish",
    )
    parser.add_argument("--respond", metavar="CONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.respond:
        respond(json.loads(args.respond))
        return
    with brokers(args.brokers) as chosen:
        results = []
        for broker in chosen:
            row = measure(broker, args.sequential, args.pipelined, not args.transient,
                          args.time_limit, args.confirm_publish)  # fmt: skip
            print(json.dumps(row), file=sys.stderr)
            results.append(row)
    print(json.dumps({
        "benchmark": "kombu_ceiling",
        "python": platform.python_version(),
        "kombu": kombu.__version__,
        "cpus": os.cpu_count(),
        "results": results,
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
