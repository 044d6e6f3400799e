"""Dead letters: requests parked after their last attempt was lost (beanstalkd's *bury*).

They wait, durable, in queue ``<exchange>_flowengine.dead-letters`` with the reason and the workers
that held them in headers. RabbitMQ's quorum topic queues send a request there themselves once it
was delivered more often than their delivery limit; such a letter is taken in (its secret arguments
removed, the reason and topic read from the broker's ``x-first-death-*`` headers) the first time
dead letters are listed. An operator lists them and requeues one (*kick*): the original REQUEST goes
back to its worker topic under a fresh deadline. A letter keeps no secret argument and expires (see
:mod:`~flowengine.worker_based.dead_letter_keeping`); whether a requeue should happen at all is
:mod:`~flowengine.worker_based.requeue_rules`' to say.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

from flowengine import exceptions as exc
from flowengine.worker_based import client as cl
from flowengine.worker_based import dead_letter_keeping as keeping
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import secret_arguments as sa
from flowengine.worker_based import signing as sg
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.broker.connection import TransportSpec
from flowengine.worker_based.broker.publisher import Publisher
from flowengine.worker_based.broker_spec import Broker

__all__ = ["DEFAULT_TTL", "DeadLetter", "DeadLetters", "park", "removed_message"]

LOG = logging.getLogger(__name__)
#: Seconds a dead letter is kept unless the engine's ``dead_letter_ttl`` says otherwise.
DEFAULT_TTL = keeping.DEFAULT_TTL
#: Headers RabbitMQ puts on a message it dead-lettered itself: why, and from which queue.
BROKER_DEATH_REASON = "x-first-death-reason"
BROKER_DEATH_QUEUE = "x-first-death-queue"
#: What the broker's reasons mean, as a dead letter's reason.
_BROKER_REASONS = {"delivery_limit": "delivery limit reached: the broker gave it up after "
                                     "delivering it that many times"}


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
    flow_uuid: str | None = None
    expires_at: float | None = None
    #: The secret arguments removed from the request when it was parked (their names).
    removed_arguments: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able view (for ``--json`` output)."""
        data = dataclasses.asdict(self)
        data["removed_arguments"] = list(self.removed_arguments)
        for key in ("parked_at", "expires_at"):
            when = getattr(self, key)
            if when is not None:
                data[f"{key}_iso"] = datetime.datetime.fromtimestamp(when, datetime.UTC).isoformat()
        return data


class Parkable(Protocol):
    """A request that can be parked: its body and its attempt's id (a
    :class:`~flowengine.worker_based.protocol.Request` is one)."""

    @property
    def request_id(self) -> str:
        """The id of the attempt it was sent as."""

    def to_dict(self) -> dict[str, Any]:
        """The REQUEST body."""


class _Replay(pr.Message):
    """A stored REQUEST body sent again as it was."""

    TYPE: ClassVar[str] = pr.REQUEST

    def __init__(self, body: Mapping[str, Any]) -> None:
        self._body = dict(body)

    def to_dict(self) -> dict[str, Any]:
        return self._body


def _describe(stored: px.StoredMessage, exchange: str = "") -> DeadLetter:
    headers = stored.headers
    if _broker_dead(stored):  # not taken in yet: what the broker says stands in
        headers = {**headers, **_broker_death(headers, exchange)}
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
        flow_uuid=_text(headers.get(pr.HEADER_FLOW_UUID)),
        expires_at=keeping.expires_at(headers),
        removed_arguments=tuple(keeping.removed_secrets(body, headers)),
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _broker_dead(stored: px.StoredMessage) -> bool:
    """Whether the broker dead-lettered ``stored`` itself (it was never parked by an engine)."""
    return (BROKER_DEATH_REASON in stored.headers
            and ext.HEADER_DEAD_REASON not in stored.headers)


def _broker_death(headers: Mapping[str, Any], exchange: str) -> dict[str, Any]:
    """Why and from which topic the broker dead-lettered a request, as dead-letter headers."""
    queue = str(headers.get(BROKER_DEATH_QUEUE) or "")
    reason = str(headers.get(BROKER_DEATH_REASON))
    return {ext.HEADER_DEAD_REASON: _BROKER_REASONS.get(reason, f"dead-lettered by the broker: "
                                                                f"{reason}"),
            ext.HEADER_DEAD_TOPIC: queue.removeprefix(f"{exchange}_")}


