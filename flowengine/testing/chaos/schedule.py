"""The seeded schedule of faults ``flowengine chaos`` applies.

One seed gives one schedule: the same faults at the same moments on the same worker slots,
so a schedule that made a flow fail can be replayed (``--seed``). Workers are *slots*: a slot
whose worker is killed gets a new worker after a moment; a frozen one gets its worker back
(SIGCONT) once the freeze is over. The first faults take each kind in turn (in a seeded
order), so that a short run still meets every kind; the rest are drawn by weight. The last
is always a worker killed: a session ends with lost work its engine must recover on its own
(a restarted engine resends whatever its flows were waiting for, which would hide a fleet that
cannot).
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
KINDS = (KILL_WORKER, FREEZE_WORKER, RESTART_WORKER, RESTART_ENGINE)
_WEIGHTS = (30, 25, 20, 25)

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
        kind: One of :data:`KINDS`.
        slot: The worker slot it hits (0 for the engine).
        hold: Seconds a freeze lasts, or a killed worker's slot stays empty.
    """

    at: float
    kind: str
    slot: int
    hold: float = 0.0

    def __str__(self) -> str:
        where = "the engine" if self.kind == RESTART_ENGINE else f"worker slot {self.slot}"
        extra = f" for {self.hold:.1f}s" if self.kind == FREEZE_WORKER else ""
        return f"{self.at:6.1f}s  {self.kind} ({where}){extra}"


def schedule(seed: int, duration: float, workers: int, lease_timeout: float) -> list[Fault]:
    """The faults of a chaos run of ``duration`` seconds on ``workers`` slots.

    Raises:
        ValueError: no worker slot, or a duration too short for any fault.
    """
    if workers < 1:
        raise ValueError(f"chaos needs at least one worker, not {workers}")
    rng = random.Random(seed)
    first = list(KINDS)
    rng.shuffle(first)
    faults: list[Fault] = []
    at = rng.uniform(*FIRST)
    while at < duration:
        kind = first.pop(0) if first else rng.choices(KINDS, _WEIGHTS)[0]
        slot = 0 if kind == RESTART_ENGINE else rng.randrange(workers)
        hold = 0.0
        if kind == FREEZE_WORKER:
            hold = lease_timeout + rng.uniform(*PAST_LEASE)
        elif kind == KILL_WORKER:
            hold = rng.uniform(*RESPAWN)
        faults.append(Fault(round(at, 2), kind, slot, round(hold, 2)))
        at += rng.uniform(*GAP)
    if not faults:
        raise ValueError(f"a chaos run of {duration}s is too short for any fault (the first "
                         f"comes after {FIRST[1]:.0f}s at most)")
    last = faults[-1]
    if last.kind != KILL_WORKER and len(faults) > len(KINDS):
        faults[-1] = Fault(last.at, KILL_WORKER, rng.randrange(workers),
                           round(rng.uniform(*RESPAWN), 2))
    return faults
