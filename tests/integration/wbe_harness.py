"""Real brokers, worker processes and a bare protocol client, for the integration tests.

The fixtures built on these live in ``conftest.py``; tests import the classes from here.

Brokers are the servers ``.ci/services.sh start`` runs on 127.0.0.1 (Redis 6379, RabbitMQ 5672 as
guest/guest, beanstalkd 11300); ``FLOWENGINE_TEST_REDIS_URL``, ``FLOWENGINE_TEST_AMQP_URL`` and
``FLOWENGINE_TEST_BEANSTALK_URL`` point elsewhere.
A broker that does not answer is started (``.ci/services.sh start``, once a session, by the
conftest's server starter) and checked again; still missing, it fails the test when ``CI=true``
and skips it otherwise.

Worker processes are real ``flowengine worker`` (or TaskFlow worker) processes, started with
:class:`WorkerFleet` and stopped (SIGTERM, then SIGKILL) by pid when the fixture ends, whatever
the test did to them. Readiness is an event, never a sleep: a flowengine worker is ready when its
``online`` announcement arrives on the exchange; a TaskFlow worker when it answers a NOTIFY.
Every process's output goes to a log file that failures quote.

:class:`ProtocolClient` speaks the worker protocol with kombu directly: it publishes raw messages
to a worker's queue (anything at all, for the bad-input tests) and collects what comes back on a
reply queue of its own.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import kombu
from servers import SERVERS, unavailable  # tests/ is on sys.path (rootdir conftest)

from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker.proxy import mask_url

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
REPO = TESTS.parent

#: Seconds a worker process gets to start serving (imports, connecting, declaring).
WORKER_START_TIMEOUT = 30.0
#: Seconds a worker process gets to exit after SIGTERM before it is SIGKILLed.
WORKER_STOP_TIMEOUT = 15.0
#: Seconds a broker gets to answer the availability check.
BROKER_CONNECT_TIMEOUT = 3.0


# ---- brokers ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Broker:
    """A real broker the tests can reach."""

    name: str
    url: str

    def __str__(self) -> str:
        return self.name


BROKERS = {
    "redis": Broker("redis", os.environ.get("FLOWENGINE_TEST_REDIS_URL",
                                            "redis://127.0.0.1:6379/0")),
    "rabbitmq": Broker("rabbitmq", os.environ.get("FLOWENGINE_TEST_AMQP_URL",
                                                  "amqp://guest:guest@127.0.0.1:5672//")),
    "beanstalk": Broker("beanstalk", os.environ.get("FLOWENGINE_TEST_BEANSTALK_URL",
                                                    "beanstalk://127.0.0.1:11300")),
}
_checked: dict[str, str | None] = {}


def _broker_problem(broker: Broker) -> str | None:
    conn = kombu.Connection(broker.url, connect_timeout=BROKER_CONNECT_TIMEOUT)
    try:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                               timeout=BROKER_CONNECT_TIMEOUT)
        conn.channel().close()
        return None
    except Exception as err:  # any driver or network error means "not available"
        return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
    finally:
        conn.release()


def require_broker(name: str) -> Broker:
    """The broker called ``name`` once it answered (fail under CI=true, else skip).

    A broker that does not answer is started (once a session, see :mod:`servers`) and checked
    again; the outcome is kept for the rest of the session.
    """
    broker = BROKERS[name]
    if name not in _checked:
        _checked[name] = SERVERS.problem(functools.partial(_broker_problem, broker))
    reason = _checked[name]
    if reason is not None:
        unavailable(f"{name} test server at {mask_url(broker.url)} unavailable ({reason}); "
                    f"run `.ci/services.sh start`")
    return broker


def _memory_transport(_tmp: Path) -> dict[str, Any]:
    return {"transport": "memory"}


def _fs_transport(tmp: Path) -> dict[str, Any]:
    from flowengine.worker_based.broker import transport_fs

    return {"transport": transport_fs.TRANSPORT_NAME,
            "transport_options": {"data_folder": str(tmp / "fs")}}


def _broker_transport(name: str) -> Callable[[Path], dict[str, Any]]:
    return lambda _tmp: {"url": require_broker(name).url}


#: Every transport by name: the connection settings (``url`` or ``transport`` and options) of
#: a Proxy, Worker or executor on it, given a temporary folder (flowengine-fs keeps its data
#: there; a real broker that does not answer fails under CI=true, else skips).
TRANSPORTS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "memory": _memory_transport, "flowengine-fs": _fs_transport,
    "redis": _broker_transport("redis"), "rabbitmq": _broker_transport("rabbitmq"),
    "beanstalk": _broker_transport("beanstalk")}


def unique_exchange(prefix: str = "it") -> str:
    """An exchange name no other test (or earlier run) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def delete_exchange(url: str, exchange: str, queues: Sequence[str] = ()) -> None:
    """Remove what a test left on a broker: the named queues and the exchange (best effort).

    On Redis, where queues never expire, every key of the exchange goes (engines' reply queues
    included); on beanstalkd every tube named after it.
    """
    with kombu.Connection(url, connect_timeout=BROKER_CONNECT_TIMEOUT) as conn:
        for name in queues:
            try:
                with conn.channel() as channel:
                    kombu.Queue(name, channel=channel).delete()
            except Exception:  # already gone (auto-delete) or the channel refused
                pass
        try:
            with conn.channel() as channel:
                kombu.Exchange(exchange, channel=channel).delete()
                client = getattr(channel, "client", None)  # Redis only
                if client is not None:
                    for key in client.scan_iter(match=f"*{exchange}*"):
                        client.delete(key)
                for name in getattr(channel, "queues", lambda _prefix: [])(exchange):
                    channel.queue_delete(name)  # beanstalkd lists its tubes: every one goes
        except Exception:
            pass


