"""flowengine's additions to TaskFlow's wire protocol: leases, heartbeats, dead letters.

All of it travels in headers or in message shapes TaskFlow's schemas accept, and only between
peers that announced themselves with the ``x-flowengine-protocol`` header: a TaskFlow peer
never receives any of it.
"""

from __future__ import annotations

#: Request header: seconds between heartbeats the engine asks the worker to send while the
#: request runs (absent: send none).
HEADER_HEARTBEAT = "x-flowengine-heartbeat"
#: Request header: seconds the request's lease lasts without a heartbeat (the engine's
#: ``lease_timeout``). On beanstalkd it is the job's time-to-run, which heartbeats ``touch``.
HEADER_LEASE = "x-flowengine-lease"
#: Message header: seconds to wait before the message may be delivered (beanstalkd's delay).
HEADER_DELAY = "x-flowengine-delay"
#: Details key of the progress EVENT a request waiting for a worker's concurrency limit sends
#: its engine: what it waits for (``{key: limit}``), or None once it runs.
WAITING_FOR = "waiting_for"
#: A heartbeat is a RESPONSE in state EVENT with this event type and empty details, so its
#: body is valid under TaskFlow's RESPONSE schema.
EVENT_HEARTBEAT = "flowengine.heartbeat"

#: A worker that receives a flowengine request the broker *redelivered* (the worker it went to
#: before died or lost its connection without settling it) does not run it: it acknowledges it
#: and answers with a RESPONSE in state EVENT of this type, details ``{"worker": <its id>}``.
#: The engine decides: the attempt is lost (and counted) if it had started, else it is sent
#: again. Running it in place would let a request that kills its workers go round the topic
#: unseen by the engine's attempt count.
EVENT_REDELIVERED = "flowengine.redelivered"

#: A worker that gives a request of a protocol-2 engine back to the broker unstarted (it is
#: stopping) first says so with a RESPONSE in state EVENT of this type, details ``{"worker":
#: <its id>}``: the engine then knows that the hand-back of it that follows cost no attempt
#: (a short task sends no RUNNING reply, so nothing else tells it from one that started).
EVENT_RETURNED = "flowengine.returned"
#: Seconds a task of a protocol-2 engine runs before its worker says RUNNING (one that ends
#: sooner sends its outcome alone); never later than its first heartbeat, nor than half the
#: time left before the request's deadline. Only for a task whose last run on that worker
#: ended within it: others say RUNNING at once.
RUNNING_AFTER = 0.2

#: A flowengine worker (not in ``taskflow_compat`` mode) that receives a flowengine request for
#: a task class it does not run (workers sharing a topic share its queue, and during a rolling
#: deploy they run different task lists) acknowledges it and answers with a RESPONSE in state
#: EVENT of this type, details ``{"worker": <its id>}``. The engine sends it again, to a worker
#: that runs the class, without counting an attempt.
EVENT_NOT_SERVED = "flowengine.not-served"
#: Hand-backs of one task run before the engine stops sending it again (a topic whose workers
#: announced the class but turn it away, e.g. an out-of-date announcement).
MAX_NOT_SERVED = 20

#: Seconds an engine process's reply queue survives unused on brokers with queue expiry (AMQP
#: ``x-expires``; kombu's Redis transport too). Workers declaring it again (see
#: ``Publisher.publish(reply=True)``) declare it alike.
REPLY_QUEUE_EXPIRES = 600.0

#: Dead letters are published with this routing key to queue ``<exchange>_<key>``.
DEAD_LETTER_ROUTING_KEY = "flowengine.dead-letters"
#: Dead-letter headers: why it was parked, the topic it was meant for, when, and its id.
HEADER_DEAD_REASON = "x-flowengine-dead-reason"
HEADER_DEAD_TOPIC = "x-flowengine-dead-topic"
HEADER_DEAD_AT = "x-flowengine-dead-at"
HEADER_DEAD_WORKERS = "x-flowengine-dead-workers"

#: Defaults: a RUNNING request whose worker stays silent this long is re-dispatched.
DEFAULT_LEASE_TIMEOUT = 10.0
#: ...with heartbeats this often (a few per lease, so one lost heartbeat is harmless).
DEFAULT_HEARTBEAT_INTERVAL = 2.0
#: ...at most this many attempts in all, then the atom fails with WorkerLost.
DEFAULT_MAX_ATTEMPTS = 3
#: Seconds a request may wait when workers are known but none of them runs its task class.
DEFAULT_UNSERVED_TIMEOUT = 5.0
#: Seconds a request sent to a flowengine worker's topic may wait untaken while nothing at all
#: is heard from that topic (no reply, no heartbeat) before its workers are passed over and the
#: request goes to another capable worker (see :mod:`~flowengine.worker_based.executor`).
DEFAULT_PICKUP_TIMEOUT = 5.0


class EventSink:
    """Where engines and workers report what happens (the event stream's producer side).

    The default does nothing; :mod:`flowengine.worker_based.events` publishes to the broker.
    ``emit`` must be cheap and must never raise: it runs on hot paths.
    """

    def emit(self, event_type: str, **fields: object) -> None:
        """Report one event, e.g. ``emit("task-sent", task_name=..., request_id=...)``."""

    def close(self) -> None:
        """Flush and release resources."""


#: Shared do-nothing sink.
NO_EVENTS = EventSink()

#: Engines publish a NOTIFY with this routing key to ask every flowengine worker at once; each
#: worker binds a private, transient control queue to it (workers sharing a topic share its
#: queue, so a NOTIFY sent to the topic reaches only one of them).
DISCOVER_ROUTING_KEY = "flowengine.discover"


def control_routing_key(worker_id: str) -> str:
    """The routing key (and queue suffix) of a worker's private control queue."""
    return f"flowengine.worker.{worker_id}"
