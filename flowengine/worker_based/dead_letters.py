"""Dead letters: requests parked after their last attempt was lost (beanstalkd's *bury*).

They wait, durable, in queue ``<exchange>_flowengine.dead-letters`` with the reason and the
workers that held them in headers. An operator lists them and requeues one (*kick*): the
original REQUEST goes back to its worker topic under a fresh deadline.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from flowengine import exceptions as exc
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import signing as sg
from flowengine.worker_based.broker import proxy as px


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """One parked request, as an operator sees it."""

    id: str
    task_name: str
    task_cls: str
    action: str
    topic: str
    reason: str
    workers: list[str]
    parked_at: float | None
    attempt: int | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able view (for ``--json`` output)."""
        data = dataclasses.asdict(self)
        if self.parked_at is not None:
            data["parked_at_iso"] = datetime.datetime.fromtimestamp(
                self.parked_at, datetime.UTC).isoformat()
        return data


class _Replay(pr.Message):
    """A stored REQUEST body sent again as it was."""

    TYPE: ClassVar[str] = pr.REQUEST

    def __init__(self, body: Mapping[str, Any]) -> None:
        self._body = dict(body)

    def to_dict(self) -> dict[str, Any]:
        return self._body


def _describe(stored: px.StoredMessage) -> DeadLetter:
    headers = stored.headers
    try:
        body = stored.json()
    except ValueError:
        body = {}
    return DeadLetter(
        id=str(headers.get(pr.HEADER_REQUEST_ID) or stored.properties.get("correlation_id")),
        task_name=str(body.get("task_name", "?")),
        task_cls=str(body.get("task_cls", "?")),
        action=str(body.get("action", "?")),
        topic=str(headers.get(ext.HEADER_DEAD_TOPIC, "")),
        reason=str(headers.get(ext.HEADER_DEAD_REASON, "")),
        workers=[str(w) for w in headers.get(ext.HEADER_DEAD_WORKERS) or []],
        parked_at=headers.get(ext.HEADER_DEAD_AT),
        attempt=headers.get(pr.HEADER_ATTEMPT),
    )


def park(proxy: px.Proxy, request: pr.Request, headers: Mapping[str, Any], reason: str,
         topic: str, workers: list[str], reply_to: str) -> None:
    """Bury ``request`` (sent with ``headers``) as a dead letter, with why and where."""
    dead = {k: v for k, v in headers.items() if k != pr.HEADER_DEADLINE}
    dead.update({
        ext.HEADER_DEAD_REASON: reason,
        ext.HEADER_DEAD_TOPIC: topic,
        ext.HEADER_DEAD_AT: time.time(),
        ext.HEADER_DEAD_WORKERS: list(workers),
    })
    proxy.publish(request, ext.DEAD_LETTER_ROUTING_KEY, reply_to=reply_to,
                  correlation_id=request.request_id, headers=dead)


class DeadLetters:
    """Lists and requeues the dead letters of one exchange.

    Args:
        exchange: the exchange engines and workers use.
        url, transport, transport_options, taskflow_compat: broker settings, as for workers.
        deadline: seconds a requeued request may wait for a worker before it is void.
        signing: signs requeued requests (default: the key in ``FLOWENGINE_SIGNING_KEY``).
    """

    def __init__(self, exchange: str, url: str | None = None, transport: Any = None,
                 transport_options: Mapping[str, Any] | None = None,
                 taskflow_compat: bool = False, deadline: float = pr.REQUEST_TIMEOUT,
                 signing: sg.Signing | None = None) -> None:
        self._proxy = px.Proxy(ext.DEAD_LETTER_ROUTING_KEY, exchange, url=url,
                               transport=transport, transport_options=transport_options,
                               taskflow_compat=taskflow_compat,
                               signing=sg.Signing.from_options() if signing is None else signing)
        self._deadline = deadline

    def list(self) -> list[DeadLetter]:
        """Every parked request, oldest first (the queue is left as it was)."""
        return [_describe(m) for m in self._proxy.browse(ext.DEAD_LETTER_ROUTING_KEY)]

    def requeue(self, letter_id: str) -> DeadLetter:
        """Send one parked request back to its topic; raise NotFound if there is no such id."""
        stored = self._proxy.take(ext.DEAD_LETTER_ROUTING_KEY,
                                  lambda m: _describe(m).id == letter_id)
        if stored is None:
            raise exc.NotFound(f"No dead letter with id {letter_id!r}")
        letter = _describe(stored)
        if not letter.topic:
            raise exc.NotFound(f"Dead letter {letter_id!r} does not say which topic it was for")
        # Its old signature covers the old headers: the request is signed afresh (or not).
        headers = {k: v for k, v in stored.headers.items()
                   if not k.startswith("x-flowengine-dead-") and k not in sg.SIGNATURE_HEADERS}
        headers[pr.HEADER_DEADLINE] = time.time() + self._deadline
        self._proxy.publish(_Replay(stored.json()), letter.topic,
                            reply_to=stored.properties.get("reply_to"),
                            correlation_id=stored.properties.get("correlation_id"),
                            headers=headers)
        return letter

    def close(self) -> None:
        """Release the broker connections."""
        self._proxy.close()
