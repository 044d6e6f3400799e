"""The headers flowengine peers add to TaskFlow's messages, and this process's origin.

TaskFlow peers ignore headers, so flowengine's additions travel there (every value a str, int
or float). These names are part of :mod:`~flowengine.worker_based.protocol`, which re-exports
them; :mod:`~flowengine.worker_based.extensions` names the headers of leases and heartbeats.
"""

from __future__ import annotations

import os
import socket

# Header extensions (flowengine peers only; every value is a str, int or float).
#: 2: an engine takes a short task's outcome as its only reply (no RUNNING first), and a
#: worker says when it gives a request back unstarted (see extensions.EVENT_RETURNED).
PROTOCOL_VERSION = 2
#: The first protocol version whose engines take an outcome without a RUNNING reply first.
QUIET_START_PROTOCOL = 2
#: What an engine that wants a RUNNING reply before every outcome puts on its requests (its
#: option ``quiet_start`` off): workers then say RUNNING at once, as TaskFlow's do.
RUNNING_FIRST_PROTOCOL = 1
HEADER_PROTOCOL = "x-flowengine-protocol"  # int: the sender speaks flowengine protocol N
HEADER_REQUEST_ID = "x-flowengine-request-id"  # str: unique per attempt, echoed in replies
HEADER_ATTEMPT = "x-flowengine-attempt"  # int: 1 for the first attempt
HEADER_ATOM_UUID = "x-flowengine-atom-uuid"  # str
#: str: the flow the request is for. TaskFlow engines name their reply queue after the flow, so
#: ``reply_to`` says it; a flowengine process has one reply queue for all its flows.
HEADER_FLOW_UUID = "x-flowengine-flow-uuid"
HEADER_TASK_NAME = "x-flowengine-task-name"  # str
HEADER_ORIGIN = "x-flowengine-origin"  # str: "host:pid" of the sender
HEADER_WORKER = "x-flowengine-worker"  # str: the replying worker's id
HEADER_CAPACITY = "x-flowengine-capacity"  # int: the worker's free task slots
HEADER_DEADLINE = "x-flowengine-deadline"  # float: UNIX time after which a request is void
HEADER_TIME_LIMIT = "x-flowengine-time-limit"  # float: seconds the task may run
HEADER_WORKER_STATUS = "x-flowengine-worker-status"  # str: WORKER_ONLINE / WORKER_OFFLINE
WORKER_ONLINE = "online"
WORKER_OFFLINE = "offline"


_ORIGIN: str | None = None


def _forget_origin() -> None:
    global _ORIGIN
    _ORIGIN = None


# A forked child has its own pid. Resetting at fork, rather than comparing os.getpid() on every
# call, keeps a system call off every message sent.
os.register_at_fork(after_in_child=_forget_origin)


def origin() -> str:
    """This process as ``host:pid``, the value of :data:`HEADER_ORIGIN` (cached per process)."""
    global _ORIGIN
    if _ORIGIN is None:
        _ORIGIN = f"{socket.gethostname()}:{os.getpid()}"
    return _ORIGIN
