"""One attempt's lifecycle: a value and one transition function, driven by events and a clock.

An *attempt* is one delivery of one atom's execute or revert to a worker. Its states are
TaskFlow's request states: created WAITING (no capable worker known yet), PENDING once sent to
a worker's topic, RUNNING once its worker started it, and it ends exactly once, SUCCESS (its
outcome arrived) or FAILURE (whatever else ended it: its :attr:`Attempt.ending` says what).

:func:`step` is the whole lifecycle: ``step(attempt, event, now) -> (attempt, effects)``. It
decides the transition timeout (WAITING and PENDING), the lease a RUNNING attempt on a
flowengine worker holds and heartbeats renew, the time limit, what a lost, handed-back or
untaken attempt becomes (sent again, counted or not, or given up and parked as a dead letter),
and it never does any of it: it returns the new value and the *effects* its owner carries out
(publish, complete the future, send a CANCEL...). Time is only what ``now`` says, so every
timeout, lease and retry is tested by passing numbers, without a broker or a thread.

A short task sends no RUNNING reply to an engine that speaks flowengine protocol 2: its
outcome, or its RUNNING reply once it outlives a short threshold, moves a PENDING attempt on
(so does a heartbeat). A PENDING attempt may therefore have started. When the broker hands it
out again (its holder died or was cut off) it is treated as a RUNNING one whose holder must
prove it is alive, unless its worker said it holds it unstarted (waiting for a limit, or given
back as the worker stopped): a request that kills its workers at once still costs an attempt
each time, as it did when every task said RUNNING first.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from flowengine import exceptions as exc
from flowengine.engines.event_loop import SHUTDOWN_GRACE
from flowengine.types.failure import Failure
from flowengine.worker_based.wire.request_machine import (
    FAILURE,
    PENDING,
    RUNNING,
    SUCCESS,
    WAITING,
)

# The executor's logger: operators follow one logger for everything engine-side.
LOG = logging.getLogger("flowengine.worker_based.executor")

__all__ = [
    "FAILURE", "PENDING", "RUNNING", "SUCCESS", "WAITING", "Attempt", "Effect", "Event",
    "Policy", "Tally", "due", "first", "follow", "step",
]

#: Heartbeat intervals the holder of a RUNNING attempt the broker handed out again has to show
#: it is alive before the attempt is lost.
PROOF_OF_LIFE = 1.5
#: Hand-backs by workers of another version an attempt may have while one of its own version
#: lives (each sent again a little later, up to a second apart).
MAX_OTHER_VERSION = 200
#: Hand-backs by workers that do not run the class, and attempts sent elsewhere because nobody
#: took them, before the engine stops sending a task again that way.
MAX_NOT_SERVED = 20
#: Seconds past its time limit an engine waits for the outcome of an awaited call (``async
#: def``) on a flowengine worker. That worker cancels the coroutine at the limit and replies
#: once its cleanup (``except asyncio.CancelledError``, ``finally``) has run, so the flow's
#: reverts never overlap it: the grace a local engine gives a cancelled coroutine, and one
#: second more for the reply to arrive. A thread's call cannot be stopped, so its verdict is at
#: the limit itself, as it is on a TaskFlow worker, which knows no limits.
CLEANUP_GRACE = SHUTDOWN_GRACE + 1.0

# Why an attempt ended (its ``ending``).
FINISHED = "finished"  # its outcome arrived
LOST = "lost"  # its lease lapsed, or its worker expired or went offline
TIMED_OUT = "timed out"  # past its transition timeout, or its time limit
HANDED_BACK = "handed back"  # a worker returned it unrun
PASSED_OVER = "passed over"  # nobody took it from its topic in time: sent elsewhere
CANCELLED = "cancelled"  # revoked before it ran, or its flow is being cancelled
FAILED = "failed"  # unpublishable, undecodable, refused, or its executor stopped


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """What an executor allows its attempts (shared by all of them).

    Attributes:
        timeout: Seconds an attempt may stay WAITING or PENDING (None: forever).
        lease_timeout: Seconds a RUNNING attempt on a flowengine worker lasts without a
            heartbeat (None: no lease).
        heartbeat_interval: Seconds between the heartbeats workers are asked to send.
        max_attempts: Attempts counted per submission before it fails with WorkerLost.
        unserved_timeout: Seconds a WAITING attempt waits while workers are known but none
            runs its class, before it fails with NotFound (None: the transition timeout).
        pickup_timeout: Seconds an attempt sent to a flowengine worker may wait untaken while
            nothing is heard from its topic, before it is sent elsewhere (None: never).
    """

    timeout: float | None = 60.0
    lease_timeout: float | None = 10.0
    heartbeat_interval: float = 2.0
    max_attempts: int = 3
    unserved_timeout: float | None = 5.0
    pickup_timeout: float | None = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class Tally:
    """What earlier attempts of the same submission left for the next one.

    Attributes:
        resent: Attempts sent again because their holder never started them.
        not_served: Attempts handed back by a worker that does not run the class.
        other_version: Of those, by a worker of another version while one of its own lived.
        rerouted: Attempts sent elsewhere because nobody took them from their topic.
        workers: The workers that held each attempt, in order.
    """

    resent: int = 0
    not_served: int = 0
    other_version: int = 0
    rerouted: int = 0
    workers: tuple[str, ...] = ()

    def counted(self, number: int) -> int:
        """How many of ``number`` attempts count against ``max_attempts``."""
        return number - self.resent - self.not_served - self.rerouted


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt, as a value (see the module docstring); made by :func:`first` and
    :func:`follow`, changed only by :func:`step`.

    Attributes:
        request_id: Its own id: the message's ``correlation_id``, unique per attempt.
        task_name: The atom it is an attempt at (for messages).
        action: ``execute`` or ``revert``.
        number: 1 for the submission's first attempt.
        policy: The executor's timeouts and bounds.
        created: When its transition timeout (and unserved wait) count from: when it was made,
            or when a delay lets a worker take it.
        state: WAITING, PENDING, RUNNING, SUCCESS or FAILURE.
        ending: Why it ended (None while it has not).
        tally: The submission's counts, this attempt's included.
        time_limit: Seconds it may be RUNNING (None: no limit).
        awaited: Its call is a coroutine its worker awaits, which only its time limit reads
            (see :data:`CLEANUP_GRACE`).
        not_before: No worker may take it before (a delay; None: none).
        topic: Where it was sent.
        worker: Who holds it: the worker it was sent to, or the one that said it runs it.
        flowengine_peer: Its worker speaks flowengine's extensions (heartbeats, cancels).
        started: When it started RUNNING.
        lease_until: When its lease ends unless renewed (None: it holds none).
        pickup_due: When to look whether it was taken from its topic (None: never).
        revoking: Workers were asked not to start it (a suspend, a cancel).
        stopping: Why its flow asked it to stop (None: not asked).
        suspect: Why it may be lost, until a heartbeat says otherwise.
        runner: The worker whose RUNNING reply it got (replies from others are refused).
        unstarted: Its worker said it holds it unstarted (waiting for a limit, or given back
            as that worker stopped): a hand-back of it then costs no attempt.
    """

    request_id: str
    task_name: str
    action: str
    number: int
    policy: Policy
    created: float
    state: str = WAITING
    ending: str | None = None
    tally: Tally = Tally()
    time_limit: float | None = None
    awaited: bool = False
    not_before: float | None = None
    topic: str = ""
    worker: str | None = None
    flowengine_peer: bool = False
    started: float | None = None
    lease_until: float | None = None
    pickup_due: float | None = None
    revoking: bool = False
    stopping: str | None = None
    suspect: str | None = None
    runner: str | None = None
    unstarted: bool = False

    @property
    def ended(self) -> bool:
        """Whether it is over (SUCCESS or FAILURE)."""
        return self.state in (SUCCESS, FAILURE)

    @property
    def waiting(self) -> bool:
        """Whether it has not started (WAITING or PENDING): its transition timeout runs."""
        return self.state in (WAITING, PENDING)

    @property
    def limit_ends(self) -> float | None:
        """When the engine fails it for running past its time limit (None: never)."""
        if not self.time_limit or self.started is None:
            return None
        grace = CLEANUP_GRACE if self.awaited and self.flowengine_peer else 0.0
        return self.started + self.time_limit + grace

    @property
    def counted(self) -> int:
        """How many of the submission's attempts so far count against ``max_attempts``."""
        return self.tally.counted(self.number)

    def describe(self) -> str:
        """``attempt N of task 'x' (request ID)``, for messages."""
        return f"attempt {self.number} of task {self.task_name!r} (request {self.request_id})"