# ---- talking to workers directly ----------------------------------------------------------------


@dataclasses.dataclass
class Received:
    """A message that reached a :class:`ProtocolClient`'s queue."""

    type: str | None
    body: Any
    properties: dict[str, Any]
    headers: dict[str, Any]

    @property
    def correlation_id(self) -> str | None:
        return self.properties.get("correlation_id")

    @property
    def state(self) -> str | None:
        return self.body.get("state") if isinstance(self.body, dict) else None


def request_body(task_cls: str, task_name: str, arguments: Mapping[str, Any] | None = None,
                 action: str = "execute", **extra: Any) -> dict[str, Any]:
    """A REQUEST body as a TaskFlow or flowengine engine sends it."""
    return {"task_cls": task_cls, "task_name": task_name, "task_version": [1, 0],
            "action": action, "arguments": dict(arguments or {}), **extra}


class ProtocolClient:
    """A bare kombu peer on ``exchange``: publishes anything, collects what comes back.

    Its own queue ``<exchange>_<reply_to>`` is bound with ``reply_to`` (and ``bind`` keys, e.g.
    the discovery key to hear worker announcements). Declarations match the workers' topology
    (``taskflow_compat``), so the exchange is compatible whoever declares it first.
    """

    def __init__(self, url: str, exchange: str, taskflow_compat: bool = False,
                 bind: Sequence[str] = ()) -> None:
        self.reply_to = f"probe-{uuid.uuid4().hex[:12]}"
        self.received: list[Received] = []
        self._compat = taskflow_compat
        self.exchange = kombu.Exchange(exchange, type="direct", durable=not taskflow_compat,
                                       auto_delete=taskflow_compat)
        self._conn = kombu.Connection(url, connect_timeout=BROKER_CONNECT_TIMEOUT)
        self._channel = self._conn.channel()
        self._queue = queue = kombu.Queue(
            f"{exchange}_{self.reply_to}", durable=False, auto_delete=True,
            bindings=[kombu.binding(self.exchange, routing_key=key)
                      for key in (self.reply_to, *bind)],
        )  # fmt: skip
        self._consumer = kombu.Consumer(self._channel, queues=[queue], on_message=self._keep,
                                        accept=["application/json"])
        self._consumer.consume()
        self._producer = kombu.Producer(self._channel, exchange=self.exchange)

    def _keep(self, message: Any) -> None:
        try:
            body = message.decode()
        except Exception as err:  # kept, so a test can say what arrived
            body = {"undecodable": repr(err)}
        self.received.append(Received(message.properties.get("type"), body,
                                      dict(message.properties), dict(message.headers or {})))
        message.ack()

    def publish(self, topic: str, body: Any, *, type: str | None = pr.REQUEST,
                content_type: str = "application/json", content_encoding: str = "utf-8",
                reply_to: str | None = "", correlation_id: str | None = "",
                headers: Mapping[str, Any] | None = None) -> str | None:
        """Publish ``body`` to ``topic``'s queue (which its worker declared); return the
        correlation id used.

        ``body`` given as ``bytes`` or ``str`` goes on the wire exactly as given; anything else
        is JSON-encoded. ``reply_to``/``correlation_id``: ``""`` means this client's reply key /
        a fresh id, ``None`` leaves the property out. ``type=None`` leaves ``type`` out.
        """
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if correlation_id == "":
            correlation_id = uuid.uuid4().hex
        properties: dict[str, Any] = {}
        if type is not None:
            properties["type"] = type
        if reply_to is not None:
            properties["reply_to"] = reply_to or self.reply_to
        if correlation_id is not None:
            properties["correlation_id"] = correlation_id
        self._producer.publish(
            body, routing_key=topic, content_type=content_type,
            content_encoding=content_encoding, headers=dict(headers or {}),
            declare=[self.exchange], **properties,
        )  # fmt: skip
        return correlation_id

    def wait_for(self, predicate: Callable[[Received], bool], timeout: float,
                 what: str = "a message") -> Received:
        """The first received message ``predicate`` accepts (waiting up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            for message in self.received:
                if predicate(message):
                    return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {what} within {timeout}s; received: {self.received}")
            try:
                self._conn.drain_events(timeout=min(remaining, 0.1))
            except TimeoutError:
                pass

    def outcome(self, correlation_id: str | None, timeout: float = 15.0) -> Received:
        """The SUCCESS or FAILURE reply to ``correlation_id``."""
        return self.wait_for(
            lambda m: m.correlation_id == correlation_id and m.state in (pr.SUCCESS, pr.FAILURE),
            timeout, f"outcome for request {correlation_id}")

    def replies_to(self, correlation_id: str | None) -> list[Received]:
        """Everything received so far for ``correlation_id``."""
        return [m for m in self.received if m.correlation_id == correlation_id]

    def drain(self, timeout: float) -> None:
        """Collect whatever arrives within ``timeout`` (to show that nothing does)."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                self._conn.drain_events(timeout=min(remaining, 0.1))
            except TimeoutError:
                pass

    def ping(self, topic: str, timeout: float, every: float = 0.5) -> Received:
        """Ask ``topic`` for its workers (NOTIFY) until one answers; return the answer.

        Asked again ``every`` seconds: a NOTIFY sent before the worker declared its queue is
        dropped by the broker.
        """
        deadline = time.monotonic() + timeout
        while True:
            self.publish(topic, {}, type=pr.NOTIFY, correlation_id=None)
            try:
                return self.wait_for(
                    lambda m: m.type == pr.NOTIFY and m.body.get("topic") == topic,
                    min(every, max(deadline - time.monotonic(), 0.0)),
                    f"NOTIFY answer from topic {topic!r}")
            except AssertionError:
                if time.monotonic() >= deadline:
                    raise

    def close(self) -> None:
        """Stop consuming and delete this client's queue (Redis keeps auto-delete queues)."""
        try:
            self._consumer.cancel()
            self._queue(self._channel).delete()
            self._channel.close()
        finally:
            self._conn.release()


