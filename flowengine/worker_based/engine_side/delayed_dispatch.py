"""Delayed dispatch: a request sent now that no worker may take before its delay ends.

A worker-based engine dispatches the first tasks of a retried subflow this way, with what is
left of the retry controller's wait (doc/priorities.rst). Where the broker holds delays itself
(:attr:`~flowengine.worker_based.broker.connection.BrokerTraits.native_delay`: beanstalkd) the
request is published at once with header ``x-flowengine-delay`` and the broker keeps it
delayed; the job's handle (see
:meth:`~flowengine.worker_based.broker.publisher.Publisher.delay_receipt`) lets the engine
delete it while it waits. Elsewhere the process's broker client holds it
(:class:`~flowengine.worker_based.engine_side.held_publishes.HeldPublishes`) and publishes
it when due.
Either way it can be withdrawn until its delay ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

from flowengine.worker_based import client as bc
from flowengine.worker_based import extensions as ext
from flowengine.worker_based.broker import publisher as pb

LOG = logging.getLogger(__name__)


def dispatch_later(client: bc.Client, request_id: str, seconds: float,
                   headers: MutableMapping[str, Any], publish: Callable[[], None]) -> str | None:
    """Publish the request ``request_id`` so that no worker takes it for ``seconds``.

    ``publish`` publishes it with ``headers`` (both as :meth:`_dispatch` built them). Returns
    the broker's handle of the delayed job where the broker holds it (beanstalkd), else None.
    """
    if client.proxy.traits.native_delay:
        headers[ext.HEADER_DELAY] = seconds
        with client.proxy.delay_receipt() as put:
            publish()
        return put.handle
    client.held.hold(request_id, seconds, publish)
    return None


def withdraw(client: bc.Client | None, request_id: str, job: str | None) -> bool:
    """Take back a request sent with a delay before any worker takes it; True if it was taken
    back (it will never reach a worker): still held here, or a beanstalkd job still delayed
    or ready. False if a worker holds it, it is gone, or it is not known here."""
    if client is not None and client.held.withdraw(request_id):
        return True
    if job is None:
        return False
    try:
        return pb.take_back_delayed(job)
    except Exception as err:  # the worker's own checks (revoked ids) still stand
        LOG.warning("Could not delete delayed job %s: %s", job, err)
        return False


def delete_jobs(jobs: Iterable[str]) -> int:
    """Delete the delayed jobs a dead predecessor left (stored handles); how many were."""
    deleted = 0
    for job in jobs:
        try:
            deleted += pb.take_back_delayed(job)
        except Exception as err:
            LOG.warning("Could not delete delayed job %s left by a previous run: %s", job, err)
    return deleted