def first(request_id: str, task_name: str, action: str, policy: Policy, now: float,
          time_limit: float | None = None, not_before: float | None = None,
          awaited: bool = False) -> Attempt:
    """A submission's first attempt, WAITING (its timeouts count from ``not_before`` when that
    is later than ``now``)."""
    created = now if not_before is None else max(now, not_before)
    return Attempt(request_id, task_name, action, 1, policy, created, time_limit=time_limit,
                   awaited=awaited, not_before=not_before)


def follow(ended: Attempt, request_id: str, now: float) -> Attempt:
    """The attempt after ``ended`` (which asked for one with :class:`Retry`): WAITING, with
    the submission's tally and whatever its flow asked of it."""
    not_before = ended.not_before if ended.not_before is not None and ended.not_before > now \
        else None
    return Attempt(request_id, ended.task_name, ended.action, ended.number + 1, ended.policy,
                   now if not_before is None else not_before, tally=ended.tally,
                   time_limit=ended.time_limit, awaited=ended.awaited,
                   not_before=not_before, stopping=ended.stopping)


# -- events: what happens to an attempt ----------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Sent:
    """It was published to ``worker`` (its id; a TaskFlow worker's is its topic) on ``topic``."""

    worker: str
    topic: str
    flowengine: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Unsendable:
    """Publishing it failed; ``failure`` says why."""

    failure: Failure