def queued_messages(url: str, queue: str) -> int | None:
    """How many messages wait in ``queue`` (None: there is no such queue)."""
    with kombu.Connection(url, connect_timeout=BROKER_CONNECT_TIMEOUT) as conn:
        try:
            with conn.channel() as channel:
                return int(channel.queue_declare(queue, passive=True).message_count)
        except conn.channel_errors:
            return None


# ---- worker processes ---------------------------------------------------------------------------


def subprocess_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of child processes: ``tests/`` and ``tests/integration`` importable."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONIOENCODING="utf-8")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(TESTS), str(HERE), str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


class WorkerProcess:
    """One worker process, addressed by its pid."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log_path: Path,
                 topic: str) -> None:
        self.name, self.argv, self.topic, self.log_path = name, argv, topic, log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, env=dict(env), cwd=REPO, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self, tail: int = 60) -> str:
        """The last ``tail`` lines of the process's output."""
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(lines[-tail:])

    def signal(self, signum: int) -> None:
        """Send ``signum`` to this process (if it still runs)."""
        if self.alive:
            os.kill(self.pid, signum)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code once the process ends within ``timeout``; None if it still runs."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = WORKER_STOP_TIMEOUT) -> int:
        """SIGTERM, then SIGKILL if it is still there after ``timeout``; return the exit code."""
        self.signal(signal.SIGTERM)
        code = self.wait_exit(timeout)
        if code is None:
            self.signal(signal.SIGKILL)
            code = self.proc.wait()
        return code

    def failure(self, why: str) -> str:
        return f"worker {self.name} (pid {self.pid}) {why}\n--- its output\n{self.log()}"

    def __repr__(self) -> str:
        return f"<WorkerProcess {self.name} pid={self.pid} topic={self.topic!r}>"


