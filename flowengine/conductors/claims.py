"""Keeping a conductor's claims alive, and fencing off a job whose claim was lost.

A :class:`ClaimKeeper` renews every claim its conductor holds (and the conductor's own
registration) every third of the claim's length, on one thread, with an injected clock.

A :class:`ClaimFence` answers "may this conductor still change this job's stored progress?"
from the local clock alone: yes until the claim could have ended (the last renewal's send time
plus the claim's length, minus a safety margin). The engine's persistence goes through the fence
(:mod:`flowengine.conductors.fencing`), and an atom's RUNNING state is stored before it is
dispatched, so a conductor that was frozen or cut off past its claim cannot start another atom
of that job when it wakes: the write fails before anything runs, even before the keeper's
thread has had a chance to notice the loss. Since a check by the writer's clock cannot cover
a freeze between the check and the write, the fence also carries the claim's fencing token,
and the store refuses a write made under an older claim than one that has written to the flow
(:mod:`flowengine.persistence.fencing`). A refused write halts the engine
(:class:`~flowengine.exceptions.RunHalted`): it reverts nothing, since the job is another
conductor's now and its completed work must stand.

The keeper tells the conductor as soon as a claim is known lost (the board says another owns
it) or may have lapsed (renewals failed for longer than the claim lasts, whatever the reason),
so the conductor halts the job's engine rather than waiting for its next write. Both run on
:func:`~flowengine.jobs.lease_clock.lease_clock`, which keeps counting while the host is
suspended: a host woken from a long sleep does not believe it still holds its claims.

Both are written for any lease, not only a job's claim: :class:`LeaseFence` and
:meth:`ClaimKeeper.hold_lease` keep and fence the leases of resource locks and concurrency
limits (:mod:`flowengine.coordination`) the same way, on the same thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from flowengine import exceptions as exc
from flowengine.jobs import base
from flowengine.jobs.lease_clock import lease_clock
from flowengine.persistence.base import FencedOff
from flowengine.types.entity import Entity

__all__ = ["ClaimFence", "ClaimKeeper", "FencedOff", "LeaseFence"]

LOG = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True)
class _Kept:
    fence: LeaseFence
    renew: Callable[[], None]
    on_lost: Callable[[], None]


class LeaseFence:
    """Whether a lease is still certainly held, by the local clock.

    Args:
        subject: What the lease is held for, as refusals name it (``job <uuid> (<name>)``).
        ttl: The lease's length in seconds.
        clock: The lease clock (injected in tests).
        claimed_at: When the lease was requested (``clock()`` if omitted).
        noun: What the lease is called in refusals (``claim``, ``lease``).
    """

    def __init__(self, subject: str, ttl: float, clock: Clock = lease_clock,
                 claimed_at: float | None = None, noun: str = "lease") -> None:
        self.subject = subject
        self.noun = noun
        # The service starts the lease when it receives the request, after we sent it; the
        # margin covers the two clocks running at slightly different rates.
        self._span = ttl - min(ttl * 0.2, 2.0)
        self._clock = clock
        self._valid_until = (clock() if claimed_at is None else claimed_at) + self._span
        self._lost: str | None = None

    def renewed(self, sent_at: float) -> None:
        """The lease was renewed by a request sent at ``sent_at``."""
        self._valid_until = max(self._valid_until, sent_at + self._span)

    def lose(self, reason: str) -> None:
        """The lease is known to be gone."""
        self._lost = reason

    @property
    def held(self) -> bool:
        """True while the lease is certainly held."""
        return self._lost is None and self._clock() < self._valid_until

    def refusal(self, what: str) -> FencedOff | None:
        """The :class:`FencedOff` a write of ``what`` gets now (None while the lease is held)."""
        if self._lost is not None:
            why = self._lost
        elif self._clock() >= self._valid_until:
            why = f"its {self.noun} was not renewed in time (it may have expired)"
        else:
            return None
        return FencedOff(f"Refused to store {what} of {self.subject}: {why}")

    def check(self, what: str) -> None:
        """Raise :class:`FencedOff` (naming ``what`` and the subject) unless the lease is held."""
        refused = self.refusal(what)
        if refused is not None:
            raise refused


class ClaimFence(LeaseFence):
    """Whether a job's claim is still certainly held, by the local clock.

    Args:
        job: The job claimed.
        ttl: The claim's length in seconds.
        clock: The lease clock (injected in tests).
        claimed_at: When the claim was requested (``clock()`` if omitted).
        token: The claim's fencing token (what the board's ``claim`` returned; None: the board
            gives none), which the store checks each write against.
    """

    def __init__(self, job: base.Job, ttl: float, clock: Clock = lease_clock,
                 claimed_at: float | None = None, token: int | None = None) -> None:
        super().__init__(f"job {job.uuid} ({job.name})", ttl, clock, claimed_at, noun="claim")
        self.job = job
        self.token = token


class ClaimKeeper:
    """Renews a conductor's claims and registration, and any other lease given to
    :meth:`hold_lease`, every ``interval`` seconds.

    Args:
        board: The jobboard (None: a keeper of other leases only, ``interval`` required).
        owner: The conductor's name (the claims' owner).
        entity: The conductor's registration, refreshed with the claims (None: none).
        clock: The lease clock (injected in tests).
        interval: Seconds between renewals (a third of the board's ``claim_ttl`` if None).
    """

    def __init__(self, board: base.JobBoard | None, owner: str, entity: Entity | None = None,
                 clock: Clock = lease_clock, interval: float | None = None) -> None:
        if interval is None:
            if board is None:
                raise ValueError(f"Keeper of {owner}: a keeper without a board needs an interval")
            interval = board.options.claim_ttl / 3
        self._board = board
        self._owner = owner
        self._entity = entity
        self._clock = clock
        self._interval = interval
        self._lock = threading.Lock()
        self._held: dict[str, _Kept] = {}
        self._next_due = clock()
        self._stopping = threading.Event()
        #: Set to make the keeper's thread look again before its pause ends (renew_now, stop).
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, job: base.Job, on_lost: Callable[[base.Job], None],
             claimed_at: float | None = None, token: int | None = None) -> ClaimFence:
        """Start renewing ``job``'s claim (its fencing token: ``token``); ``on_lost(job)`` is
        called (once, on the keeper's thread) when it is lost or may have lapsed: read
        ``fence.refusal`` for why."""
        board = self._board
        if board is None:
            raise ValueError(f"Keeper of {self._owner} has no board to renew job claims on")
        fence = ClaimFence(job, board.options.claim_ttl, self._clock, claimed_at, token)
        self.hold_lease(job.uuid, fence, lambda: board.keep_alive(job, self._owner),
                        lambda: on_lost(job))
        return fence

    def hold_lease(self, key: str, fence: LeaseFence, renew: Callable[[], None],
                   on_lost: Callable[[], None]) -> None:
        """Start renewing a lease by calling ``renew()``, which raises
        :class:`~flowengine.jobs.base.ClaimLost` when the lease is gone (any other
        :class:`~flowengine.exceptions.TaskFlowException` when it cannot tell). ``on_lost()``
        is called once, on the keeper's thread, when it is lost or may have lapsed.

        Args:
            key: Names the lease for :meth:`release_lease` (unique among those held).
            fence: The lease's fence, renewed and lost with it.
            renew: Renews the lease once.
            on_lost: Told that it is lost.
        """
        with self._lock:
            self._held[key] = _Kept(fence, renew, on_lost)

    def release(self, job: base.Job) -> None:
        """Stop renewing ``job``'s claim."""
        self.release_lease(job.uuid)

    def release_lease(self, key: str) -> None:
        """Stop renewing the lease held under ``key``."""
        with self._lock:
            self._held.pop(key, None)

    def tick(self) -> float:
        """Renew everything if due; return the seconds until the next renewal."""
        now = self._clock()
        if now < self._next_due:
            return self._next_due - now
        self._next_due = now + self._interval
        with self._lock:
            held = list(self._held.items())
        for key, kept in held:
            self._renew(key, kept)
        if self._entity is not None and self._board is not None:
            try:
                self._board.register_entity(self._entity)
            except exc.TaskFlowException as err:
                LOG.warning("Could not refresh the registration of %s: %s", self._owner, err)
        return max(0.0, self._next_due - self._clock())

    def renew_now(self) -> None:
        """Renew everything at once, on the keeper's thread, without waiting for the next
        round (a process that knows it was paused, or whose leases' service came back)."""
        self._next_due = self._clock()
        self._wake.set()

    def _renew(self, key: str, kept: _Kept) -> None:
        fence, sent_at = kept.fence, self._clock()
        noun, subject = fence.noun, fence.subject
        try:
            kept.renew()
        except base.ClaimLost as err:
            LOG.warning("%s lost its %s on %s: %s", self._owner, noun, subject, err)
            fence.lose(f"the {noun} was lost: {err}")
        except exc.TaskFlowException as err:
            if fence.held:
                # Cannot tell (the service is unreachable): held until the lease could have
                # ended, and the next renewal may get through before then.
                LOG.warning("Could not renew the %s on %s: %s", noun, subject, err)
                return
            LOG.warning("%s may have lost its %s on %s: not renewed in time (%s)", self._owner,
                        noun, subject, err)
            fence.lose(f"its {noun} could not be renewed before it could have expired: {err}")
        else:
            fence.renewed(sent_at)
            return
        self.release_lease(key)
        try:
            kept.on_lost()
        except Exception:
            LOG.exception("Handling the lost %s on %s failed", noun, subject)

    def start(self) -> None:
        """Renew now, then every interval on a daemon thread until :meth:`stop`."""
        self._stopping.clear()
        self._wake.clear()
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
            self._wake.wait(pause)
            self._wake.clear()
            if self._stopping.is_set():
                return

    def stop(self) -> None:
        """Stop renewing (the claims still held then expire on their own)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