@dataclasses.dataclass(frozen=True, slots=True)
class Started:
    """A RUNNING reply from ``worker`` (None: a worker that does not name itself);
    ``flowengine``: the reply carries flowengine's protocol header."""

    worker: str | None
    flowengine: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat from ``worker`` (flowengine workers only send them)."""

    worker: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Waiting:
    """Its worker holds it unstarted until a concurrency limit lets it run (``holding``), or
    no longer (it is about to start)."""

    holding: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class Returned:
    """Worker ``by`` gives it back to the broker unstarted (it is stopping)."""

    by: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Finished:
    """Its outcome: ``state`` SUCCESS (``result`` the value) or FAILURE (a Failure)."""

    state: str
    result: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Broken:
    """A reply for it that cannot be used (``error`` says why): it will not finish."""

    error: Exception


@dataclasses.dataclass(frozen=True, slots=True)
class HandedBack:
    """Worker ``by`` returned it unrun: the broker redelivered it, so its holder died or was
    cut off holding it. ``quiet_start``: its holder may have started it without saying so
    (a worker of its topic sends no RUNNING reply for short tasks)."""

    by: str | None
    quiet_start: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class NotServed:
    """Worker ``by`` turned it away: it does not run the class (or, ``version`` given, runs
    that version of it). ``right_version_alive``: a worker of its own version is known."""

    by: str | None
    version: str | None = None
    right_version_alive: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Dropped:
    """Worker ``by`` dropped it unstarted (or stopped it), as it was asked."""

    by: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Tick:
    """The clock moved: whatever is due is decided. ``workers_known``: some worker is known
    (a WAITING attempt then waits only its unserved timeout). ``caught_up``: when the engine
    last had every reply sent to it read (its reply queue found empty), None: taken as now.
    Silence is believed only up to then: a lease lapses, and a request counts as not picked
    up, only if no heartbeat or reply sent before its deadline can still wait in a backlog of
    replies (an engine process busy with thousands of flows), or once the deadline is a whole
    lease (pickup timeout) past: a reply queue that is never found empty (steady traffic)
    delays the verdict, never prevents it."""

    workers_known: bool = False
    caught_up: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class PassOver:
    """It is sent to another capable worker, without counting an attempt: nobody took it
    from its topic within the pickup timeout while nothing was heard from there, or
    (``why`` given) a worker of its topic that may hold it unstarted stopped answering."""

    why: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Lost:
    """Its worker is gone (expired, went offline): ``why``. ``quiet_start``: another worker of
    its topic may run it without having said so yet (a worker of its topic sends no RUNNING
    reply for short tasks). ``unheld``: the broker no longer holds its request, as seen while
    it was PENDING (news for a PENDING attempt only: one that said it runs since is held)."""

    why: str
    quiet_start: bool = False
    unheld: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Revoke:
    """Its engine suspends: it must not start if it has not. ``taken_back``: its delayed
    publish was withdrawn before any worker could take it."""

    taken_back: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Stop:
    """Its flow is being cancelled (``reason``): dropped if it has not started, else told to
    stop. ``taken_back`` as for :class:`Revoke`."""

    reason: str
    taken_back: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Resumed:
    """The engine's own broker connection was away ``outage`` seconds: its leases start
    afresh, with time to drain what waited."""

    outage: float


@dataclasses.dataclass(frozen=True, slots=True)
class Abandoned:
    """Its executor stopped, or its future was cancelled before it was sent (``why``)."""

    why: str
    error: Exception | None = None


Event: TypeAlias = (Sent | Unsendable | Started | Beat | Waiting | Returned | Finished | Broken
                    | HandedBack | NotServed | Dropped | Tick | PassOver | Lost | Revoke | Stop
                    | Resumed | Abandoned)


# -- effects: what the attempt's owner must do -------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Complete:
    """Complete the submission's future with ``result`` (a value, or a Failure)."""

    result: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Fail:
    """Fail the submission with ``error``."""

    error: Exception