def _adopted_headers(stored: px.StoredMessage, exchange: str, now: float,
                     ttl: float) -> dict[str, Any]:
    """The headers a broker dead-lettered request is parked again with."""
    headers = dict(stored.headers)
    headers.update(_broker_death(headers, exchange))
    headers.update({
        ext.HEADER_DEAD_AT: now,
        ext.HEADER_DEAD_WORKERS: [],
        keeping.HEADER_DEAD_EXPIRES: now + ttl,
    })
    # What the broker added, and a signature that covered other headers.
    return {k: v for k, v in headers.items()
            if not k.startswith(("x-death", "x-first-death-", "x-last-death-",
                                 "x-delivery-count")) and k not in sg.SIGNATURE_HEADERS}


def park(proxy: px.Proxy, request: Parkable, headers: Mapping[str, Any], reason: str,
         topic: str, workers: list[str], reply_to: str, ttl: float = DEFAULT_TTL,
         clock: Callable[[], float] = time.time) -> None:
    """Bury ``request`` (sent with ``headers``) as a dead letter, with why and where.

    Its secret arguments are left out, and it expires ``ttl`` seconds from now (expired
    letters at the head of the queue are swept out first, where the broker has no TTL).
    """
    now = clock()
    _sweep_head(proxy, now)
    dead = {k: v for k, v in headers.items() if k != pr.HEADER_DEADLINE}
    dead.update({
        ext.HEADER_DEAD_REASON: reason,
        ext.HEADER_DEAD_TOPIC: topic,
        ext.HEADER_DEAD_AT: now,
        ext.HEADER_DEAD_WORKERS: list(workers),
        keeping.HEADER_DEAD_EXPIRES: now + ttl,
    })
    body = keeping.kept_body(request.to_dict(), sa.names(headers))
    # ``expiration`` is the broker's own TTL where it has one (RabbitMQ, flowengine-fs): a
    # per-message TTL, so a queue declared before it (or by an engine with another ttl)
    # never clashes over queue arguments.
    proxy.publish(_Replay(body), ext.DEAD_LETTER_ROUTING_KEY, reply_to=reply_to,
                  correlation_id=request.request_id, headers=dead, expiration=ttl)


def _sweep_head(proxy: px.Proxy, now: float) -> None:
    """Drop expired letters from the head of the queue (the oldest), one look each."""
    try:
        while proxy.take(ext.DEAD_LETTER_ROUTING_KEY,
                         lambda m: keeping.expired(m.headers, now), limit=1) is not None:
            pass
    except Exception as err:  # tidying must never keep a request from being parked
        LOG.warning("Could not sweep expired dead letters: %s", err)


