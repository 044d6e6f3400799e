"""A worker's replies to the engines it serves: RUNNING, progress, heartbeats and outcomes.

Each reply goes to the request's ``reply_to`` with its ``correlation_id`` and the worker's
headers (identity, origin, free slots, and the request's attempt ids echoed). An outcome is the
only record of work done, so it is confirmed and waits out a long broker outage; a result or
exception the wire cannot carry becomes a FAILURE that says so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flowengine import hooks as hk
from flowengine.types.failure import Failure
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import proxy as px

# Its lines are the server's: operators follow one logger per worker side.
LOG = logging.getLogger("flowengine.worker_based.server")

_ECHOED_HEADERS = (pr.HEADER_REQUEST_ID, pr.HEADER_ATTEMPT)
#: Seconds a worker keeps trying to publish an outcome (or hand-back) through a broker outage:
#: it is the only record of work done, and the request is acknowledged only once it is out.
OUTCOME_PUBLISH_DEADLINE = 900.0


def from_flowengine(headers: Mapping[str, Any] | None) -> bool:
    """Whether a request came from a flowengine engine (which announces its protocol)."""
    return bool(headers) and pr.HEADER_PROTOCOL in headers  # type: ignore[operator]


class ReplySender:
    """The replying half of a worker's :class:`~flowengine.worker_based.server.Server`.

    Attributes:
        worker_id: The worker's identity in reply headers.
        hooks: Told of each reply as it is sent (see :meth:`flowengine.hooks.Hook.replying`).
    """

    worker_id: str
    hooks: hk.Hooks
    _proxy: px.Proxy

    @property
    def free_slots(self) -> int | None:
        """Task slots not running a request (advertised in replies), or None if unknown."""
        raise NotImplementedError

    def _headers(self, request_headers: Mapping[str, Any] | None = None) -> dict[str, Any]:
        headers: dict[str, Any] = {
            pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION,
            pr.HEADER_WORKER: self.worker_id,
            pr.HEADER_ORIGIN: pr.origin(),
        }
        free = self.free_slots
        if free is not None:
            headers[pr.HEADER_CAPACITY] = free
        for name in _ECHOED_HEADERS:
            if request_headers and name in request_headers:
                headers[name] = request_headers[name]
        return headers

    def _reply(
        self, reply_to: str, correlation_id: str, request_headers: Mapping[str, Any],
        state: str, name: str, **data: Any,
    ) -> bool:  # fmt: skip
        response = pr.Response(state, **data)
        event_type = data.get("event_type")
        self.hooks.replying(state, event_type if isinstance(event_type, str) else None)
        # Only RUNNING may trail: everything else here is the request's last word before it is
        # acknowledged (an outcome, a hand-back, a cancellation) and must be stored first.
        confirm = state != pr.RUNNING or not from_flowengine(request_headers)
        try:
            try:
                # An outcome is the only copy of work done: it waits out a long outage.
                self._send(response, reply_to, correlation_id, request_headers, confirm=confirm,
                           persistent=confirm,
                           deadline=OUTCOME_PUBLISH_DEADLINE if confirm else None)
            except px.MessageEncodeError as err:
                if state not in (pr.SUCCESS, pr.FAILURE):
                    raise
                # The outcome cannot travel as it is: send a FAILURE that says why instead.
                LOG.warning("Task %s %s reply cannot be sent: %s", name, state, err)
                why = px.MessageEncodeError(f"Task {name} {state} reply cannot be sent: {err}")
                why.__cause__ = err
                failure = pr.failure_to_dict(Failure.from_exception(why))
                failed = pr.Response(pr.FAILURE, result=failure)
                self._send(failed, reply_to, correlation_id, request_headers,
                           deadline=OUTCOME_PUBLISH_DEADLINE)
        except Exception as err:
            LOG.error("Could not send %s reply for task %s to %r: %s", state, name, reply_to, err)
            return False
        return True

    def _forward_event(
        self, props: Mapping[str, Any], headers: Mapping[str, Any], event_type: str,
        details: Mapping[str, Any], retry: bool = True, confirm: bool = True,
    ) -> None:  # fmt: skip
        # Errors propagate to the caller (the task's notifier, the heartbeat thread): both log.
        event = pr.Response(pr.EVENT, event_type=event_type, details=dict(details))
        self._send(event, props["reply_to"], props["correlation_id"], headers, retry=retry,
                   confirm=confirm, persistent=confirm)

    def _send(
        self, msg: pr.Message, reply_to: str, correlation_id: str | None = None,
        request_headers: Mapping[str, Any] | None = None, retry: bool = True,
        confirm: bool = True, persistent: bool = True, deadline: float | None = None,
    ) -> None:  # fmt: skip
        # The reply queue is its consumer's to declare (it exists before any request is sent).
        # On AMQP declaring it here too could clash with the engine's queue arguments; where
        # declarations are records a server restarted empty forgets (Redis, beanstalkd), it is
        # declared alike (see Publisher.publish), so an outcome sent before the engine bound
        # its queue again is kept. An engine that is gone may get its queue back that way; on
        # Redis it expires as the engine's own did.
        # A confirmed reply is in the queue before the next one is published, so replies keep
        # their order over the pool's several connections. Outcomes and progress are always
        # confirmed (the request is acknowledged after the outcome; progress must reach the
        # engine before it). A flowengine engine takes RUNNING and heartbeats unconfirmed and
        # transient: an outcome before its RUNNING still counts and a late one is ignored, and
        # it spares a broker round trip before each task starts. A TaskFlow engine does not:
        # an outcome before RUNNING kills its reply consumer.
        self._proxy.publish(
            msg, reply_to, correlation_id=correlation_id, headers=self._headers(request_headers),
            reply=True, retry=retry, confirm=confirm, persistent=persistent, deadline=deadline,
        )  # fmt: skip