@dataclasses.dataclass(frozen=True, slots=True)
class Expire:
    """Fail the submission with a RequestTimeout: ``message``, and why it waited if the owner
    knows (no worker at all was known)."""

    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Unserved:
    """Fail the submission with NotFound: no worker it knows runs the task's class at its
    version (the owner says what they do run), then ``note``."""

    note: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel the submission's future: the attempt never ran and never will (``why``)."""

    why: str


@dataclasses.dataclass(frozen=True, slots=True)
class Retry:
    """Make the next attempt (:func:`follow`) and send it; ``reason``: announce it
    (task-retried) with this reason."""

    reason: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Park:
    """Publish the request as a dead letter, for ``reason``."""

    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Withdraw:
    """Ask every flowengine worker not to start it (a CANCEL of its id), for ``why``."""

    why: str


@dataclasses.dataclass(frozen=True, slots=True)
class TellStop:
    """Ask its holder (else every flowengine worker) to stop it."""

    holder: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Silence:
    """Send nothing more to worker ``worker`` until it is heard from again (``why``)."""

    worker: str
    why: str


@dataclasses.dataclass(frozen=True, slots=True)
class Announce:
    """Emit event ``event_type`` (task-sent, task-moved, task-lost) with ``fields``."""

    event_type: str
    fields: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class CheckPickup:
    """Its pickup is due: ask whether its topic was quiet and another worker can take it
    (then apply :class:`PassOver`)."""

    topic: str


Effect: TypeAlias = (Complete | Fail | Expire | Unserved | Cancel | Retry | Park | Withdraw
                     | TellStop | Silence | Announce | CheckPickup)
#: The attempt after a step, and the effects it asks for: a list of the step's own, never one
#: shared between steps (its caller may add to it).
Step: TypeAlias = tuple[Attempt, list[Effect]]


def step(attempt: Attempt, event: Event, now: float) -> Step:
    """Apply ``event`` at time ``now``: the attempt as it is now, and what to do about it.

    An event that does not apply (a late or duplicated reply, news of an attempt that ended)
    changes nothing and asks for nothing: replies are never a reason to fail.
    """
    if attempt.ended:
        return attempt, []
    return _HANDLERS[type(event)](attempt, event, now)


def due(attempt: Attempt, now: float) -> float:
    """When the clock next makes something due for ``attempt`` (``math.inf``: never, as
    things stand).

    A pickup deadline or lease end that has passed unjudged waits for a verdict on silence
    (see :class:`Tick`): the clock decides it only when the grace after it ends; before then
    only the reply queue catching up can, which whoever ticks notices (see
    :func:`awaits_catch_up`). So an engine process too busy to find its reply queue empty does
    not look at such attempts on every pass.
    """
    if attempt.waiting:
        expiry = math.inf if attempt.policy.timeout is None \
            else attempt.created + attempt.policy.timeout
        if attempt.state == WAITING and attempt.policy.unserved_timeout is not None:
            fail_fast = attempt.created + attempt.policy.unserved_timeout
            if fail_fast > now:  # once past, only the expiry is left to wait for
                return min(expiry, fail_fast)
        if attempt.state == PENDING and attempt.pickup_due is not None and not attempt.revoking:
            return min(expiry, _verdict_due(attempt.pickup_due, attempt.policy.pickup_timeout,
                                            now))
        return expiry
    if attempt.state != RUNNING:
        return math.inf
    limit_ends = attempt.limit_ends
    when = math.inf if limit_ends is None else limit_ends
    if attempt.lease_until is not None:
        when = min(when, _verdict_due(attempt.lease_until, attempt.policy.lease_timeout, now))
    return when


def _verdict_due(deadline: float, grace: float | None, now: float) -> float:
    """When the clock next decides a verdict on silence after ``deadline`` (see
    :func:`_silent`): at the deadline, and once it has passed, when its grace ends."""
    if deadline > now or grace is None:
        return deadline
    return deadline + grace


