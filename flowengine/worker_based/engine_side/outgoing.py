"""What an engine's process sends its workers besides requests: revocations and stops, and the
headers a request carries.

Revocations (CANCEL) and stops (STOP) are broadcast to every flowengine worker's control queue,
or a STOP to the one worker that said it holds the request; TaskFlow workers hear neither. Both
are best effort: a worker also drops a request whose deadline passed, and a STOP is sent again
with each heartbeat of the request it concerns.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from flowengine.context import TaskContext
from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based import running_calls as rn
from flowengine.worker_based import secret_arguments as sa
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.engine_side import lifecycle as lc
from flowengine.worker_based.wire import headers as hd

LOG = logging.getLogger("flowengine.worker_based.executor")

_PROTOCOL = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION}


def request_headers(attempt: lc.Attempt, flow_uuid: str, atom_uuid: str,
                    context: TaskContext | None, secret: list[str], *,
                    quiet_start: bool) -> dict[str, Any]:
    """The headers of ``attempt``'s request: its ids, origin, deadline, time limit, lease,
    the task's context and the names of its secret arguments (``quiet_start`` False: its
    worker must say RUNNING before the outcome, whatever the task's length)."""
    policy = attempt.policy
    headers: dict[str, Any] = {
        pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION if quiet_start else hd.RUNNING_FIRST_PROTOCOL,
        pr.HEADER_REQUEST_ID: attempt.request_id,
        pr.HEADER_ATTEMPT: attempt.number,
        pr.HEADER_ATOM_UUID: atom_uuid,
        pr.HEADER_FLOW_UUID: flow_uuid,
        pr.HEADER_TASK_NAME: attempt.task_name,
        pr.HEADER_ORIGIN: pr.origin(),
    }
    if policy.timeout is not None:
        # Wall clock, for the worker: a request still queued after this is void, so one the
        # engine already failed never runs later as a ghost.
        headers[pr.HEADER_DEADLINE] = time.time() + policy.timeout
    if attempt.time_limit:
        headers[pr.HEADER_TIME_LIMIT] = attempt.time_limit
    headers.update(rn.context_headers(context))
    if policy.lease_timeout is not None:
        headers[ext.HEADER_HEARTBEAT] = policy.heartbeat_interval
        headers[ext.HEADER_LEASE] = policy.lease_timeout
    if secret:
        headers[sa.HEADER_SECRET_ARGS] = secret
    return headers


def revoke(proxy: px.Proxy, request_ids: list[str], why: str) -> None:
    """Ask every flowengine worker not to run ``request_ids`` (logged, never raised)."""
    for start in range(0, len(request_ids), cn.MAX_IDS):
        chunk = request_ids[start:start + cn.MAX_IDS]
        try:
            # Every flowengine worker hears it (TaskFlow workers do not).
            proxy.publish(cn.Cancel(chunk), ext.DISCOVER_ROUTING_KEY, headers=_PROTOCOL,
                          declare_queue=False, confirm=False)
        except Exception as err:
            LOG.warning("Could not ask workers to drop %d request(s) (%s): %s; a worker may "
                        "still run them", len(chunk), why, err)
        else:
            LOG.info("Asked workers to drop %d request(s) unrun: %s", len(chunk), why)


def stop(proxy: px.Proxy, request_id: str, task_name: str, reason: str,
         holder: str | None) -> None:
    """Ask ``holder`` (else every flowengine worker) to stop request ``request_id``: its flow
    is being cancelled. Not retried: the next heartbeat asks again."""
    key = ext.control_routing_key(holder) if holder else ext.DISCOVER_ROUTING_KEY
    try:
        proxy.publish(rn.Stop([request_id], reason), key, headers=_PROTOCOL,
                      declare_queue=False, confirm=False, retry=False)
    except Exception as err:
        LOG.warning("Could not ask workers to stop request %s of task %r: %s", request_id,
                    task_name, err)

