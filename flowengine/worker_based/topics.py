"""What waits on each worker topic of an exchange, as far as its broker can tell.

beanstalkd tells everything: :func:`topic_stats` lists the exchange's topic tubes and reads
``stats-tube`` for each (ready, reserved = running, delayed, and the connections watching it =
its workers). AMQP brokers tell ready messages and consumers of the topics named; Redis and
flowengine-fs tell ready messages. Dead letters are counted per topic on every broker, from the
dead-letter queue's headers. What a broker cannot tell is None.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from flowengine.worker_based import dead_letters as dl
from flowengine.worker_based import extensions as ext
from flowengine.worker_based.broker.connection import connect

# Queues of an exchange that are not worker topics: engines' reply queues (their uuid), the
# workers' control queues and the dead letters.
_NOT_TOPICS = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|"
    + re.escape("flowengine.worker.") + ".*|" + re.escape(ext.DEAD_LETTER_ROUTING_KEY))


@dataclasses.dataclass(frozen=True)
class TopicStats:
    """One worker topic's queue: counts are None where the broker cannot tell."""

    topic: str
    ready: int | None
    running: int | None
    delayed: int | None
    dead: int
    workers: int | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able view (for ``--json`` output)."""
        return dataclasses.asdict(self)


class TopicsNotListed(ValueError):
    """The broker cannot list its queues, and no topic was named."""


def topic_stats(exchange: str, topics: Iterable[str] = (), url: str | None = None,
                transport: Any = None, transport_options: Mapping[str, Any] | None = None,
                taskflow_compat: bool = False) -> list[TopicStats]:
    """The topics named (every topic of ``exchange``, where the broker can list them), sorted.

    Raises:
        TopicsNotListed: No topic was named and the broker cannot list its queues.
        kombu's connection errors: The broker cannot be reached.
    """
    options = dict(transport_options or {})
    letters = dl.DeadLetters(exchange, url=url, transport=transport, transport_options=options,
                             taskflow_compat=taskflow_compat)
    try:
        dead = Counter(letter.topic for letter in letters.list())
    finally:
        letters.close()
    conn, _ = connect(url, transport, options)
    with conn:
        channel = conn.channel()
        named = list(topics)
        listing = getattr(channel, "queues", None)
        if not callable(listing):  # kombu's memory channel has a ``queues`` dict, no listing
            listing = None
        if not named:
            if listing is None:
                raise TopicsNotListed(
                    f"{conn.transport.driver_type} cannot list the queues of exchange "
                    f"{exchange!r}: name the topics")
            prefix = f"{exchange}_"
            named = [queue[len(prefix):] for queue in listing(prefix)
                     if not _NOT_TOPICS.fullmatch(queue[len(prefix):])]
        named = sorted(set(named) | {topic for topic in dead if topic and not topics})
        amqp = conn.transport.driver_type == "amqp"
        return [_stats(conn, channel, amqp, f"{exchange}_{topic}", topic, dead[topic])
                for topic in named]


def _stats(conn: Any, channel: Any, amqp: bool, queue: str, topic: str, dead: int
           ) -> TopicStats:
    tube = getattr(channel, "queue_stats", None)
    if tube is not None:  # beanstalkd
        stats = tube(queue)
        return TopicStats(topic, stats["ready"], stats["reserved"], stats["delayed"], dead,
                          stats["watching"])
    try:
        # A channel each: an AMQP broker closes the channel a passive declare fails on.
        with conn.channel() as own:
            declared = own.queue_declare(queue, passive=True)
    except conn.channel_errors:  # no such queue (yet): nothing waits in it
        return TopicStats(topic, 0, None, None, dead, 0 if amqp else None)
    return TopicStats(topic, int(declared.message_count), None, None, dead,
                      int(declared.consumer_count) if amqp else None)