def awaits_catch_up(attempt: Attempt, now: float) -> bool:
    """Whether a verdict on ``attempt`` (its pickup, its lease) waits for the reply queue to
    be found empty: a :class:`Tick` with a later ``caught_up`` may decide it before
    :func:`due` comes."""
    if attempt.state == PENDING:
        return attempt.pickup_due is not None and attempt.pickup_due <= now \
            and not attempt.revoking
    return attempt.state == RUNNING and attempt.lease_until is not None \
        and attempt.lease_until <= now


# -- the transitions ---------------------------------------------------------------------------


def _sent(attempt: Attempt, event: Sent, now: float) -> Step:
    if attempt.state != WAITING:
        return attempt, []
    pickup = None
    if event.flowengine and attempt.policy.pickup_timeout is not None:
        # TaskFlow workers cannot be told to drop a request sent elsewhere instead.
        pickup = max(now, attempt.not_before or now) + attempt.policy.pickup_timeout
    tally = dataclasses.replace(attempt.tally, workers=(*attempt.tally.workers, event.worker))
    sent = dataclasses.replace(attempt, state=PENDING, worker=event.worker, topic=event.topic,
                               flowengine_peer=event.flowengine, pickup_due=pickup, tally=tally)
    return sent, [Announce("task-sent", {"topic": event.topic, "worker": event.worker,
                                         "action": attempt.action})]


def _unsendable(attempt: Attempt, event: Unsendable, now: float) -> Step:
    return _end(attempt, FAILED), [Complete(event.failure)]


def _start(attempt: Attempt, worker: str | None, flowengine: bool, now: float,
           said: bool) -> Step:
    """It runs on ``worker`` (RUNNING reply, or the first heartbeat of one that sends none)."""
    effects: list[Effect] = []
    changes: dict[str, Any] = {}
    if said and attempt.runner is None and worker:
        changes["runner"] = worker
    if attempt.state == PENDING:
        changes.update(state=RUNNING, started=now, pickup_due=None, unstarted=False)
        # Only flowengine workers send heartbeats: a TaskFlow worker's request holds no lease.
        lease = attempt.policy.lease_timeout if flowengine else None
        changes["lease_until"] = None if lease is None else now + lease
    elif attempt.state == RUNNING and flowengine:
        changes.update(_renewed(attempt, now))
    if worker and worker != attempt.worker:
        # Workers sharing a topic share its queue: the one that took it may not be the one it
        # was sent to (and an offline notice from that one must not re-send what another runs).
        workers = attempt.tally.workers
        changes["tally"] = dataclasses.replace(
            attempt.tally, workers=(*workers[:-1], worker) if workers else (worker,))
        changes["worker"] = worker
        effects.append(Announce("task-moved", {"worker": worker,
                                               "from_worker": workers[-1] if workers else None}))
    if attempt.stopping is not None:  # it started after its flow's cancel: stop it
        effects.append(TellStop(worker or attempt.runner))
    return (dataclasses.replace(attempt, **changes) if changes else attempt), effects


def _renewed(attempt: Attempt, now: float) -> dict[str, Any]:
    if attempt.lease_until is None or attempt.policy.lease_timeout is None:
        return {}
    return {"lease_until": now + attempt.policy.lease_timeout, "suspect": None}


def _started(attempt: Attempt, event: Started, now: float) -> Step:
    if attempt.state == WAITING:
        return attempt, []
    return _start(attempt, event.worker, event.flowengine, now, said=True)


def _beat(attempt: Attempt, event: Beat, now: float) -> Step:
    if attempt.state == PENDING:
        # Its worker sent no RUNNING reply (a short task outlived its threshold, or the reply
        # was lost): a heartbeat says it runs.
        return _start(attempt, event.worker, True, now, said=False)
    if attempt.state != RUNNING:
        return attempt, []
    renewed = _renewed(attempt, now)
    effects: list[Effect] = []
    if attempt.stopping is not None:  # asked to stop and still running: ask again
        effects.append(TellStop(event.worker or attempt.runner))
    return (dataclasses.replace(attempt, **renewed) if renewed else attempt), effects


def _waiting(attempt: Attempt, event: Waiting, now: float) -> Step:
    if attempt.state != PENDING:
        return attempt, []
    # Alive and waiting in line: its time to leave PENDING starts again.
    return dataclasses.replace(attempt, created=now, unstarted=event.holding), []


