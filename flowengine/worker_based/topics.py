"""What waits on each worker topic of an exchange, as far as its broker can tell.

beanstalkd tells everything: :func:`topic_stats` lists the exchange's topic tubes and reads
``stats-tube`` for each (ready, reserved = running, delayed, and the connections watching it =
its workers). Redis and flowengine-fs list the topics bound to the exchange and tell ready
messages; AMQP brokers tell ready messages and consumers of the topics named. Dead letters are
counted per topic on every broker, from the dead-letter queue's headers. What a broker cannot
tell is None.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from flowengine.worker_based import dead_letters as dl
from flowengine.worker_based import extensions as ext
from flowengine.worker_based.broker.connection import TransportSpec
from flowengine.worker_based.broker.queues import QueueCounts, QueueInspector, QueuesNotListed

# Queues of an exchange that are not worker topics: engines' reply queues (their uuid, with
# or without dashes: the process-wide client's has none), the workers' control queues and the
# dead letters.
_NOT_TOPICS = re.compile(
    r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}|"
    + re.escape("flowengine.worker.") + ".*|" + re.escape(ext.DEAD_LETTER_ROUTING_KEY))


def is_topic(name: str) -> bool:
    """Whether ``name`` (a queue's name less its ``<exchange>_`` prefix) is a worker topic."""
    return not _NOT_TOPICS.fullmatch(name)


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
                transport: TransportSpec | None = None,
                transport_options: Mapping[str, Any] | None = None,
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
    with QueueInspector(url, transport, options) as broker:
        named = list(topics)
        if not named:
            prefix = f"{exchange}_"
            try:
                listed = broker.names(prefix)
            except QueuesNotListed as err:
                raise TopicsNotListed(f"{err} cannot list the queues of exchange "
                                      f"{exchange!r}: name the topics") from None
            named = [queue[len(prefix):] for queue in listed if is_topic(queue[len(prefix):])]
        named = sorted(set(named) | {topic for topic in dead if topic and not topics})
        return [_stats(topic, broker.counts(f"{exchange}_{topic}"), dead[topic])
                for topic in named]


def _stats(topic: str, counts: QueueCounts, dead: int) -> TopicStats:
    return TopicStats(topic, counts.ready, counts.running, counts.delayed, dead,
                      counts.consumers)
