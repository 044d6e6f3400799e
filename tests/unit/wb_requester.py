"""The engine's side of the wire, by hand, for tests that drive a real worker directly."""

from __future__ import annotations

import functools
import queue
import threading
import uuid
from collections import defaultdict
from typing import Any

from taskflow.engines.worker_based import protocol as tf_protocol

from flowengine import task
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px

TOPIC = "volumes"
WAIT = 10.0


def run_in_thread(target: Any) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


class Requester:
    """The engine's side, by hand: publishes requests and collects replies by correlation id."""

    def __init__(self, exchange: str, transport: dict[str, Any]) -> None:
        self.reply_key = uuid.uuid4().hex
        self.replies: defaultdict[str | None, queue.Queue[tuple[Any, dict[str, Any]]]]
        self.replies = defaultdict(queue.Queue)
        self.arrivals: list[str | None] = []
        handlers = {
            pr.RESPONSE: dp.Handler(self._collect, pr.Response.validate),
            pr.NOTIFY: dp.Handler(
                self._collect, functools.partial(pr.Notify.validate, response=True)
            ),
        }
        self.proxy = px.Proxy(
            self.reply_key, exchange, handlers,
            extra_routing_keys=[pr.DISCOVERY_ROUTING_KEY], **transport,
        )  # fmt: skip
        self.thread = run_in_thread(self.proxy.start)
        assert self.proxy.wait(WAIT)

    def _collect(self, data: Any, message: Any) -> None:
        correlation_id = message.properties.get("correlation_id")
        headers = dict(message.headers)
        self.arrivals.append(data.get("state") or headers.get(pr.HEADER_WORKER_STATUS))
        self.replies[correlation_id].put((data, headers))

    def send(self, atom: task.Task, action: str = pr.EXECUTE, arguments: Any = None,
             headers: dict[str, Any] | None = None, **kwargs: Any) -> pr.Request:  # fmt: skip
        request = pr.Request(atom, uuid.uuid4().hex, action, arguments or {}, **kwargs)
        self.proxy.publish(
            request, TOPIC, reply_to=self.reply_key, correlation_id=request.uuid, headers=headers
        )
        return request

    def next(self, correlation_id: str | None) -> tuple[Any, dict[str, Any]]:
        return self.replies[correlation_id].get(timeout=WAIT)

    def outcome(self, request: pr.Request) -> list[dict[str, Any]]:
        """Replies up to SUCCESS or FAILURE, each also checked by TaskFlow's validator."""
        bodies: list[dict[str, Any]] = []
        while not bodies or bodies[-1]["state"] not in (pr.SUCCESS, pr.FAILURE):
            body, _ = self.next(request.uuid)
            tf_protocol.Response.validate(body)
            bodies.append(body)
        return bodies

    def notify_reply(self, status: str | None = None) -> tuple[Any, dict[str, Any]]:
        while True:
            body, headers = self.next(None)
            if headers.get(pr.HEADER_WORKER_STATUS) == status:
                return body, headers

    def close(self) -> None:
        self.proxy.stop()
        self.thread.join(WAIT)