def _returned(attempt: Attempt, event: Returned, now: float) -> Step:
    if attempt.state != PENDING:
        return attempt, []
    return dataclasses.replace(attempt, unstarted=True), []


def _finished(attempt: Attempt, event: Finished, now: float) -> Step:
    if attempt.state == WAITING:
        return attempt, []
    # From PENDING too: the RUNNING reply was lost, overtaken, or (a short task) never sent.
    ended = dataclasses.replace(attempt, state=event.state if event.state == SUCCESS
                                else FAILURE, ending=FINISHED)
    return ended, [Complete(event.result)]


def _broken(attempt: Attempt, event: Broken, now: float) -> Step:
    return _end(attempt, FAILED), [Fail(event.error)]


def _handed_back(attempt: Attempt, event: HandedBack, now: float) -> Step:
    holder = attempt.tally.workers[-1] if attempt.tally.workers else "?"
    why = (f"the broker redelivered it to worker {event.by or '?'}: its worker {holder} died "
           f"or was cut off holding it")
    policy = attempt.policy
    started = attempt.state == RUNNING or (event.quiet_start and not attempt.unstarted)
    if started and policy.lease_timeout is not None:
        # The holder may still be running it (a long task Redis handed out again, a worker
        # whose connection blipped, a short task not done yet): one that is alive proves it
        # with its next heartbeat or RUNNING reply, which renews the lease; one that is gone
        # (or that the request killed) lets the lease lapse soon.
        LOG.debug("%s came back from the broker; its lease now ends unless worker %s sends a "
                  "heartbeat", attempt.describe().capitalize(), holder)
        return _to_prove_alive(attempt, why, now), []
    if started or attempt.tally.resent >= policy.max_attempts:
        return _lapse(attempt, why)
    # It never started (no RUNNING reply precedes the hand-back), so sending it again costs no
    # attempt: a graceful worker stop gives back requests it prefetched. Bounded all the same,
    # in case something kills workers before they reply.
    LOG.info("%s never started: %s; sending it again", attempt.describe().capitalize(), why)
    tally = dataclasses.replace(attempt.tally, resent=attempt.tally.resent + 1)
    return _again(dataclasses.replace(attempt, tally=tally), HANDED_BACK)


def _not_served(attempt: Attempt, event: NotServed, now: float) -> Step:
    if attempt.state != PENDING:
        return attempt, []  # late or duplicated: the attempt moved on
    tally = attempt.tally
    by = event.by or "?"
    if (event.version is not None and tally.other_version < MAX_OTHER_VERSION
            and event.right_version_alive):
        # A rolling upgrade: workers of both versions share the topic's queue, and one of the
        # other took it. One of its own version lives: it is sent again, a little later each
        # time, so that while those are busy it does not bounce between the others.
        other = tally.other_version + 1
        tally = dataclasses.replace(tally, other_version=other, not_served=tally.not_served + 1)
        LOG.info("Worker %s runs version %s of its task class: sending task %r (request %s) "
                 "again", by, event.version, attempt.task_name, attempt.request_id)
        later = now + min(0.02 * 2 ** (other - 1), 1.0)
        return _again(dataclasses.replace(attempt, tally=tally, not_before=later), HANDED_BACK)
    if tally.not_served >= MAX_NOT_SERVED + tally.other_version:
        note = f"\n(handed back {tally.not_served + 1} times, the last by worker {by})"
        return _end(attempt, FAILED), [Unserved(note)]
    LOG.info("Worker %s does not run the task class of task %r: sending it (request %s) again",
             by, attempt.task_name, attempt.request_id)
    tally = dataclasses.replace(tally, not_served=tally.not_served + 1)
    return _again(dataclasses.replace(attempt, tally=tally), HANDED_BACK)


def _dropped(attempt: Attempt, event: Dropped, now: float) -> Step:
    # Unstarted, or an awaited coroutine the worker stopped as asked (its RUNNING reply may have
    # come first): either way it will not finish.
    if not (attempt.waiting or attempt.revoking):
        return attempt, []
    why = f"worker {event.by or '?'} dropped it unstarted, as asked"
    return _end(attempt, CANCELLED), [Cancel(why)]