class WorkerFleet:
    """Starts worker processes on one broker and exchange, and stops every one of them.

    Args:
        broker: Where the workers connect.
        exchange: Their exchange.
        log_dir: Where each process's output goes.
        env: Extra environment for every process (e.g. the cross-process ledger's path).
        taskflow_compat: TaskFlow's topology (required when TaskFlow peers share the exchange).
        url: The broker URL workers and engines get, if not ``broker.url`` (e.g. with an AMQP
            ``?heartbeat=N``); the harness's own short-lived connections keep ``broker.url``.
        worker_args: Extra ``flowengine worker`` arguments for every worker it starts.
    """

    def __init__(self, broker: Broker, exchange: str, log_dir: Path,
                 env: Mapping[str, str] | None = None, taskflow_compat: bool = False,
                 url: str | None = None, worker_args: Sequence[str] = ()) -> None:
        self.broker, self.exchange, self.log_dir = broker, exchange, log_dir
        self.url = url or broker.url
        self.worker_args = list(worker_args)
        self.env = dict(env or {})
        self.taskflow_compat = taskflow_compat
        self.workers: list[WorkerProcess] = []
        self._topics: set[str] = set()

    def start(self, topic: str, tasks: Sequence[str], count: int = 1, threads: int | None = 4,
              extra_args: Sequence[str] = (), timeout: float = WORKER_START_TIMEOUT,
              ) -> list[WorkerProcess]:
        """Start ``count`` flowengine workers and wait until each one announced itself
        (``threads=None``: no ``--threads``, e.g. for ``--autoscale``)."""
        watcher = ProtocolClient(self.broker.url, self.exchange, self.taskflow_compat,
                                 bind=[pr.DISCOVERY_ROUTING_KEY])
        try:
            started = []
            for _ in range(count):
                argv = [sys.executable, "-m", "flowengine.cli.main", "worker",
                        "--url", self.url, "--exchange", self.exchange, "--topic", topic,
                        *(["--threads", str(threads)] if threads else []),
                        "--grace", "5", *self.worker_args,
                        *extra_args]
                argv += [arg for task in tasks for arg in ("--task", task)]
                if self.taskflow_compat:
                    argv.append("--taskflow-compat")
                started.append(self._spawn(f"{topic}-{len(self.workers) + 1}", argv, topic))
            for worker in started:
                self._wait_announced(watcher, worker, timeout)
            return started
        finally:
            watcher.close()

    def start_taskflow(self, topic: str, tasks: Sequence[str],
                       timeout: float = WORKER_START_TIMEOUT) -> WorkerProcess:
        """Start a TaskFlow worker (``python -m taskflow.engines.worker_based.worker``)."""
        argv = [sys.executable, "-m", "taskflow.engines.worker_based.worker"]
        if self.broker.name == "beanstalk":  # not in kombu: flowengine registers it
            argv[1:] = ["-c", "import runpy, flowengine.worker_based.broker.transport_beanstalk; "
                        "runpy.run_module('taskflow.engines.worker_based.worker', "
                        "run_name='__main__', alter_sys=True)"]
        argv += ["--exchange", self.exchange, "--connection-url", self.broker.url,
                "--topic", topic, "--verbose"]
        argv += [arg for task in tasks for arg in ("--task", task)]
        worker = self._spawn(f"taskflow-{topic}-{len(self.workers) + 1}", argv, topic)
        # TaskFlow declares everything non-durable and auto-delete.
        client = ProtocolClient(self.broker.url, self.exchange, taskflow_compat=True)
        try:
            client.ping(topic, timeout)
        except AssertionError as err:
            raise AssertionError(worker.failure(f"did not answer NOTIFY: {err}")) from None
        finally:
            client.close()
        return worker

    def _spawn(self, name: str, argv: list[str], topic: str) -> WorkerProcess:
        worker = WorkerProcess(name, argv, subprocess_env(self.env),
                               self.log_dir / f"{self.exchange}-{name}.log", topic)
        self.workers.append(worker)
        self._topics.add(topic)
        return worker

    @staticmethod
    def _wait_announced(watcher: ProtocolClient, worker: WorkerProcess, timeout: float) -> None:
        def announced(message: Received) -> bool:
            if not worker.alive:
                raise AssertionError(worker.failure(f"exited with {worker.proc.returncode}"))
            origin = str(message.headers.get(pr.HEADER_ORIGIN, ""))
            return (message.type == pr.NOTIFY and origin.rsplit(":", 1)[-1] == str(worker.pid)
                    and message.headers.get(pr.HEADER_WORKER_STATUS) == pr.WORKER_ONLINE)

        try:
            watcher.wait_for(announced, timeout, f"announcement of {worker.name}")
        except AssertionError as err:
            raise AssertionError(worker.failure(f"never announced itself: {err}")) from None

    def engine_options(self, topic: str, **extra: Any) -> dict[str, Any]:
        """What ``engines.load(..., engine="worker-based", **options)`` needs to use ``topic``."""
        options = {"url": self.url, "exchange": self.exchange, "topics": [topic]}
        if self.taskflow_compat:
            options["taskflow_compat"] = True
        return {**options, **extra}

    def stop_all(self) -> None:
        """Stop every process still running, then remove the queues and the exchange."""
        for worker in self.workers:  # all at once: each may take a while to finish
            worker.signal(signal.SIGTERM)
        for worker in self.workers:
            worker.stop()
        queues = [f"{self.exchange}_{topic}" for topic in self._topics]
        queues.append(f"{self.exchange}_flowengine.dead-letters")
        delete_exchange(self.broker.url, self.exchange, queues)
