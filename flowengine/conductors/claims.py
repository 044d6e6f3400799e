"""Keeping a conductor's claims alive, and fencing off a job whose claim was lost.

A :class:`ClaimKeeper` renews every claim its conductor holds (and the conductor's own
registration) every third of the claim's length, on one thread, with an injected clock.

A :class:`ClaimFence` answers "may this conductor still change this job's stored progress?"
from the local clock alone: yes until the claim could have ended (the last renewal's send time
plus the claim's length, minus a safety margin). The engine's persistence goes through the fence
(:mod:`flowengine.conductors.fencing`), and an atom's RUNNING state is stored before it is
dispatched, so a conductor that was frozen or cut off past its claim cannot start another atom
of that job when it wakes: the write fails before anything runs, even before the keeper's
thread has had a chance to notice the loss. A refused write halts the engine
(:class:`~flowengine.exceptions.RunHalted`): it reverts nothing, since the job is another
conductor's now and its completed work must stand.

The keeper tells the conductor as soon as a claim is known lost (the board says another owns
it) or may have lapsed (renewals failed for longer than the claim lasts, whatever the reason),
so the conductor halts the job's engine rather than waiting for its next write. Both run on
:func:`~flowengine.jobs.lease_clock.lease_clock`, which keeps counting while the host is
suspended: a host woken from a long sleep does not believe it still holds its claims.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from flowengine import exceptions as exc
from flowengine.jobs import base
from flowengine.jobs.lease_clock import lease_clock
from flowengine.types.entity import Entity

__all__ = ["ClaimFence", "ClaimKeeper", "FencedOff"]

LOG = logging.getLogger(__name__)

Clock = Callable[[], float]


class FencedOff(exc.StorageFailure):
    """A write for a job whose claim this conductor may no longer hold was refused."""


class ClaimFence:
    """Whether a claim is still certainly held, by the local clock.

    Args:
        job: The job claimed.
        ttl: The claim's length in seconds.
        clock: The lease clock (injected in tests).
        claimed_at: When the claim was requested (``clock()`` if omitted).
    """

    def __init__(self, job: base.Job, ttl: float, clock: Clock = lease_clock,
                 claimed_at: float | None = None) -> None:
        self.job = job
        # The service starts the lease when it receives the request, after we sent it; the
        # margin covers the two clocks running at slightly different rates.
        self._span = ttl - min(ttl * 0.2, 2.0)
        self._clock = clock
        self._valid_until = (clock() if claimed_at is None else claimed_at) + self._span
        self._lost: str | None = None

    def renewed(self, sent_at: float) -> None:
        """The claim was renewed by a request sent at ``sent_at``."""
        self._valid_until = max(self._valid_until, sent_at + self._span)

    def lose(self, reason: str) -> None:
        """The claim is known to be gone."""
        self._lost = reason

    @property
    def held(self) -> bool:
        """True while the claim is certainly held."""
        return self._lost is None and self._clock() < self._valid_until

    def refusal(self, what: str) -> FencedOff | None:
        """The :class:`FencedOff` a write of ``what`` gets now (None while the claim is held)."""
        if self._lost is not None:
            why = self._lost
        elif self._clock() >= self._valid_until:
            why = "its claim was not renewed in time (it may have expired)"
        else:
            return None
        return FencedOff(f"Refused to store {what} of job {self.job.uuid} ({self.job.name}): "
                         f"{why}")

    def check(self, what: str) -> None:
        """Raise :class:`FencedOff` (naming ``what`` and the job) unless the claim is held."""
        refused = self.refusal(what)
        if refused is not None:
            raise refused


class ClaimKeeper:
    """Renews a conductor's claims and registration every ``interval`` seconds.

    Args:
        board: The jobboard.
        owner: The conductor's name (the claims' owner).
        entity: The conductor's registration, refreshed with the claims (None: none).
        clock: The lease clock (injected in tests).
        interval: Seconds between renewals (a third of the board's ``claim_ttl`` if None).
    """

    def __init__(self, board: base.JobBoard, owner: str, entity: Entity | None = None,
                 clock: Clock = lease_clock, interval: float | None = None) -> None:
        self._board = board
        self._owner = owner
        self._entity = entity
        self._clock = clock
        self._interval = interval if interval is not None else board.options.claim_ttl / 3
        self._lock = threading.Lock()
        self._held: dict[str, tuple[ClaimFence, Callable[[base.Job], None]]] = {}
        self._next_due = clock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, job: base.Job, on_lost: Callable[[base.Job], None],
             claimed_at: float | None = None) -> ClaimFence:
        """Start renewing ``job``'s claim; ``on_lost(job)`` is called (once, on the keeper's
        thread) when it is lost or may have lapsed: read ``fence.refusal`` for why."""
        fence = ClaimFence(job, self._board.options.claim_ttl, self._clock, claimed_at)
        with self._lock:
            self._held[job.uuid] = (fence, on_lost)
        return fence

    def release(self, job: base.Job) -> None:
        """Stop renewing ``job``'s claim."""
        with self._lock:
            self._held.pop(job.uuid, None)

    def tick(self) -> float:
        """Renew everything if due; return the seconds until the next renewal."""
        now = self._clock()
        if now < self._next_due:
            return self._next_due - now
        self._next_due = now + self._interval
        with self._lock:
            held = list(self._held.values())
        for fence, on_lost in held:
            self._renew(fence, on_lost)
        if self._entity is not None:
            try:
                self._board.register_entity(self._entity)
            except exc.TaskFlowException as err:
                LOG.warning("Could not refresh the registration of %s: %s", self._owner, err)
        return max(0.0, self._next_due - self._clock())

    def _renew(self, fence: ClaimFence, on_lost: Callable[[base.Job], None]) -> None:
        job, sent_at = fence.job, self._clock()
        try:
            self._board.keep_alive(job, self._owner)
        except base.ClaimLost as err:
            LOG.warning("Conductor %s lost its claim on job %s (%s): %s", self._owner, job.uuid,
                        job.name, err)
            fence.lose(f"the claim was lost: {err}")
        except exc.TaskFlowException as err:
            if fence.held:
                # Cannot tell (the service is unreachable): held until the claim could have
                # ended, and the next renewal may get through before then.
                LOG.warning("Could not renew the claim on job %s (%s): %s", job.uuid, job.name,
                            err)
                return
            LOG.warning("Conductor %s may have lost its claim on job %s (%s): not renewed in "
                        "time (%s)", self._owner, job.uuid, job.name, err)
            fence.lose(f"its claim could not be renewed before it could have expired: {err}")
        else:
            fence.renewed(sent_at)
            return
        self.release(job)
        try:
            on_lost(job)
        except Exception:
            LOG.exception("Handling the lost claim on job %s failed", job.uuid)

    def start(self) -> None:
        """Renew now, then every interval on a daemon thread until :meth:`stop`."""
        self._stopping.clear()
        self._next_due = self._clock()
        self.tick()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"claims-{self._owner}")
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                pause = self.tick()
            except Exception:  # the keeper must outlive any one failure
                LOG.exception("Renewing the claims of %s failed", self._owner)
                pause = self._interval
            if self._stopping.wait(pause):
                return

    def stop(self) -> None:
        """Stop renewing (the claims still held then expire on their own)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