def _tick(attempt: Attempt, event: Tick, now: float) -> Step:
    policy = attempt.policy
    if attempt.waiting:
        if policy.timeout is not None and now - attempt.created > policy.timeout:
            if attempt.revoking:
                # Asked not to start, and now past its deadline header: no worker will run it.
                return _end(attempt, CANCELLED), [Cancel("it expired unstarted after it was "
                                                         "revoked")]
            return _end(attempt, TIMED_OUT), [Expire(
                f"Request {attempt.request_id} for task {attempt.task_name!r} has expired "
                f"after waiting for {policy.timeout} seconds for it to transition out of "
                f"(WAITING, PENDING) states")]
        if (attempt.state == WAITING and event.workers_known
                and policy.unserved_timeout is not None
                and now - attempt.created >= policy.unserved_timeout):
            return _end(attempt, FAILED), [Unserved()]
        if (attempt.state == PENDING and attempt.pickup_due is not None
                and now >= attempt.pickup_due and not attempt.revoking
                and policy.pickup_timeout is not None
                and _silent(attempt.pickup_due, policy.pickup_timeout, event, now)):
            # Looked at again then, unless it moves on.
            later = dataclasses.replace(attempt, pickup_due=now + policy.pickup_timeout)
            return later, [CheckPickup(attempt.topic)]
        return attempt, []
    if attempt.state != RUNNING:
        return attempt, []
    limit_ends = attempt.limit_ends
    if limit_ends is not None and attempt.started is not None and now > limit_ends:
        return _end(attempt, TIMED_OUT), [Fail(exc.TaskTimeLimitExceeded(
            attempt.task_name, attempt.time_limit or 0.0, elapsed=now - attempt.started))]
    if (attempt.lease_until is not None and now > attempt.lease_until
            and _silent(attempt.lease_until, policy.lease_timeout, event, now)):
        why = attempt.suspect or "its lease lapsed (no heartbeat)"
        holder = attempt.tally.workers[-1] if attempt.tally.workers else None
        ended, effects = _lapse(attempt, why)
        # Its holder is dead, frozen or cut off: nothing more (the next attempt, a revert) is
        # sent to it until it is heard from again. Its other attempts keep their own leases: a
        # worker only slow to send one heartbeat must not lose all its work at once.
        return ended, ([Silence(holder, why)] if holder else []) + effects
    return attempt, []


def _silent(deadline: float, grace: float | None, event: Tick, now: float) -> bool:
    """Whether nothing heard by ``deadline`` means nothing was sent (see :class:`Tick`)."""
    return (event.caught_up is None or event.caught_up >= deadline
            or (grace is not None and now > deadline + grace))


def _pass_over(attempt: Attempt, event: PassOver, now: float) -> Step:
    if attempt.state != PENDING or attempt.revoking:
        return attempt, []
    bound = attempt.policy.pickup_timeout or 0.0
    why = event.why or (f"nobody took it from topic {attempt.topic!r} within {bound:g}s and "
                        f"nothing was heard from the topic")
    tally = dataclasses.replace(attempt.tally, rerouted=attempt.tally.rerouted + 1)
    ended, effects = _again(dataclasses.replace(attempt, tally=tally), PASSED_OVER, why)
    # A worker of that topic that shows up later must not run it as well.
    return ended, [Withdraw(why), *effects]


def _lost(attempt: Attempt, event: Lost, now: float) -> Step:
    if attempt.state not in (PENDING, RUNNING) or (event.unheld and attempt.state != PENDING):
        return attempt, []
    if attempt.not_before is not None and attempt.not_before > now:
        # Still in its delay, held by no worker: any worker of the topic may take it when due.
        return attempt, []
    policy = attempt.policy
    if (attempt.state == PENDING and event.quiet_start and not attempt.unstarted
            and policy.lease_timeout is not None):
        # The worker it was sent to is gone, but workers of a topic share its queue: another
        # one may be running it and say so only once it outlives the short threshold. It is
        # treated as running there, with a holder that must prove it is alive; if none does,
        # it is lost as a running attempt would have been.
        why = f"its lease lapsed: {event.why}, and no other worker said it runs it"
        return _to_prove_alive(attempt, why, now), []
    return _lapse(attempt, event.why)


def _revoke(attempt: Attempt, event: Revoke, now: float) -> Step:
    if attempt.revoking or not attempt.waiting:
        return attempt, []  # asked already, or running (or done): it is waited for
    if attempt.state == WAITING:  # no worker was found for it: it went nowhere
        return _end(attempt, CANCELLED), [Cancel("it was never sent")]
    if event.taken_back:
        return _end(attempt, CANCELLED), [Cancel("it was taken back before a worker took it")]
    # Every flowengine worker hears it (TaskFlow workers do not; theirs are waited for).
    return dataclasses.replace(attempt, revoking=True), [Withdraw("its engine suspends")]


