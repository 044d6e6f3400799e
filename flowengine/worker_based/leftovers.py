"""What a dead engine left in the broker, taken back as the engine resuming its flow starts.

A worker-based engine stores the id of every attempt it sends with the atom, and the handle of
a delayed job (beanstalkd) right after putting it. The engine that resumes the flow after a
crash sends those atoms again as new attempts; before that, its executor asks every flowengine
worker to drop the old attempt ids unrun (CANCEL) and deletes the old delayed jobs
(:mod:`~flowengine.worker_based.delayed_dispatch`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from flowengine.worker_based import cancellation as cn
from flowengine.worker_based import delayed_dispatch as dd
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import protocol as pr
from flowengine.worker_based.broker import proxy as px

LOG = logging.getLogger("flowengine.worker_based.executor")


class Leftovers:
    """A mixin of the executor: what to take back at start, and taking it back."""

    def __init__(self) -> None:
        self._stale: list[str] = []
        self._stale_jobs: list[str] = []

    @property
    def _proxy(self) -> px.Proxy:
        raise NotImplementedError

    def revoke_at_start(self, request_ids: Iterable[str]) -> None:
        """Ask every flowengine worker, as this executor starts, not to run ``request_ids``:
        requests a dead engine left queued, which a resumed one sends again as new attempts.

        A worker that takes one of them later settles it unrun (see
        :mod:`~flowengine.worker_based.cancellation`); one already running is not stopped.
        """
        self._stale.extend(request_ids)

    def delete_at_start(self, jobs: Iterable[str]) -> None:
        """Delete, as this executor starts, the delayed jobs (stored handles) a dead engine
        left waiting in the broker."""
        self._stale_jobs.extend(jobs)

    def _take_back_leftovers(self) -> None:
        jobs, self._stale_jobs = self._stale_jobs, []
        if jobs:
            # Before the CANCEL: a job deleted here can never reach a worker that missed it.
            LOG.info("Deleted %d of %d delayed request(s) a previous run left",
                     dd.delete_jobs(jobs), len(jobs))
        stale, self._stale = self._stale, []
        if stale:
            self._revoke_ids(stale, "its engine's process died; the flow is resumed")

    def _revoke_ids(self, request_ids: list[str], why: str) -> None:
        headers = {pr.HEADER_PROTOCOL: pr.PROTOCOL_VERSION}
        for start in range(0, len(request_ids), cn.MAX_IDS):
            chunk = request_ids[start:start + cn.MAX_IDS]
            try:
                # Every flowengine worker hears it (TaskFlow workers do not).
                self._proxy.publish(cn.Cancel(chunk), ext.DISCOVER_ROUTING_KEY, headers=headers,
                                    declare_queue=False, confirm=False)
            except Exception as err:
                LOG.warning("Could not ask workers to drop %d request(s) (%s): %s; a worker "
                            "may still run them", len(chunk), why, err)
            else:
                LOG.info("Asked workers to drop %d request(s) unrun: %s", len(chunk), why)
