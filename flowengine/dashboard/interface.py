"""Everything the dashboard reads and changes, behind one interface: :class:`DashboardData`.

Flows come from the persistence backend (so history survives restarts), live state from the
event hub, workers from their announcements and heartbeats, dead letters from the broker, jobs
from a jobboard when one is given. Every value handed to a page is masked here first
(:mod:`flowengine.dashboard.masking`); the web layer never touches a backend or a broker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flowengine import engines, states
from flowengine import exceptions as exc
from flowengine.cli import records
from flowengine.dashboard import compiled as cp
from flowengine.dashboard import layout, resuming, timeline
from flowengine.dashboard.live import EventHub
from flowengine.dashboard.masking import mask, mask_text
from flowengine.engines import admission, stopping
from flowengine.engines import repair as repairing
from flowengine.engines import suspend_requests as sr
from flowengine.engines.factory_policy import FactoryPolicy
from flowengine.jobs.base import JobBoard
from flowengine.persistence import base, models, queries
from flowengine.persistence.secret_keeping import META_SECRETS
from flowengine.worker_based.remote_control import ACTION_CANCEL, push_suspend

LOG = logging.getLogger(__name__)

#: Flow detail metadata naming the engine to resume a flow saved without ``flowengine run``'s
#: record on (see :mod:`flowengine.dashboard.resuming`).
ENGINE_META = resuming.ENGINE_META
#: Flow states a flow can be resumed from.
RESUMABLE = frozenset({states.SUSPENDED, states.FAILURE})
#: Flow states a flow can be cancelled from (running somewhere, or stopped halfway).
CANCELLABLE = frozenset({states.RUNNING, states.SUSPENDING, states.SUSPENDED, states.FAILURE})
#: Who the dashboard's cancels and repairs are recorded as made by.
BY = "dashboard"
#: Seconds the per-topic queue depths are kept before the broker is asked again.
TOPICS_TTL = 5.0
#: Ended jobs the jobs page shows, most recent first.
ENDED_SHOWN = 50
#: What the jobs page shows of a conductor's registration.
CONDUCTOR_FIELDS = ("hostname", "pid", "engine")


class ActionRefused(Exception):
    """An action cannot be done (read-only mode, wrong state, unknown id); the message says why."""


@dataclasses.dataclass(frozen=True)
class FlowView:
    """One flow as its page shows it (every value already masked)."""

    summary: dict[str, Any]
    atoms: list[dict[str, Any]]
    drawing: layout.Layout
    graph_note: str | None
    timeline: timeline.Timeline | None
    store: Any
    running_here: bool
    resumable: bool
    #: Where its engine runs (host, pid, engine, since), while it runs with a shared backend.
    running_on: dict[str, Any] | None = None
    #: A suspend request not yet answered (at, by).
    suspend_requested: dict[str, Any] | None = None
    #: A cancel request not yet answered (at, by, reason).
    cancel_requested: dict[str, Any] | None = None
    #: The cancel applied to the flow (at, by, reason).
    cancelled: dict[str, Any] | None = None
    #: When its deadline expires (ISO time), if it has one.
    deadline: str | None = None
    #: The repairs made to it, oldest first (action, atom, reason, by, at, atoms).
    repairs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: The repairs its stored state suggests: ``retry_reverts`` (bool), ``mark_reverted`` and
    #: ``retry_from`` (atom names); the engine checks each again when asked.
    repairable: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Whether it can be cancelled from here.
    cancellable: bool = False
    #: The locks it holds (``locks``) or the one it waits for (``waiting``), while it runs.
    coordination: dict[str, Any] | None = None


class DashboardData:
    """The dashboard's data and actions.

    Args:
        backend: Where flows are stored.
        hub: The event hub (live events and workers).
        broker: Broker settings (``exchange``, ``url``, ``transport``, ``transport_options``)
            for dead letters and resumed worker-based flows; None for none.
        board: A connected jobboard (TaskFlow's JobBoard API), or None.
        clock: UNIX time.
        factories: The stored factories it may import and call, to draw a flow's graph and to
            resume it (none by default: pages draw the stored atoms; see
            :mod:`flowengine.engines.factory_policy`).
    """

    def __init__(self, backend: base.Backend, hub: EventHub,
                 broker: Mapping[str, Any] | None = None, board: JobBoard | None = None,
                 clock: Callable[[], float] = time.time,
                 factories: FactoryPolicy = cp.NO_FACTORIES) -> None:
        self.backend, self.hub, self.board, self._clock = backend, hub, board, clock
        self.broker = dict(broker) if broker is not None else None
        self._compiler = cp.Compiler(factories)
        self._running: dict[str, Any] = {}
        self._topics: tuple[float, list[dict[str, Any]]] | None = None
        self._coordinator: Any = None  # the locks' service, connected on first look
        self._lock = threading.Lock()

    @property
    def factories(self) -> FactoryPolicy:
        """The stored factories it may import and call."""
        return self._compiler.policy

    # -- flows --------------------------------------------------------------------------

    def flows(self, query: queries.FlowQuery) -> queries.FlowPage:
        """A page of stored flows, newest first."""
        return queries.find_flows(self.backend, query)

    def _load(self, flow_uuid: str) -> models.FlowDetail | None:
        with contextlib.closing(self.backend.get_connection()) as conn:
            try:
                return conn.get_flow_details(flow_uuid)
            except exc.NotFound:
                return None

    def _written(self, fd: models.FlowDetail) -> datetime.datetime | None:
        with contextlib.closing(self.backend.get_connection()) as conn:
            return records.book_written(conn, fd)

    def flow(self, flow_uuid: str) -> FlowView | None:
        """Everything the flow page shows, or None when no flow has that uuid."""
        fd = self._load(flow_uuid)
        if fd is None:
            return None
        compiled = self._compiler.compile(fd)
        stored = [records.atom_record(ad) for ad in records.atoms_of(fd)]
        injected = next((ad.results for ad in fd if ad.name == records.INJECTOR), None)
        injected = injected if isinstance(injected, dict) else {}
        results = {a["name"]: a["result"] for a in stored}
        secrets = _secret_values(compiled, stored, results, injected)
        atoms = [self._shown(a, compiled, results, injected, secrets) for a in stored]
        summary = mask(records.flow_summary(None, fd, self._written(fd)), secrets)
        with self._lock:
            running_here = flow_uuid in self._running
        return FlowView(
            summary=summary, atoms=atoms,
            drawing=cp.drawing(compiled, [a["name"] for a in stored]),
            graph_note=compiled if isinstance(compiled, str) else None,
            timeline=timeline.build(stored, self.hub.events_of(flow_uuid), self._clock()),
            store=mask(injected, secrets), running_here=running_here,
            resumable=fd.state in RESUMABLE and not running_here,
            running_on=_record(fd.meta.get(sr.META_RUNNING_ON)),
            suspend_requested=_record(fd.meta.get(sr.META_REQUEST)),
            cancel_requested=_record(fd.meta.get(sr.META_CANCEL_REQUEST)),
            cancelled=_record(fd.meta.get(stopping.META_CANCELLED)),
            deadline=_utc_epoch(stopping.stored_deadline(fd.meta)),
            repairs=[mask(r) for r in fd.meta.get(repairing.META_REPAIRS) or ()
                     if isinstance(r, dict)],
            repairable={} if running_here else _repairable(fd),
            cancellable=running_here or fd.state in CANCELLABLE,
            coordination=_coordination(fd.meta.get(admission.META_COORDINATION)))

    def _shown(self, atom: dict[str, Any], compiled: cp.Compiled | str, results: dict[str, Any],
               injected: dict[str, Any], secrets: list[str]) -> dict[str, Any]:
        shown = {k: atom[k] for k in ("name", "uuid", "kind", "state", "intention", "progress",
                                      "started_at", "duration", "revert_duration", "attempts",
                                      "workers", "attempt_log", "delayed_until")}
        # A task waiting for a lock or a concurrency limit: what for, and who holds it.
        shown["waiting_for"] = (None if not atom["waiting_for"] else
                                mask_text(admission.describe_wait(atom["waiting_for"]), secrets))
        inputs = ({} if isinstance(compiled, str)
                  else cp.inputs_of(compiled, atom["name"], results, injected))
        if not isinstance(compiled, str):
            for name in compiled.secret_args.get(atom["name"], ()):
                inputs[name] = "***"  # shown as given even when (as now) it was not stored
        shown["inputs"] = mask(inputs, secrets)
        shown["result"] = mask(atom["result"], secrets)
        shown["revert_result"] = mask(atom["revert_result"], secrets)
        for key in ("failure", "revert_failure"):
            failure = atom[key]
            shown[key] = None if failure is None else {
                "type": failure["type"], "message": mask_text(failure["message"] or "", secrets),
                "traceback": mask_text(failure["traceback"] or "", secrets)}
        return shown

    # -- actions ------------------------------------------------------------------------

    def resume(self, flow_uuid: str) -> str:
        """Resume a suspended or failed flow in this process, on its stored engine options.

        Raises:
            ActionRefused: no such flow, it is not resumable, or it cannot be rebuilt.
        """
        fd = self._load(flow_uuid)
        if fd is None:
            raise ActionRefused(f"no flow {flow_uuid!r}")
        if fd.state not in RESUMABLE:
            raise ActionRefused(f"flow {fd.name!r} is {fd.state}; only "
                                f"{' or '.join(sorted(RESUMABLE))} flows can be resumed")
        name = self._start_here(fd, lambda _engine: None)
        return f"resuming flow {fd.name!r} on the {name} engine"

    def _start_here(self, fd: models.FlowDetail, prepare: Callable[[Any], None]) -> str:
        """Run a stored flow in this process (on its stored engine options), after
        ``prepare(engine)``; return the engine's name.

        Raises:
            ActionRefused: it needs secrets a page cannot take, or it cannot be rebuilt, or
                ``prepare`` refused.
        """
        flow_uuid = fd.uuid
        secrets = fd.meta.get(META_SECRETS)
        if secrets:
            # Secret values are never stored, and a page cannot be trusted to take them.
            raise ActionRefused(
                f"flow {fd.name!r} needs its secret input(s) {', '.join(map(repr, secrets))} "
                f"again; resume it with: flowengine run --resume {fd.uuid} "
                + " ".join(f"--store {n}=VALUE" for n in secrets))
        try:
            name, options = resuming.engine_options(fd, self.broker)
        except resuming.OptionsMissing as err:
            raise ActionRefused(str(err)) from err
        if not self.factories.allows_any:
            raise ActionRefused(f"flow {fd.name!r} cannot be resumed here: that would import "
                                f"and call its stored factory, and this dashboard allows no "
                                f"factory module (--allow-factories MODULE)")
        try:
            flow = engines.flow_from_detail(fd, policy=self.factories)
            engine = engines.load(flow, flow_detail=fd, backend=self.backend, engine=name,
                                  **options)
        except Exception as err:
            raise ActionRefused(f"flow {fd.name!r} cannot be resumed: "
                                f"{type(err).__name__}: {mask_text(str(err))}") from err
        try:
            prepare(engine)
        except (repairing.RepairRefused, ValueError) as err:
            raise ActionRefused(mask_text(str(err))) from err
        with self._lock:
            if flow_uuid in self._running:
                raise ActionRefused(f"flow {fd.name!r} is already running here")
            self._running[flow_uuid] = engine
        threading.Thread(target=self._run, args=(flow_uuid, engine), daemon=True,
                         name=f"flowengine-dashboard-resume-{flow_uuid[:8]}").start()
        return name

    def _run(self, flow_uuid: str, engine: Any) -> None:
        try:
            engine.run()
        except Exception as err:  # the flow's own outcome is stored; this is for the log
            LOG.info("Resumed flow %s ended with %s", flow_uuid, mask_text(repr(err)))
        finally:
            with self._lock:
                self._running.pop(flow_uuid, None)

    def suspend(self, flow_uuid: str) -> str:
        """Suspend a running flow, in this process or another; running atoms finish first.

        A flow this dashboard resumed is suspended directly; any other is asked through the
        backend (see :mod:`flowengine.engines.suspend_requests`): its engine stops at its next
        atom transition, or at once when it is a worker-based engine on this dashboard's
        broker (:mod:`flowengine.worker_based.remote_control`).

        Raises:
            ActionRefused: no such flow, or it is not running anywhere.
        """
        with self._lock:
            engine = self._running.get(flow_uuid)
        if engine is not None:
            engine.suspend()
            return f"suspending flow {flow_uuid}: running atoms finish first"
        try:
            asked = sr.request_suspend(self.backend, flow_uuid, by="dashboard")
        except sr.SuspendRefused as err:
            raise ActionRefused(str(err)) from err
        pushed = push_suspend(asked.running_on, flow_uuid, self.broker)
        return asked.text if pushed is None else f"{asked.text}; {mask_text(pushed)}"

    def cancel(self, flow_uuid: str, reason: str) -> str:
        """Cancel a flow and undo what it did, wherever it runs (see ``flowengine cancel``).

        A flow this dashboard runs is cancelled directly; one running elsewhere is asked
        through the backend (and at once through this dashboard's broker, when its
        worker-based engine listens there); one running nowhere is cancelled here, by running
        its reverts on its stored engine options.

        Raises:
            ActionRefused: no reason, no such flow, or it ended.
        """
        if not reason.strip():
            raise ActionRefused("a cancel needs a reason")
        with self._lock:
            engine = self._running.get(flow_uuid)
        if engine is not None:
            engine.cancel(reason, by=BY)
            return f"cancelling flow {flow_uuid}: running tasks are asked to stop"
        try:
            asked = sr.request_cancel(self.backend, flow_uuid, reason, by=BY)
        except sr.NotRunning as err:
            fd = self._load(flow_uuid)
            if fd is None or fd.state not in CANCELLABLE:
                raise ActionRefused(str(err)) from err
            name = self._start_here(fd, lambda loaded: loaded.cancel(reason, by=BY))
            return f"cancelling flow {fd.name!r} here, on the {name} engine: {err}"
        except (sr.SuspendRefused, ValueError) as err:
            raise ActionRefused(str(err)) from err
        pushed = push_suspend(asked.running_on, flow_uuid, self.broker, action=ACTION_CANCEL)
        return asked.text if pushed is None else f"{asked.text}; {mask_text(pushed)}"

    def repair(self, flow_uuid: str, action: str, atom: str, reason: str) -> str:
        """Repair a stored flow and run it to its end in this process (see
        :mod:`flowengine.engines.repair`).

        Raises:
            ActionRefused: no such flow, an engine or conductor holds it, or the repair does
                not fit it.
        """
        fd = self._load(flow_uuid)
        if fd is None:
            raise ActionRefused(f"no flow {flow_uuid!r}")
        with self._lock:
            here = flow_uuid in self._running
        held = "this dashboard" if here else repairing.holder(fd.meta, fd.uuid, self.board)
        if held is not None:
            raise ActionRefused(f"flow {fd.name!r} ({fd.uuid}) is held by {held}: it cannot "
                                f"be repaired while it runs")
        request = (action, atom or None, reason.strip() or None, BY)
        name = self._start_here(fd, lambda engine: engine.repair(*request))
        return f"repairing flow {fd.name!r} ({action}{' ' + atom if atom else ''}) on the " \
               f"{name} engine"

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no resumed flow runs here (for tests and shutdown); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._running:
                    return True
            time.sleep(0.05)
        return False

    # -- workers, dead letters, jobs ------------------------------------------------------

    def workers(self) -> list[dict[str, Any]]:
        """Workers heard from (live, then gone), with masked host details."""
        return [mask(row) for row in self.hub.workers()]

    def topics(self) -> list[dict[str, Any]]:
        """Each worker topic's queue depth, as far as the broker tells it (None: it cannot).

        Every topic of the exchange where the broker lists its queues, else the topics the
        workers heard from serve. Read at most every ``TOPICS_TTL`` seconds: the workers page
        reloads its live part on every worker heartbeat.

        Raises:
            ActionRefused: no broker options.
        """
        if self.broker is None:
            raise ActionRefused("no broker: start the dashboard with broker options")
        now = self._clock()
        with self._lock:
            if self._topics is not None and now - self._topics[0] < TOPICS_TTL:
                return self._topics[1]
        found = self._read_topics()
        with self._lock:
            self._topics = (now, found)
        return found

    def _read_topics(self) -> list[dict[str, Any]]:
        assert self.broker is not None
        from flowengine.worker_based import topics as tp

        try:
            found = tp.topic_stats(**self.broker)
        except tp.TopicsNotListed:
            heard = {topic for row in self.hub.workers() for topic in row.get("topics") or ()}
            found = tp.topic_stats(**self.broker, topics=sorted(heard)) if heard else []
        return [mask(stats.to_dict()) for stats in found]

    def _letters(self) -> Any:
        if self.broker is None:
            raise ActionRefused("no broker: start the dashboard with broker options")
        from flowengine.worker_based.dead_letters import DeadLetters

        return DeadLetters(**self.broker)

    def dead_letters(self) -> list[dict[str, Any]]:
        """Parked requests, oldest first, as masked dicts."""
        letters = self._letters()
        try:
            return [mask(letter.to_dict()) for letter in letters.list()]
        finally:
            letters.close()

    def requeue(self, letter_id: str) -> str:
        """Send a parked request back to its topic, unless its flow has finished (the rule
        ``flowengine dead-letters requeue`` applies, with the dashboard's backend)."""
        from flowengine.worker_based import requeue_rules as rules
        from flowengine.worker_based.dead_letter_keeping import RequeueRefused

        letters = self._letters()
        try:
            letter = letters.get(letter_id)
            verdict = rules.judge(letter, rules.flow_state(self.backend, letter))
            if not verdict.allowed:
                raise ActionRefused(verdict.message)
            letters.requeue(letter_id)
        except (exc.NotFound, RequeueRefused) as err:
            raise ActionRefused(str(err)) from err
        finally:
            letters.close()
        return (f"requeued {letter.task_name} ({letter.id}) to topic {letter.topic}: "
                f"{verdict.message}")

    def discard(self, letter_id: str) -> str:
        """Delete a parked request for good."""
        if self.broker is None:
            raise ActionRefused("no broker: start the dashboard with broker options")
        from flowengine.worker_based.dead_letters import DeadLetters

        if not DeadLetters(**self.broker).discard(letter_id):
            raise ActionRefused(f"No dead letter with id {letter_id!r}")
        return f"discarded dead letter {letter_id}"

    def _board(self) -> Any:
        if self.board is None:
            raise ActionRefused("no jobboard: start the dashboard with --board")
        return self.board

    def locks(self) -> list[dict[str, Any]] | None:
        """The locks and concurrency limits on the board's service (None without a board):
        for each key, who holds it and who waits, in order."""
        if self.board is None:
            return None
        from flowengine import coordination

        with self._lock:
            if self._coordinator is None:
                self._coordinator = coordination.for_board(self.board, owner="dashboard")
            coordinator = self._coordinator
        return [{"key": e.key, "kind": e.info.get("kind") or ("lock" if e.limit == 1
                                                              else "limit"),
                 "limit": e.limit, "position": e.position,
                 "state": "held" if e.holding else "waiting",
                 "holder": mask_text(coordination.describe_holder(e.info), []),
                 "since": e.info.get("since")} for e in coordinator.listing()]

    def close(self) -> None:
        """Release what the dashboard connected on its own (the locks' service)."""
        with self._lock:
            coordinator, self._coordinator = self._coordinator, None
        if coordinator is not None:
            coordinator.close()

    def jobs(self) -> list[dict[str, Any]] | None:
        """Jobs on the board (None without one), most urgent first, with state, owner and
        attempts."""
        if self.board is None:
            return None
        found = []
        for job in self.board.iterjobs(only_unclaimed=False, ensure_fresh=True):
            try:
                owner = self.board.find_owner(job)
            except exc.NotFound:  # consumed or trashed since it was listed
                continue
            found.append(mask({
                "uuid": job.uuid, "name": job.name, "state": job.state, "owner": owner,
                "attempts": getattr(job, "attempts", None),
                "priority": getattr(getattr(job, "priority", None), "name", None),
                "created_on": _utc(getattr(job, "created_on", None))}))
        return found

    def trash(self) -> list[dict[str, Any]]:
        """The board's trashed jobs, oldest first, with why and after how many attempts."""
        return [mask({"uuid": t.uuid, "name": t.name, "reason": t.reason,
                      "attempts": t.attempts, "trashed_on": _utc(t.trashed_on)})
                for t in self._board().iter_trash()]

    def damaged(self) -> list[dict[str, Any]]:
        """Values on the board that are not jobs (skipped; trashed unless claimed)."""
        return [mask({"key": d.key, "reason": d.reason, "trashed": d.trashed})
                for d in self._board().iter_damaged()]

    def ended(self) -> list[dict[str, Any]]:
        """How the board's most recent jobs ended (SUCCESS, REVERTED, FAILED, TRASHED), from
        the logbooks their conductors kept (:mod:`flowengine.jobs.endings`)."""
        from flowengine.jobs import endings

        return [mask({**e.to_dict(), "ended_at": _utc(e.ended_at)})
                for e in endings.find_endings(self.backend, self._board(), limit=ENDED_SHOWN)]

    def orphans(self) -> list[dict[str, Any]]:
        """Flows orphaned on the board: stored unfinished, their job lost, held by no live
        conductor (:mod:`flowengine.jobs.orphans`)."""
        from flowengine.jobs import orphans

        return [mask(o.to_dict()) for o in orphans.find_orphans(self._board(), self.backend)]

    def conductors(self) -> list[dict[str, Any]]:
        """The conductors alive on the board (their registrations), by name."""
        return [mask({"name": e.name, **{k: e.metadata.get(k) for k in CONDUCTOR_FIELDS}})
                for e in self._board().iter_entities("conductor")]

    def repost(self, job_uuid: str) -> str:
        """Put a trashed job back on the board, unclaimed and with its attempts reset.

        Raises:
            ActionRefused: no board, or no trashed job has that uuid.
        """
        try:
            job = self._board().repost(job_uuid)
        except exc.NotFound as err:
            raise ActionRefused(str(err)) from err
        return f"re-posted job {job.name!r} ({job.uuid})"


def _utc_epoch(when: float | None) -> str | None:
    """Seconds since the epoch as the pages show times (UTC, to the second)."""
    if when is None:
        return None
    return _utc(datetime.datetime.fromtimestamp(when, datetime.UTC))


def _repairable(fd: models.FlowDetail) -> dict[str, Any]:
    """The repairs a flow's stored state suggests (buttons; the engine decides)."""
    atoms = [ad for ad in fd if ad.name != records.INJECTOR]
    failed_reverts = [ad.name for ad in atoms if ad.state == states.REVERT_FAILURE]
    found: dict[str, Any] = {"retry_reverts": False, "mark_reverted": [], "retry_from": []}
    if fd.state == states.FAILURE:
        found["retry_reverts"] = bool(failed_reverts)
        found["mark_reverted"] = failed_reverts
    if fd.state in (states.FAILURE, states.REVERTED) and not failed_reverts:
        found["retry_from"] = [ad.name for ad in atoms if ad.failure is not None]
    return found


def _coordination(value: Any) -> dict[str, Any] | None:
    """The flow's locks and wait as the flow page shows them (None: neither)."""
    if not isinstance(value, dict):
        return None
    waiting = value.get("waiting")
    shown = {"locks": [str(k) for k in value.get("locks") or ()],
             "waiting": admission.describe_wait(waiting) if isinstance(waiting, dict) else None}
    return shown if shown["locks"] or shown["waiting"] else None


def _utc(when: Any) -> str | None:
    """A board's (timezone-aware) time as the pages show times: UTC, to the second."""
    if not isinstance(when, datetime.datetime):
        return None
    if when.tzinfo is not None:
        when = when.astimezone(datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S")


def _secret_values(compiled: cp.Compiled | str, atoms: list[dict[str, Any]],
                   results: dict[str, Any], injected: dict[str, Any]) -> list[str]:
    """The stored values of every atom's ``secret_args`` (masked wherever they appear)."""
    if isinstance(compiled, str):
        return []
    found = []
    for atom in atoms:
        names = compiled.secret_args.get(atom["name"], ())
        if names:
            given = cp.inputs_of(compiled, atom["name"], results, injected)
            found += [str(given[n]) for n in names if given.get(n) not in (None, "")]
    return found


def open_board(uri: str, backend: base.Backend) -> Any:
    """Connect to the jobboard ``uri`` (TaskFlow's JobBoard API) for the jobs page.

    Raises:
        ImportError: this flowengine has no ``flowengine.jobs`` package.
    """
    try:
        from flowengine.jobs import backends as job_backends
    except ImportError as err:
        raise ImportError("--board needs flowengine.jobs, which this installation lacks") from err
    board = job_backends.fetch("flowengine-dashboard", uri, persistence=backend)
    board.connect()
    return board


def _record(value: Any) -> dict[str, Any] | None:
    """A small stored record of plain values, masked for a page (None: absent or not one)."""
    return mask({k: v for k, v in value.items() if isinstance(v, (str, int, float))}
                ) if isinstance(value, dict) else None