def _stop(attempt: Attempt, event: Stop, now: float) -> Step:
    if attempt.action != "execute":
        return attempt, []
    # A worker's answer that it dropped it unrun is then believed, whatever the engine last
    # heard (its RUNNING reply may precede the coroutine's start).
    stopping = dataclasses.replace(attempt, stopping=event.reason, revoking=True)
    if attempt.state == WAITING:
        return _end(stopping, CANCELLED), [Cancel("it was never sent")]
    if event.taken_back:
        return _end(stopping, CANCELLED), [Cancel("it was taken back before a worker took it")]
    return stopping, [TellStop(attempt.runner)]


def _resumed(attempt: Attempt, event: Resumed, now: float) -> Step:
    # Its own disconnection does not count against the workers: the lease starts afresh, with
    # time for the heartbeats and outcomes that waited in the reply queue to be drained.
    grace = event.outage + PROOF_OF_LIFE * attempt.policy.heartbeat_interval
    changes: dict[str, Any] = {}
    if attempt.lease_until is not None:
        changes["lease_until"] = attempt.lease_until + grace
    if attempt.pickup_due is not None:
        changes["pickup_due"] = attempt.pickup_due + grace
    return (dataclasses.replace(attempt, **changes) if changes else attempt), []


def _abandoned(attempt: Attempt, event: Abandoned, now: float) -> Step:
    ended = _end(attempt, FAILED if event.error is not None else CANCELLED)
    return ended, ([Fail(event.error)] if event.error is not None else [])


# -- shared endings ----------------------------------------------------------------------------


def _end(attempt: Attempt, ending: str) -> Attempt:
    return dataclasses.replace(attempt, state=FAILURE, ending=ending)


def _again(attempt: Attempt, ending: str, reason: str | None = None) -> Step:
    """End ``attempt`` and send the submission again (not if its flow is being cancelled)."""
    if attempt.stopping is not None:
        return _end(attempt, CANCELLED), [Cancel("its flow is being cancelled")]
    return _end(attempt, ending), [Retry(reason)]


def _to_prove_alive(attempt: Attempt, why: str, now: float) -> Attempt:
    """``attempt`` as a RUNNING one (a PENDING one may have started unannounced) whose holder
    must prove it is alive within :data:`PROOF_OF_LIFE` heartbeat intervals, or it is lost
    for ``why``."""
    until = now + PROOF_OF_LIFE * attempt.policy.heartbeat_interval
    lease = until if attempt.lease_until is None else min(attempt.lease_until, until)
    suspected = dataclasses.replace(attempt, lease_until=lease, suspect=why)
    if attempt.state == PENDING:
        suspected = dataclasses.replace(suspected, state=RUNNING, started=now, pickup_due=None)
    return suspected


def _lapse(attempt: Attempt, why: str) -> Step:
    """The attempt is lost: try again elsewhere, or give up and park it."""
    holder = attempt.tally.workers[-1] if attempt.tally.workers else None
    LOG.warning("%s (worker %s) is lost: %s", attempt.describe().capitalize(), holder or "?",
                why)
    lost: list[Effect] = [Announce("task-lost", {"reason": why, "worker": holder})]
    if attempt.state == PENDING or (attempt.runner is None and attempt.suspect is not None):
        # No worker was heard running it: the one it was presumed with may be gone, but
        # another may hold it unstarted (taken, then frozen). That one must drop it, not run
        # it once it thaws as well as the next attempt.
        lost.insert(0, Withdraw(why))
    error = exc.WorkerLost(attempt.task_name, attempt.number, list(attempt.tally.workers))
    if attempt.stopping is not None:
        # Its flow is being cancelled: not sent again; what it did is reverted.
        return _end(attempt, LOST), [*lost, Fail(error)]
    if attempt.counted < attempt.policy.max_attempts:
        return _end(attempt, LOST), [*lost, Retry(why)]
    return _end(attempt, LOST), [*lost, Park(f"{error}; the last one: {why}"), Fail(error)]


_HANDLERS: dict[type, Callable[[Attempt, Any, float], Step]] = {
    Sent: _sent, Unsendable: _unsendable, Started: _started, Beat: _beat, Waiting: _waiting,
    Returned: _returned, Finished: _finished, Broken: _broken, HandedBack: _handed_back,
    NotServed: _not_served, Dropped: _dropped, Tick: _tick, PassOver: _pass_over, Lost: _lost,
    Revoke: _revoke, Stop: _stop, Resumed: _resumed, Abandoned: _abandoned,
}
