"""Ending a delayed request's wait on a broker that times delays itself (beanstalkd).

The engine's clock and the broker client's (``held_publishes.CLOCK``) are injected in these
tests, so moving them ends every wait the engine or the client times. beanstalkd times a delayed
job itself: a test ends that wait by kicking the job, whose handle the engine stores with the
atom right after putting it.
"""

from __future__ import annotations

import time
from typing import Any

from flowengine import exceptions as exc
from flowengine.engines.actions import META_DELAYED_JOB

#: Seconds to wait for a job's handle to be stored.
WAIT = 30.0


def broker_times_delays(engine: Any) -> bool:
    """Whether ``engine`` sends delayed requests to a broker that times them itself."""
    executor = getattr(engine, "worker_executor", None)
    return executor is not None and bool(executor.client.proxy.traits.native_delay)


def delayed_job(engine: Any, atom: str) -> object:
    """The handle of the delayed job stored with ``atom`` (None if none, or if the engine, on
    another thread, has not stored its atoms yet)."""
    storage = engine.storage
    try:
        detail = storage.flow_detail.find(storage.get_atom_uuid(atom))
    except exc.NotFound:  # a run starting on another thread has not prepared its atoms yet
        return None
    return None if detail is None else detail.meta.get(META_DELAYED_JOB)


def kick_delayed_job(engine: Any, atom: str, old_job: object = None) -> None:
    """Kick ``atom``'s delayed job once its handle is stored (``old_job``: an earlier run's
    handle, taken back, which is not the one to kick)."""
    import greenstalk  # the beanstalk extra, present wherever a beanstalkd suite runs

    from flowengine.worker_based.broker import transport_beanstalk_delays as native

    deadline = time.monotonic() + WAIT
    while not isinstance(job := delayed_job(engine, atom), str) or job == old_job:
        assert time.monotonic() < deadline, "the delayed job's handle was never stored"
        time.sleep(0.01)
    address, job_id = native.parse(job)
    with greenstalk.Client(address) as client:
        client.kick_job(job_id)
