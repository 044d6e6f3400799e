"""The error for a task class no known worker runs, saying what the workers there do run.

A request for such a class would otherwise wait out the whole ``transition_timeout`` (a
minute by default) and end with a timeout that does not say why: a worker started without
the class's ``--task``, a class defined in ``__main__``, a rolling deploy that dropped it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from flowengine.worker_based.broker.queues import QueueInspector, QueuesNotListed
from flowengine.worker_based.topics import is_topic
from flowengine.worker_based.types import TopicWorker

if TYPE_CHECKING:
    from flowengine.worker_based.broker_spec import Broker

LOG = logging.getLogger(__name__)

#: Task classes listed per topic before the rest are only counted (a worker may run hundreds).
_SHOWN = 20


def describe(task_cls: str, task_name: str, topics: Sequence[str],
             workers: Iterable[TopicWorker], waited: float, major: str | None = None) -> str:
    """Why task ``task_name`` (class ``task_cls``, major version ``major``) cannot run, naming
    what each topic serves (and, when the class is served at other versions, which)."""
    served: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    offered: dict[str, list[str]] = {}
    workers = list(workers)
    for worker in workers:
        served.setdefault(worker.topic, set()).update(worker.tasks)
        counts[worker.topic] = counts.get(worker.topic, 0) + 1
        if worker.performs(task_cls) and task_cls in worker.versions:
            offered.setdefault(worker.versions[task_cls], []).append(worker.identity)
    where = ", ".join(repr(t) for t in (topics or sorted(served)))
    if major is not None and offered:
        on_offer = "; ".join(f"version {version} by {', '.join(sorted(ids))}"
                             for version, ids in sorted(offered.items()))
        return (f"Task {task_name!r}: no live worker on topic(s) {where} runs version {major}.x "
                f"of task class {task_cls!r} (waited {waited:.1f}s); on offer: {on_offer}. "
                f"Start a worker with that version's code, or run this flow with code of a "
                f"version on offer.")
    lines = [f"Task {task_name!r}: no live worker on topic(s) {where} runs task class "
             f"{task_cls!r} (waited {waited:.1f}s). Start a worker with --task {task_cls}, "
             f"or define the class in an importable module (not __main__)."]
    for topic in sorted(served):
        tasks = sorted(served[topic])
        shown = ", ".join(tasks[:_SHOWN]) + (f" and {len(tasks) - _SHOWN} more"
                                            if len(tasks) > _SHOWN else "")
        lines.append(f"The {counts[topic]} worker(s) on topic {topic!r} run: "
                     f"{shown or 'nothing'}")
    return "\n".join(lines)


def no_worker(exchange: str, topics: Sequence[str], queues: Sequence[str] | None) -> str:
    """Why requests waited out their timeout with no worker known at all, naming the exchange
    and topics, and the topic queues of other exchanges the broker has (``queues``: every
    queue's name, None where the broker cannot list them): a typo in the exchange name looks
    like this from the engine's side."""
    named = ", ".join(map(repr, topics))
    text = (f": no worker was known on topic(s) {named} of exchange {exchange!r} (none "
            f"answered discovery or announced itself)")
    if not queues:
        return text
    elsewhere = sorted({queue[:-len(topic) - 1] for queue in queues for topic in topics
                        if queue.endswith(f"_{topic}") and queue != f"{exchange}_{topic}"
                        and len(queue) > len(topic) + 1})
    ours = sorted({queue[len(exchange) + 1:] for queue in queues
                   if queue.startswith(f"{exchange}_")
                   and is_topic(queue[len(exchange) + 1:])} - set(topics))
    if elsewhere:
        text += f"; the broker has queues for {named} on exchange(s) " + ", ".join(
            map(repr, elsewhere))
    if ours:
        text += f"; exchange {exchange!r} has queues for topic(s) " + ", ".join(
            map(repr, ours[:_SHOWN]))
    return text


def listed_queues(broker: Broker) -> list[str] | None:
    """Every queue the broker has, where it can list them (beanstalkd, Redis, flowengine-fs),
    else None (AMQP, memory).

    Called once an engine gives up on finding any worker: an error path, so a connection of
    its own is affordable, and nothing it raises may replace the error being reported.
    """
    try:
        with QueueInspector(broker.url, broker.transport, broker.transport_options) as inspector:
            return inspector.names("")
    except QueuesNotListed:
        return None
    except Exception as err:  # the hint is optional; the timeout is what is reported
        LOG.debug("Could not list the queues of %s: %s", broker, err)
        return None
