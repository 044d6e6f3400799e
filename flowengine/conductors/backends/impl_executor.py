"""The conductor both TaskFlow conductors are made of: claim, run in an executor, finish.

What it does with a job, in order:

1. Waits (pushed by the board, never polling) until a job is unclaimed and it has a free slot
   (``max_simultaneous_jobs``), then claims it. The claim is kept alive by a
   :class:`~flowengine.conductors.claims.ClaimKeeper` for as long as the job runs, and the
   engine writes its progress through a :class:`~flowengine.conductors.claims.ClaimFence`, so
   a conductor that lost the claim starts no further atom of the job. Its first write records
   the claim's fencing token on the job's flow, and every write carries it, so the store
   refuses the writes of any older claim from then on (:mod:`flowengine.persistence.fencing`).
2. Loads the job's engine and runs it inside the job's trace span (tracing on:
   :func:`flowengine.tracing.claimed_job`), announcing ``compilation``, ``preparation``,
   ``validation`` and ``running`` (each ``_start`` and ``_end``) on :attr:`notifier`.
3. Finishes it as TaskFlow does: *consumes* it when the flow ended, successfully or with an
   ordinary failure (``job_consumed``); *abandons* it on a storage or execution failure or when
   the flow was suspended (``job_abandoned``), which counts an attempt unless the conductor was
   stopping; *trashes* it when no engine could be made from it (``job_trashed``). A job whose
   claim was lost is left alone: it is another conductor's now.
4. Records in the job's logbook how it ended (:mod:`flowengine.jobs.endings`: SUCCESS,
   REVERTED, FAILED or TRASHED, with the reason), and deletes the logbook only of a job that
   succeeded, and only with ``delete_logbook``.

Event details are TaskFlow's: ``{"job", "engine", "conductor"}`` for the stages and
``{"job", "conductor", "persistence"}`` for the endings (plus ``reason`` for a trash).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from flowengine import exceptions as exc
from flowengine import states, tracing
from flowengine.conductors import base
from flowengine.conductors.claims import ClaimFence, ClaimKeeper, FencedOff
from flowengine.conductors.fencing import FencedBackend
from flowengine.coordination import LockHeld
from flowengine.engines import stopping
from flowengine.engines.factory_policy import FactoryPolicy
from flowengine.jobs import base as jobs_base
from flowengine.jobs import endings
from flowengine.jobs.lease_clock import lease_clock
from flowengine.jobs.masking import scrub

__all__ = ["ExecutorConductor"]

LOG = logging.getLogger(__name__)


def _brief(job: Any) -> str:
    """A job as log lines name it: its name and uuid (its ``str`` holds all its details, the
    whole store included, which a log line per state change would repeat)."""
    return f"{job.name!r} ({job.uuid})"


@dataclasses.dataclass
class _Running:
    job: jobs_base.Job
    fence: ClaimFence
    engine: Any = None
    lost: bool = False
    #: Why its engine could not start the flow (compiling, preparing or validating failed).
    not_started: BaseException | None = None


@dataclasses.dataclass(frozen=True)
class _Outcome:
    action: str  # consume, abandon, trash or lost
    counted: bool = True
    reason: str = ""


class ExecutorConductor(base.Conductor):
    """Runs claimed jobs in an executor from :meth:`_executor_factory` (see the module).

    Args:
        name: As for :class:`~flowengine.conductors.base.Conductor`.
        jobboard: As for the base.
        persistence: As for the base.
        engine: As for the base.
        engine_options: As for the base.
        wait_timeout: Longest wait for the board before it is re-read (a safety net: waiting is
            pushed); None means :attr:`REFRESH_PERIODICITY`.
        log: The logger to use.
        max_simultaneous_jobs: Jobs run at once (<= 0: no limit).
        delete_logbook: Delete the logbook of a consumed job whose flow succeeded (the logbooks
            of jobs that failed, were reverted or trashed are always kept, with how they ended:
            see :mod:`flowengine.jobs.endings`).
        clock: The lease clock claims are kept and fenced with (counts host suspension).
        factory_policy: As for the base: which stored factories jobs may name.
        coordination: Where jobs' locks are held (see :class:`~..base.Conductor`).
    """

    START_FINISH_EVENTS_EMITTED = ("compilation", "preparation", "validation", "running")
    EVENTS_EMITTED = (*(f"{e}_{edge}" for e in START_FINISH_EVENTS_EMITTED
                        for edge in ("start", "end")),
                      "job_consumed", "job_abandoned", "job_trashed")
    #: Exceptions after which a job is abandoned (resumed elsewhere), not consumed.
    NO_CONSUME_EXCEPTIONS: tuple[type[BaseException], ...] = (exc.ExecutionFailure,
                                                              exc.StorageFailure)
    MAX_SIMULTANEOUS_JOBS = -1
    REFRESH_PERIODICITY = 30.0
    #: Seconds to pause after the board or persistence failed, before trying again.
    TROUBLE_PAUSE = 1.0

    def __init__(self, name: str, jobboard: jobs_base.JobBoard, persistence: Any = None,
                 engine: str | None = None, engine_options: dict[str, Any] | None = None,
                 wait_timeout: float | None = None, log: logging.Logger | None = None,
                 max_simultaneous_jobs: int = MAX_SIMULTANEOUS_JOBS,
                 delete_logbook: bool = False,
                 clock: Callable[[], float] = lease_clock,
                 factory_policy: FactoryPolicy | None = None, coordination: Any = None) -> None:
        super().__init__(name, jobboard, persistence=persistence, engine=engine,
                         engine_options=engine_options, factory_policy=factory_policy,
                         coordination=coordination)
        if wait_timeout is not None and (isinstance(wait_timeout, bool) or not isinstance(
                wait_timeout, (int, float)) or not wait_timeout > 0):
            raise ValueError(f"Conductor {name}: wait_timeout must be a number of seconds > 0,"
                             f" not {wait_timeout!r}")
        self._wait_timeout = wait_timeout or self.REFRESH_PERIODICITY
        self._log = log or LOG
        self._max_simultaneous_jobs = max_simultaneous_jobs
        self._delete_logbook = delete_logbook
        self._clock = clock
        self._stopped = threading.Event()
        self._dead = threading.Event()
        self._dead.set()
        self._slots = threading.Condition()
        self._running: dict[str, _Running] = {}
        self._keeper: ClaimKeeper | None = None

    def _executor_factory(self) -> Any:
        """The executor jobs run in (``submit`` and ``shutdown(wait=True)``)."""
        raise NotImplementedError

    @property
    def dispatching(self) -> bool:
        """Whether :meth:`run` is claiming jobs."""
        return not self._dead.is_set() and not self._stopped.is_set()

    def claims_held(self) -> dict[str, bool]:
        """The jobs this conductor runs now (by uuid), each with whether its fence still
        believes the claim held, by this conductor's own lease clock: what a health check
        reads, and what a conductor woken from a freeze still believes until it learns
        otherwise (its first refused write, or its keep-alive, halts the job)."""
        with self._slots:
            return {uuid: held.fence.held for uuid, held in self._running.items()}

    # ---- the loop ------------------------------------------------------------------------------

    def run(self, max_dispatches: int | None = None) -> None:
        """Claim and run jobs until :meth:`stop`, or until ``max_dispatches`` were started and
        have finished."""
        self._dead.clear()
        self._stopped.clear()
        self.connect()
        keeper = self._keeper = ClaimKeeper(self._jobboard, self._name, self.conductor,
                                            clock=self._clock)
        keeper.start()
        executor = self._executor_factory()
        dispatched = 0
        try:
            while max_dispatches is None or dispatched < max_dispatches:
                if not self._wait_for_slot():
                    break
                job = self._claim_next()
                if job is not None:
                    self._submit(executor, job)
                    dispatched += 1
        finally:
            executor.shutdown(wait=True)
            keeper.stop()
            with contextlib.suppress(exc.TaskFlowException):
                self._jobboard.unregister_entity(self.conductor)
            self._dead.set()

    def stop(self) -> None:
        """Stop claiming; running engines are suspended and their jobs handed back uncounted."""
        self._stopped.set()
        with self._slots:
            running = list(self._running.values())
            self._slots.notify_all()
        for held in running:
            if held.engine is not None:
                held.engine.suspend()
        self._jobboard.wake_waiters()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`run` returned; False if ``timeout`` passed first."""
        return self._dead.wait(timeout)

    def _wait_for_slot(self) -> bool:
        with self._slots:
            while (not self._stopped.is_set() and self._max_simultaneous_jobs > 0
                   and len(self._running) >= self._max_simultaneous_jobs):
                self._slots.wait()
        return not self._stopped.is_set()

    def _claim_next(self) -> jobs_base.Job | None:
        candidates: list[jobs_base.Job] = []

        def ready() -> bool:
            if self._stopped.is_set():
                return True
            with self._slots:
                running = set(self._running)
            # A job whose run here has not ended yet (its claim lapsed while it ran: frozen,
            # cut off) is the next conductor's, not this one's again: two runs of one job
            # here would be one to this conductor, and the first one's end would take the
            # second one's record (and claim) with it.
            candidates[:] = [job for job in self._jobboard.iterjobs(only_unclaimed=True,
                                                                    ensure_fresh=True)
                             if job.uuid not in running]
            return bool(candidates)

        try:
            self._jobboard.wait_until(ready, self._wait_timeout)
        except exc.JobFailure:
            self._log.warning("Conductor %s cannot read its jobboard; retrying", self._name,
                              exc_info=True)
            self._stopped.wait(1.0)
            return None
        troubled = False
        for job in candidates:
            if self._stopped.is_set():
                return None
            claimed_at = self._clock()
            try:
                token = self._jobboard.claim(job, self._name)
            except (exc.UnclaimableJob, exc.NotFound) as err:
                self._log.debug("Job %s not claimed: %s", job.uuid, err)
                continue
            except exc.JobFailure:
                self._log.warning("Conductor %s could not claim %s", self._name, _brief(job),
                                  exc_info=True)
                troubled = True
                continue
            assert self._keeper is not None
            fence = self._keeper.hold(job, self._on_claim_lost, claimed_at,
                                      token if isinstance(token, int) else None)
            with self._slots:
                self._running[job.uuid] = _Running(job, fence)
            self._log.info("Conductor %s claimed %s (attempt %s)", self._name, _brief(job),
                           job.attempts)
            return job
        if troubled:
            self._stopped.wait(self.TROUBLE_PAUSE)  # the board is failing: do not spin on it
        return None

    def _submit(self, executor: Any, job: jobs_base.Job) -> None:
        try:
            future = executor.submit(self._dispatch_job, job)
        except RuntimeError:
            self._log.warning("Could not submit %s; handing it back", _brief(job), exc_info=True)
            self._finish(job, _Outcome("abandon", counted=False))
            return
        future.add_done_callback(lambda f: self._on_job_done(job, f))

    def _on_claim_lost(self, job: jobs_base.Job) -> None:
        with self._slots:
            held = self._running.get(job.uuid)
        if held is not None:
            held.lost = True
            if held.engine is not None:
                held.engine.halt(self._lost_claim(held))

    @staticmethod
    def _lost_claim(held: _Running) -> FencedOff:
        """Why ``held``'s engine must write nothing more."""
        return held.fence.refusal("the progress") or FencedOff(
            f"Refused to store the progress of job {held.job.uuid} ({held.job.name}): its "
            f"claim was lost")

    # ---- one job -------------------------------------------------------------------------------

    def _dispatch_job(self, job: jobs_base.Job) -> _Outcome:
        with self._slots:
            held = self._running[job.uuid]
        try:
            backend = self._fenced_backend(job, held)
            engine = held.engine = self._engine_from_job(job, backend)
        except FencedOff as err:
            self._log.warning("Conductor %s lost the claim on %s before running it: %s; leaving"
                              " it to its new owner", self._name, _brief(job), err)
            return _Outcome("lost")
        except exc.StorageFailure as err:
            # Persistence is failing, not the job: hand it back uncounted, after a pause so
            # that conductors do not pass it around in a tight loop meanwhile.
            self._log.warning("Could not load %s: %s; handing it back", _brief(job),
                              scrub(str(err), job.details))
            self._stopped.wait(self.TROUBLE_PAUSE)
            return _Outcome("abandon", counted=False, reason=str(err))
        except Exception as err:
            reason = scrub(f"no engine could be made from it: {err}", job.details)
            self._log.warning("Trashing %s: %s", _brief(job), reason)
            return _Outcome("trash", reason=reason)
        if held.lost:
            engine.halt(self._lost_claim(held))
        elif self._stopped.is_set():
            engine.suspend()
        try:
            consume = self._run_engine(job, engine, held)
        except LockHeld as err:
            # Posted with --on-conflict reject: it does not wait for the lock. Set aside,
            # with why, for an operator to repost.
            reason = f"rejected: {err}"
            self._log.warning("Trashing %s: %s", job, reason)
            return _Outcome("trash", reason=reason)
        except exc.RunHalted as err:
            if held.lost or not held.fence.held:
                self._log.warning("Conductor %s lost the claim on %s while running it and "
                                  "halted it (nothing reverted); leaving it to its new owner",
                                  self._name, _brief(job))
                return _Outcome("lost")
            # Its records could not be written: not the job's fault. Hand it back uncounted,
            # after a pause, so conductors do not pass it around in a tight loop meanwhile.
            self._log.warning("Job %s halted (nothing reverted): %s; handing it back",
                              _brief(job), scrub(str(err), job.details))
            self._stopped.wait(self.TROUBLE_PAUSE)
            return _Outcome("abandon", counted=False, reason=str(err))
        if held.lost or not held.fence.held:
            self._log.warning("Conductor %s lost the claim on %s while running it; leaving it"
                              " to its new owner", self._name, _brief(job))
            return _Outcome("lost")
        if consume:
            return _Outcome("consume")
        return _Outcome("abandon", counted=not self._stopped.is_set())

    def _fenced_backend(self, job: jobs_base.Job, held: _Running) -> FencedBackend | None:
        """The persistence the job's engine writes through (None: none), once the claim's
        fencing token is recorded on the job's flow: before the flow is loaded, so what the
        engine resumes from holds every write of an earlier claim the store will ever take."""
        if self._persistence is None:
            return None
        backend = FencedBackend(self._persistence, held.fence, self._flow_uuid_of(job))
        backend.record_fencing_token()
        return backend

    def _run_engine(self, job: jobs_base.Job, engine: Any, held: _Running) -> bool:
        details = {"job": job, "engine": engine, "conductor": self}

        def run() -> None:
            suspended = False
            for _state in engine.run_iter():
                if held.lost:
                    engine.halt(self._lost_claim(held))
                elif not suspended and self._stopped.is_set():
                    engine.suspend()
                    suspended = True

        with contextlib.ExitStack() as stack:
            # The job's span (tracing on) is current while the engine runs, so the flow's span
            # is its child; a resumed job's span links to the run that started its flow.
            stack.enter_context(tracing.claimed_job(job, self._name, engine.storage))
            for listener in self._listeners_from_job(job, engine):
                stack.enter_context(listener)
            try:
                for stage, event in ((engine.compile, "compilation"),
                                     (engine.prepare, "preparation"),
                                     (engine.validate, "validation"), (run, "running")):
                    self._notifier.notify(f"{event}_start", details)
                    try:
                        stage()
                    except Exception as err:
                        if event != "running":  # kept to say how the job ended
                            held.not_started = err
                        raise
                    self._notifier.notify(f"{event}_end", details)
            except (exc.RunHalted, LockHeld):
                raise  # nothing was reverted and nothing more written: see _dispatch_job
            except exc.FlowCancelled as err:
                # An operator's (or its deadline's) decision, carried out: the job is done.
                self._log.info("Job %s was cancelled and its work reverted (consuming it): %s",
                               job, scrub(str(err), job.details))
                return True
            except exc.WrappedFailure as failures:
                consume = not all(f.check(*self.NO_CONSUME_EXCEPTIONS) for f in failures)
                self._log.warning("Job %s failed (%s failures; %s): %s", _brief(job), len(failures),
                                  "consuming it" if consume else "not consuming it",
                                  scrub(str(failures), job.details))
                return consume
            except self.NO_CONSUME_EXCEPTIONS as err:
                self._log.warning("Job %s failed (not consuming it): %s", _brief(job),
                                  scrub(str(err), job.details))
                return False
            except Exception as err:
                self._log.warning("Job %s failed (consuming it): %s", _brief(job),
                                  scrub(str(err), job.details))
                return True
        if engine.storage.get_flow_state() == states.SUSPENDED:
            self._log.info("Job %s was suspended", _brief(job))
            return False
        self._log.info("Job %s completed", _brief(job))
        return True

    def _on_job_done(self, job: jobs_base.Job, future: Any) -> None:
        try:
            outcome = future.result()
        except Exception as err:
            self._log.warning("Dispatching %s failed", _brief(job), exc_info=True)
            outcome = _Outcome("trash", reason=f"dispatching it failed: {err}")
        try:
            self._finish(job, outcome)
        finally:
            with self._slots:
                self._running.pop(job.uuid, None)
                self._slots.notify_all()
            self._jobboard.wake_waiters()  # a job skipped while this run went on may be free

    def _let_go(self, job: jobs_base.Job) -> None:
        """Hand back a claim this conductor stopped trusting (its run halted), in case the
        board still holds it: its fence lapses by the local clock, which a slow write or a
        starved renewal can outrun while the board still has the claim. Left alone, that
        claim would outlive the run (on ZooKeeper, for as long as this conductor's session
        lives) with nobody running the job. Taken over by another, the board refuses."""
        try:
            self._jobboard.abandon(job, self._name, counted=False)
        except (exc.JobFailure, exc.NotFound):
            return  # another conductor holds it, or nobody does: as expected
        self._log.info("Conductor %s handed back its claim on %s, which the board still held",
                       self._name, _brief(job))

    def _finish(self, job: jobs_base.Job, outcome: _Outcome) -> None:
        if self._keeper is not None:
            self._keeper.release(job)
        if outcome.action == "lost":
            self._let_go(job)
            return
        board, who = self._jobboard, self._name
        ending = {"job": job, "conductor": self, "persistence": self._persistence}
        trashed = outcome.reason if outcome.action == "trash" else None
        try:
            if outcome.action == "consume":
                board.consume(job, who)
                self._notifier.notify("job_consumed", ending)
            elif outcome.action == "trash":
                board.trash(job, who, reason=outcome.reason)
                self._notifier.notify("job_trashed", {**ending, "reason": outcome.reason})
            else:
                board.abandon(job, who, counted=outcome.counted)
                self._notifier.notify("job_abandoned", ending)
                if outcome.counted and job.state == states.COMPLETE:
                    # That was its last attempt: the board moved it to the trash.
                    trashed = (f"abandoned or orphaned {self._jobboard.options.max_attempts}"
                               f" times")
                    self._log.warning("Job %s was trashed: %s", _brief(job), trashed)
                    self._notifier.notify("job_trashed", {**ending, "reason": trashed})
        except (exc.JobFailure, exc.NotFound) as err:
            self._log.warning("Could not %s %s: %s", outcome.action, _brief(job), err)
            return
        if outcome.action == "consume" or trashed is not None:
            self._record_ending(job, trashed)

    def _record_ending(self, job: jobs_base.Job, trashed: str | None) -> None:
        """Keep how ``job`` ended in its logbook; delete the logbook of one that succeeded if
        this conductor was asked to (``delete_logbook``)."""
        if self._persistence is None or job.book_uuid is None:
            return
        try:
            flow_detail = self._stored_flow(job)
        except exc.TaskFlowException as err:
            self._log.warning("Could not read how %s ended: %s", _brief(job), err)
            flow_detail = None
        state = flow_detail.state if flow_detail is not None else None
        outcome = endings.TRASHED if trashed is not None else endings.outcome_of(state)
        reason = trashed or ("" if outcome == endings.SUCCESS else self._why(job, flow_detail))
        ended = endings.Ending(job_uuid=job.uuid, job_name=job.name, book_uuid=job.book_uuid,
                               outcome=outcome, reason=scrub(reason, job.details),
                               conductor=self._name, ended_at=jobs_base.utcnow(),
                               flow_state=state)
        if outcome == endings.SUCCESS and self._delete_logbook:
            self._delete_book(job)
            return
        try:
            endings.record(self._persistence, job, ended)
        except exc.TaskFlowException as err:
            self._log.warning("Could not record how %s ended (%s): %s", _brief(job), outcome, err)

    def _stored_flow(self, job: jobs_base.Job) -> Any:
        """The job's flow detail as stored now (None: the book has no single one)."""
        assert self._persistence is not None and job.book_uuid is not None
        flow_uuid = (job.details or {}).get("flow_uuid")
        with contextlib.closing(self._persistence.get_connection()) as conn:
            if isinstance(flow_uuid, str):
                return conn.get_flow_details(flow_uuid)
            found = list(conn.get_flows_for_book(job.book_uuid))
        return found[0] if len(found) == 1 else None

    def _why(self, job: jobs_base.Job, flow_detail: Any) -> str:
        """Why a consumed job did not succeed: the failure its flow stored, its cancellation,
        or why its engine could not start it (kept when that happened: the engine is never
        asked again, since preparing a finished flow would reset it)."""
        if flow_detail is not None:
            failed = endings.failure_reason(flow_detail)
            if failed:
                return failed
            cancelled = stopping.CancelRequest.from_record(
                flow_detail.meta.get(stopping.META_CANCELLED))
            if cancelled is not None:
                return f"cancelled by {cancelled.by}: {cancelled.reason}"
        with self._slots:
            held = self._running.get(job.uuid)
        err = held.not_started if held is not None else None
        if isinstance(err, exc.MissingDependencies):
            return (f"it could not start: MissingDependencies: it needs input(s) nothing "
                    f"provides: {', '.join(sorted(err.missing_requirements))}")
        if err is not None:
            first = str(err).splitlines()[0] if str(err) else ""
            return f"it could not start: {type(err).__name__}: {first}"
        state = flow_detail.state if flow_detail is not None else "unknown"
        return f"its flow ended {state} (see the log of conductor {self._name})"

    def _holding(self) -> list[str]:
        with self._slots:
            return sorted({held.job.book_uuid for held in self._running.values()
                           if held.job.book_uuid})

    def _delete_book(self, job: jobs_base.Job) -> None:
        if self._persistence is None or job.book_uuid is None:
            return
        try:
            with contextlib.closing(self._persistence.get_connection()) as conn:
                conn.destroy_logbook(job.book_uuid)
        except exc.TaskFlowException as err:
            self._log.warning("Could not delete the logbook of consumed %s: %s", _brief(job), err)
