"""Delivery order of flowengine-fs queues: highest priority first, FIFO within a priority.

A message file's name starts with its *rank*, ``9 - priority`` (priority 0..9, AMQP's meaning:
higher first; absent is 0), then ``-`` and the sender's stamp (see
:class:`~flowengine.worker_based.broker.transport_fs_files.Stamper`). A consumer claims names in
sorted order, so rank 0 (priority 9) goes first and, within a rank, send order holds as before. Ten
levels, the same as RabbitMQ's queues as flowengine declares them.

A consumer lists a queue once and claims from that listing (one ``listdir`` for many
messages); a message published after the listing, even a more urgent one, waits until the
consumer lists again. It lists again when the listing is used up or older than
:data:`RELIST_INTERVAL` seconds (transport option ``relist_interval``), so a backlog delays an
urgent message by at most that long. Listing is O(n log n) in the queue's length, once per
interval at most while a backlog lasts.
"""

from __future__ import annotations

#: Highest priority a name can carry (kombu's virtual channels clamp to 0..9).
MAX_PRIORITY = 9
#: Seconds a consumer claims from one listing of a queue before listing it again.
RELIST_INTERVAL = 0.5
_SEPARATOR = "-"


def ranked(name: str, rank: int) -> str:
    """``name`` prefixed with ``rank`` (``9 - priority``, clamped to 0..9)."""
    return f"{max(0, min(rank, MAX_PRIORITY))}{_SEPARATOR}{name}"


def stamp_of(name: str) -> str:
    """``name`` without its rank prefix (names written before ranks existed have none)."""
    head, separator, rest = name.partition(_SEPARATOR)
    return rest if separator and len(head) == 1 else name
