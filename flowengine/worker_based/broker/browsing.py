"""Browsing a queue: copies of what waits in it, for operator tools (dead letters).

Each message is taken and given back (requeued) in the order taken, so the queue is unchanged;
meant for quiet queues, not for queues that consumers drain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kombu

from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker.connection import StoredMessage


def visit(connection: kombu.Connection, target: kombu.Queue,
          wanted: Callable[[StoredMessage], bool], limit: int,
          remove_first_match: bool = False) -> list[StoredMessage]:
    """Copies of up to ``limit`` messages waiting in ``target``, each taken and given back.

    With ``remove_first_match``, the first one ``wanted`` accepts is removed instead, and is
    all that is returned (nothing, if none is). The rest are taken all the same: most
    transports (Redis, the memory and virtual ones) give a message back at the end of the
    queue, so only a queue taken whole comes back in its order.
    """
    seen: list[StoredMessage] = []
    held: list[Any] = []
    match: StoredMessage | None = None
    with connection.clone() as conn, conn.channel() as channel:
        queue = target(channel)
        queue.declare()
        try:
            while len(held) < limit:
                message = queue.get(no_ack=False, accept=[dp.JSON_CONTENT_TYPE])
                if message is None:
                    break
                stored = StoredMessage(
                    body=message.body if isinstance(message.body, bytes)
                    else str(message.body).encode(),
                    headers=dict(message.headers or {}),
                    properties=dict(message.properties or {}))
                if remove_first_match and match is None and wanted(stored):
                    message.ack()
                    match = stored
                    continue
                held.append(message)
                seen.append(stored)
        finally:
            # Given back in the order taken, so the queue keeps its order.
            for message in held:
                message.requeue()
    if remove_first_match:
        return [] if match is None else [match]
    return seen