class DeadLetters:
    """Lists and requeues the dead letters of one exchange.

    Args:
        exchange: the exchange engines and workers use.
        url, transport, transport_options, taskflow_compat: broker settings, as for workers.
        deadline: seconds a requeued request may wait for a worker before it is void.
        signing: signs requeued requests (default: the key in ``FLOWENGINE_SIGNING_KEY``).
    """

    def __init__(self, exchange: str, url: str | None = None,
                 transport: TransportSpec | None = None,
                 transport_options: Mapping[str, Any] | None = None,
                 taskflow_compat: bool = False, deadline: float = pr.REQUEST_TIMEOUT,
                 signing: sg.Signing | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if signing is None:
            # TaskFlow peers neither sign nor check: a requeued request goes to them as is.
            signing = sg.Signing() if taskflow_compat else sg.Signing.from_options()
        #: Reached through the process's client for this broker (its connections are shared
        #: with the process's engines), borrowed for each operation.
        self.broker = Broker(exchange, url=url, transport=transport,
                             transport_options=transport_options,
                             taskflow_compat=taskflow_compat, signing=signing)
        self._deadline = deadline
        self._clock = clock
        self._exchange = exchange

    def _adopt(self, proxy: Publisher) -> None:
        """Park again, as an engine would, what the broker dead-lettered itself: without its
        secret arguments, with a reason, a topic and an expiry."""
        now = self._clock()
        while (stored := proxy.take(ext.DEAD_LETTER_ROUTING_KEY, _broker_dead)) is not None:
            headers = _adopted_headers(stored, self._exchange, now, DEFAULT_TTL)
            body = keeping.kept_body(stored.json(), sa.names(stored.headers))
            proxy.publish(_Replay(body), ext.DEAD_LETTER_ROUTING_KEY,
                          reply_to=stored.properties.get("reply_to"),
                          correlation_id=stored.properties.get("correlation_id"),
                          headers=headers, expiration=DEFAULT_TTL)

    def list(self) -> list[DeadLetter]:
        """Every parked request, oldest first (expired ones are swept out; the others stay)."""
        with cl.borrowed(self.broker) as client:
            self._adopt(client.proxy)
            letters = [_describe(m, self._exchange)
                       for m in client.proxy.browse(ext.DEAD_LETTER_ROUTING_KEY)]
            now = self._clock()
            live = []
            for letter in letters:
                if letter.expires_at is not None and now >= letter.expires_at:
                    self._discard(client.proxy, letter.id)
                else:
                    live.append(letter)
            return live

    def get(self, letter_id: str) -> DeadLetter:
        """The parked request ``letter_id``; raise NotFound if there is no such id."""
        for letter in self.list():
            if letter.id == letter_id:
                return letter
        raise exc.NotFound(f"No dead letter with id {letter_id!r}")

    def discard(self, letter_id: str) -> bool:
        """Delete a parked request for good; False if there is no such id."""
        with cl.borrowed(self.broker) as client:
            return self._discard(client.proxy, letter_id)

    def _discard(self, proxy: Publisher, letter_id: str) -> bool:
        return proxy.take(ext.DEAD_LETTER_ROUTING_KEY,
                          lambda m: _describe(m, self._exchange).id == letter_id) is not None

    def requeue(self, letter_id: str) -> DeadLetter:
        """Send one parked request back to its topic.

        Raises:
            NotFound: There is no such id (or it expired), or it names no topic.
            RequeueRefused: Its secret arguments were removed when it was parked (it is left
                parked: re-run it inside its resumed flow).
        """
        with cl.borrowed(self.broker) as client:
            return self._requeue(client.proxy, letter_id)

    def _requeue(self, proxy: Publisher, letter_id: str) -> DeadLetter:
        now = self._clock()
        stored = proxy.take(
            ext.DEAD_LETTER_ROUTING_KEY,
            lambda m: (_describe(m, self._exchange).id == letter_id
                       and not keeping.expired(m.headers, now)))
        if stored is None:
            raise exc.NotFound(f"No dead letter with id {letter_id!r}")
        letter = _describe(stored, self._exchange)
        if not letter.topic or letter.removed_arguments:
            # Put back as it was: an operator may still resume its flow, or discard it.
            proxy.publish(_Replay(stored.json()), ext.DEAD_LETTER_ROUTING_KEY,
                          reply_to=stored.properties.get("reply_to"),
                          correlation_id=stored.properties.get("correlation_id"),
                          headers={k: v for k, v in stored.headers.items()
                                   if k not in sg.SIGNATURE_HEADERS},
                          expiration=_left(letter, now))
        if not letter.topic:
            raise exc.NotFound(f"Dead letter {letter_id!r} does not say which topic it was for")
        if letter.removed_arguments:
            raise keeping.RequeueRefused(removed_message(letter))
        # Its old signature covers the old headers: the request is signed afresh (or not).
        headers = {k: v for k, v in stored.headers.items()
                   if not k.startswith("x-flowengine-dead-") and k not in sg.SIGNATURE_HEADERS}
        headers[pr.HEADER_DEADLINE] = time.time() + self._deadline
        proxy.publish(_Replay(stored.json()), letter.topic,
                      reply_to=stored.properties.get("reply_to"),
                      correlation_id=stored.properties.get("correlation_id"),
                      headers=headers)
        return letter

    def close(self) -> None:
        """Nothing to release: the connections are the process client's, which closes once
        nothing has used it for a while (kept for callers that close what they open)."""


def _left(letter: DeadLetter, now: float) -> float | None:
    """Seconds ``letter`` has left to live (for the broker's TTL), if it says."""
    return None if letter.expires_at is None else max(letter.expires_at - now, 0.001)


def removed_message(letter: DeadLetter) -> str:
    """Why ``letter`` cannot be sent again as it is, and what to do instead."""
    names = ", ".join(repr(n) for n in letter.removed_arguments)
    stores = " ".join(f"--store {n}=VALUE" for n in letter.removed_arguments)
    flow = letter.flow_uuid or "FLOW_ID"
    return (f"Dead letter {letter.id!r} (task {letter.task_name!r}) cannot be sent again as it "
            f"is: its secret argument(s) {names} were removed when it was parked (dead letters "
            f"never keep secrets). Re-run it inside its flow instead: flowengine dead-letters "
            f"requeue {letter.id} --resume --backend URI {stores} (flow {flow})")
