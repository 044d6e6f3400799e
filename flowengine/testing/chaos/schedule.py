"""The seeded schedule of faults ``flowengine chaos`` applies.

One seed gives one schedule: the same faults at the same moments on the same slots, so a
schedule that made a flow fail can be replayed (``--seed``). Workers and conductors are
*slots*: a slot whose process is killed gets a new one after a moment; a frozen one gets its
process back (SIGCONT) once the freeze is over. The first faults take each kind in turn (in a
seeded order), so that a short run still meets every kind; the rest are drawn by weight. The
last is always a worker killed: a session ends with lost work its engines must recover on
their own (a restarted engine, or a conductor resuming a job, resends whatever its flow was
waiting for, which would hide a fleet that cannot).

Without a jobboard the flows run in one engine process, which is killed and started again;
with one (``conductors`` > 0) they run as jobs in conductor processes, which are killed,
frozen past their claim and restarted instead.
"""

from __future__ import annotations

import dataclasses
import random

#: SIGKILL a worker; a new one starts in its slot after ``hold`` seconds.
KILL_WORKER = "kill-worker"
#: SIGSTOP a worker for ``hold`` seconds (past the lease), then SIGCONT.
FREEZE_WORKER = "freeze-worker"
#: SIGTERM a worker (it finishes or hands back its work) and start a new one.
RESTART_WORKER = "restart-worker"
#: SIGKILL the engine process and start a new one, which resumes the flows from the store.
RESTART_ENGINE = "restart-engine"
#: SIGKILL a conductor; a new one starts in its slot after ``hold`` seconds (its claims lapse
#: and other conductors take its jobs over).
KILL_CONDUCTOR = "kill-conductor"
#: SIGSTOP a conductor for ``hold`` seconds (past its claims), then SIGCONT.
FREEZE_CONDUCTOR = "freeze-conductor"
#: SIGTERM a conductor (it hands its jobs back) and start a new one.
RESTART_CONDUCTOR = "restart-conductor"
KINDS = (KILL_WORKER, FREEZE_WORKER, RESTART_WORKER, RESTART_ENGINE)
_WEIGHTS = (30, 25, 20, 25)
#: The kinds, and their weights, when the flows run as jobs on conductors.
BOARD_KINDS = (KILL_WORKER, FREEZE_WORKER, RESTART_WORKER, KILL_CONDUCTOR, FREEZE_CONDUCTOR,
               RESTART_CONDUCTOR)
_BOARD_WEIGHTS = (20, 15, 15, 20, 15, 15)
#: Faults that strike a conductor.
CONDUCTOR_KINDS = frozenset({KILL_CONDUCTOR, FREEZE_CONDUCTOR, RESTART_CONDUCTOR})

#: Seconds between two faults (drawn between these).
GAP = (3.0, 6.0)
#: Seconds before the first fault (the flows get going).
FIRST = (2.0, 4.0)
#: Seconds a killed worker's slot stays empty.
RESPAWN = (0.5, 2.0)
#: Seconds a freeze lasts past the lease.
PAST_LEASE = (1.0, 3.0)


@dataclasses.dataclass(frozen=True)
class Fault:
    """One scheduled fault.

    Attributes:
        at: Seconds after the chaos began.
        kind: One of :data:`KINDS` or :data:`BOARD_KINDS`.
        slot: The worker or conductor slot it hits (0 for the engine).
        hold: Seconds a freeze lasts, or a killed process's slot stays empty.
    """

    at: float
    kind: str
    slot: int
    hold: float = 0.0

    @property
    def on_conductor(self) -> bool:
        """Whether it strikes a conductor."""
        return self.kind in CONDUCTOR_KINDS

    def __str__(self) -> str:
        where = ("the engine" if self.kind == RESTART_ENGINE else
                 f"conductor slot {self.slot}" if self.on_conductor else f"worker slot {self.slot}")
        extra = (f" for {self.hold:.1f}s" if self.kind in (FREEZE_WORKER, FREEZE_CONDUCTOR)
                 else "")
        return f"{self.at:6.1f}s  {self.kind} ({where}){extra}"


def schedule(seed: int, duration: float, workers: int, lease_timeout: float,
             conductors: int = 0, claim_ttl: float = 0.0) -> list[Fault]:
    """The faults of a chaos run of ``duration`` seconds on ``workers`` worker slots, and on
    ``conductors`` conductor slots whose claims last ``claim_ttl`` seconds (none: the flows
    run in one engine process).

    Raises:
        ValueError: no worker slot, or a duration too short for any fault.
    """
    if workers < 1:
        raise ValueError(f"chaos needs at least one worker, not {workers}")
    if conductors < 0:
        raise ValueError(f"chaos cannot run {conductors} conductors")
    kinds, weights = (BOARD_KINDS, _BOARD_WEIGHTS) if conductors else (KINDS, _WEIGHTS)
    rng = random.Random(seed)
    first = list(kinds)
    rng.shuffle(first)
    faults: list[Fault] = []
    at = rng.uniform(*FIRST)
    while at < duration:
        kind = first.pop(0) if first else rng.choices(kinds, weights)[0]
        slot = (0 if kind == RESTART_ENGINE else
                rng.randrange(conductors) if kind in CONDUCTOR_KINDS else rng.randrange(workers))
        hold = 0.0
        if kind == FREEZE_WORKER:
            hold = lease_timeout + rng.uniform(*PAST_LEASE)
        elif kind == FREEZE_CONDUCTOR:
            hold = claim_ttl + rng.uniform(*PAST_LEASE)
        elif kind in (KILL_WORKER, KILL_CONDUCTOR):
            hold = rng.uniform(*RESPAWN)
        faults.append(Fault(round(at, 2), kind, slot, round(hold, 2)))
        at += rng.uniform(*GAP)
    if not faults:
        raise ValueError(f"a chaos run of {duration}s is too short for any fault (the first "
                         f"comes after {FIRST[1]:.0f}s at most)")
    last = faults[-1]
    if last.kind != KILL_WORKER and len(faults) > len(kinds):
        faults[-1] = Fault(last.at, KILL_WORKER, rng.randrange(workers),
                           round(rng.uniform(*RESPAWN), 2))
    return faults
