"""Crash and resume: an engine in a child process is SIGKILLed at random points of a persisted
flow, and new processes resume it from the backend (SQLite file, PostgreSQL) until it ends.

The tasks (``crash_tasks.py``) record every start and end in their own ledger. A kill point is a
number of distinct task actions (execute or revert) started, drawn from a generator seeded anew
on every run (the seed is printed; ``FLOWENGINE_CRASH_SEED=<seed>`` replays a run); the test
polls the ledger until the child got that far (its tasks wait at the next start until then),
SIGKILLs it, reads what the backend holds, and starts a new child (``crash_child.py``) that
resumes the flow detail with ``engines.load_from_detail``. From the ledger and those
snapshots :func:`check_resumption` checks what resumption promises:

* an action whose outcome was recorded before a kill never starts again: only actions in flight
  at a kill (started without an end) start again;
* the one exception is the crash window every engine has: the task returned, but the process
  died before the engine stored the outcome. Then the engine must not have started anything
  else in between (it records a finished atom before running more work), and the action runs
  again: it is counted, and the ledger must show exactly one extra end for it;
* in the end every action finished exactly once (plus those extra ends), the flow reached its
  end state, and the results are those of a run that never crashed.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import crash_tasks
import pytest

from flowengine import states
from flowengine.persistence import backends, base, models

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHILD = HERE / "crash_child.py"
#: Kills per scenario and backend.
KILLS = 5
#: The longest one child may take to reach its kill point or to finish: a resumed flow that
#: hangs fails here.
CHILD_DEADLINE = 30.0
#: How often the ledger is read while waiting for a kill point.
POLL_INTERVAL = 0.002
#: Names the seed to replay a run's kill points with.
SEED_ENV = "FLOWENGINE_CRASH_SEED"


def run_seed(environ: Mapping[str, str]) -> int:
    """The seed of this run's kill points: ``SEED_ENV`` when set, else a new one from the clock."""
    given = environ.get(SEED_ENV, "").strip()
    return int(given) if given else time.time_ns() % 2**32


SEED = run_seed(os.environ)

EXECUTE, REVERT = "execute", "revert"
#: Stored atom states saying the engine has recorded the outcome of the atom's execute / revert.
RECORDED = {
    EXECUTE: frozenset((states.SUCCESS, states.FAILURE, states.REVERTING, states.REVERTED,
                        states.REVERT_FAILURE)),
    REVERT: frozenset((states.REVERTED, states.REVERT_FAILURE)),
}

Key = tuple[str, str]  # (atom name, action)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One flow shape on one engine; ``fail`` names a task that fails so the flow reverts.

    Kill points are ``random_kills`` numbers drawn from a generator seeded with the run's seed
    and the scenario's id, plus the ``pinned`` ones.
    """

    engine: str
    shape: str
    size: int = 12
    fail: str | None = None
    work: float = 0.03
    random_kills: int = KILLS
    pinned: tuple[int, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.engine}-{self.shape}" + ("-reverting" if self.fail else "")

    def factory_kwargs(self, ledger: Path) -> dict[str, Any]:
        return {"shape": self.shape, "size": self.size, "ledger": str(ledger),
                "work": self.work, "fail": self.fail}

    def executed(self) -> list[str]:
        """Tasks whose execute must run: all of them, or those up to the failing task."""
        names = crash_tasks.task_names(self.shape, self.size)
        if self.fail is None:
            return names
        index = names.index(self.fail)
        if self.shape == "linear":
            return names[:index + 1]
        # A failing task's siblings may or may not start, depending on when it fails.
        return names[:index - index % crash_tasks.LAYER_WIDTH] + [self.fail]

    def kill_points(self, seed: int = SEED) -> list[int]:
        """Numbers of distinct actions started at which to kill (each run must reach its own).

        A parallel engine starts a whole layer of the graph at once, and a kill anywhere in it
        lands while that layer runs, so a second point in one layer would be passed unkilled:
        there, points are drawn in distinct layers (at most one kill per layer).
        """
        rng = random.Random(f"{seed}:{self.id}")
        reachable = len(self.executed()) * (2 if self.fail else 1)
        if not self.parallel_layers:
            drawn = rng.sample(range(1, reachable), self.random_kills)
        else:
            width = crash_tasks.LAYER_WIDTH
            layers = range(-(-reachable // width))
            drawn = [layer * width + rng.randrange(1, min(width, reachable - 1 - layer * width) + 1)
                     for layer in rng.sample(layers, min(self.random_kills, len(layers)))]
        return sorted(set(drawn) | set(self.pinned))

    @property
    def parallel_layers(self) -> bool:
        return self.engine == "parallel" and self.shape == "graph"


SCENARIOS = [
    Scenario("serial", "linear"),
    Scenario("parallel", "linear"),
    Scenario("parallel", "graph"),
    Scenario("serial", "linear", fail="t08"),
    Scenario("parallel", "linear", fail="t08"),
]


# ---- the oracle -----------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """One child process: the ledger lines it wrote, and the atom states stored after its kill."""

    records: list[dict[str, Any]]
    stored: dict[str, str] | None  # None: the child was not killed (it ran to an end)


def _key(record: dict[str, Any]) -> Key:
    return record["atom"], record["event"].split("-")[0]


def _is_start(record: dict[str, Any]) -> bool:
    return record["event"] in crash_tasks.STARTS


def check_resumption(runs: list[Run], serial: bool) -> collections.Counter[str]:
    """Check the ledger against the stored snapshots; return what the kills caught.

    ``serial``: the engine runs tasks in its own thread, so it can record each atom before it
    starts the next (a parallel engine may start atoms of a round while another one returns).

    Raises:
        AssertionError: naming the atom, the action and the run where a promise was broken.
    """
    caught: collections.Counter[str] = collections.Counter()
    finished: dict[Key, int] = {}  # recorded before kill N: must never start again
    last: dict[Key, tuple[str, int]] = {}  # last event ("start" or "end") and its run
    reruns: collections.Counter[Key] = collections.Counter()  # ran again after returning
    for number, run in enumerate(runs, 1):
        for record in run.records:
            key = _key(record)
            atom, action = key
            if _is_start(record):
                if key in finished:
                    raise AssertionError(
                        f"{atom} {action}: finished and recorded before kill {finished[key]}, "
                        f"yet started again in run {number}: a completed atom ran again")
                if key in last and last[key][1] == number:
                    raise AssertionError(f"{atom} {action} started twice in run {number}")
                if key in last:
                    caught["restarted"] += 1
                last[key] = ("start", number)
            else:
                if last.get(key, ("end",))[0] != "start":
                    raise AssertionError(f"{atom} {action} ended in run {number} without a start")
                last[key] = ("end", number)
        if run.stored is None:
            continue
        caught["kills"] += 1
        _classify_at_kill(number, run, last, finished, reruns, caught, serial)
    for key, (event, number) in last.items():
        # An execute killed midway whose atom the flow then reverted needs no second execute:
        # its revert (which completes the undo) is what must have ended.
        undone = key[1] == "execute" and last.get((key[0], "revert"), ("",))[0] == "end"
        if event != "end" and not undone:
            raise AssertionError(f"{key[0]} {key[1]} never ended (last started in run {number})")
    ends = collections.Counter(_key(r) for run in runs for r in run.records if not _is_start(r))
    for key, count in ends.items():
        if count != 1 + reruns[key]:
            raise AssertionError(
                f"{key[0]} {key[1]} ended {count} times; expected once, plus once per crash "
                f"that came after it returned but before its outcome was stored "
                f"({reruns[key]})")
    return caught


def _classify_at_kill(number: int, run: Run, last: dict[Key, tuple[str, int]],
                      finished: dict[Key, int], reruns: collections.Counter[Key],
                      caught: collections.Counter[str], serial: bool) -> None:
    assert run.stored is not None
    for atom, state in run.stored.items():
        for action, recorded in RECORDED.items():
            if state in recorded and last.get((atom, action), ("",))[0] != "end":
                raise AssertionError(
                    f"after kill {number} the backend holds an outcome of {atom} {action} "
                    f"(state {state}), but its {action} never ended")
    for key, (event, in_run) in last.items():
        atom, action = key
        if key in finished:
            continue
        if event == "start":
            caught["in flight"] += 1
        elif run.stored.get(atom) in RECORDED[action]:
            finished[key] = number
        elif in_run == number:  # (one that returned in an earlier run was judged at its kill)
            # The crash came after the task returned and before the engine stored its outcome.
            caught["returned, not yet stored"] += 1
            reruns[key] += 1
            if serial:
                _check_nothing_started_after(number, run, key)


def _check_nothing_started_after(number: int, run: Run, key: Key) -> None:
    ends = [i for i, r in enumerate(run.records) if _key(r) == key and not _is_start(r)]
    later = [r["atom"] for r in run.records[ends[-1] + 1:] if _is_start(r)]
    if later:
        raise AssertionError(
            f"{key[0]} {key[1]} had returned in run {number}, but its outcome was not stored "
            f"when the process was killed, although the engine had meanwhile started "
            f"{', '.join(later)}: the engine ran other work before recording a finished atom, "
            f"so the crash makes finished work run again")


# ---- driving child processes ----------------------------------------------------------------


class ForkServer:
    """``crash_child.py serve``: starts each run as a new process forked from a warm one."""

    def __init__(self) -> None:
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [sys.executable, str(CHILD), "serve"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, bufsize=0, env={**os.environ, "PYTHONPATH": path})
        self._buffer = b""

    def _line(self, timeout: float) -> str | None:
        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self._proc.stdout], [], [], remaining)
            if ready:
                chunk = os.read(self._proc.stdout.fileno(), 4096)
                if not chunk:
                    raise AssertionError(f"the fork server died ({self._proc.wait()})")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    @contextlib.contextmanager
    def run(self, argv: list[str], out: Path) -> Iterator[Child]:
        """Start ``crash_child.py ARGV`` in a new process; it is killed if still running after."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"argv": argv, "out": str(out)}).encode() + b"\n")
        answer = self._line(10.0)
        assert answer is not None and answer.startswith("pid "), answer
        child = Child(self, int(answer.split()[1]))
        try:
            yield child
        finally:
            if child.returncode is None:
                child.kill()

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()


@dataclasses.dataclass
class Child:
    """One process the fork server started."""

    server: ForkServer
    pid: int
    returncode: int | None = None

    def wait(self, timeout: float) -> int | None:
        """The return code, once the process ended within ``timeout`` seconds; else None."""
        line = self.server._line(timeout)
        if line is not None:
            assert line == f"exit {self.pid} {line.split()[-1]}", line
            self.returncode = int(line.split()[-1])
        return self.returncode

    def kill(self) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        code = self.wait(10.0)
        assert code is not None, f"process {self.pid} outlived SIGKILL by 10 s"
        return code


@pytest.fixture(scope="module")
def fork_server() -> Iterator[ForkServer]:
    server = ForkServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgresql", pytest.param("mariadb", marks=pytest.mark.cluster)])
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/flows.db"
    if request.param == "mariadb":
        return str(request.getfixturevalue("mariadb_database_url"))
    url: str = request.getfixturevalue("postgres_schema_url")
    return url


def _distinct_started(ledger: Path) -> int:
    return len({_key(r) for r in crash_tasks.read_ledger(str(ledger)) if _is_start(r)})


def _run_child(child: Child, ledger: Path, kill_at: int | None, out: Path) -> bool:
    """Wait until ``kill_at`` distinct actions started, then SIGKILL; False if it ended first."""
    deadline = time.monotonic() + CHILD_DEADLINE
    while time.monotonic() < deadline:
        if kill_at is not None and _distinct_started(ledger) >= kill_at:
            assert child.kill() == -signal.SIGKILL, out.read_text()
            return True
        if child.wait(POLL_INTERVAL) is not None:
            return False
    raise AssertionError(
        f"the child did not {'reach its kill point' if kill_at else 'finish'} within "
        f"{CHILD_DEADLINE}s (a resumed flow that hangs?); its output:\n{out.read_text()}")


def _stored_states(conn: base.Connection, flow_uuid: str) -> dict[str, str]:
    return {ad.name: ad.state for ad in conn.get_flow_details(flow_uuid)}


def crash_and_resume(server: ForkServer, uri: str, scenario: Scenario,
                     workdir: Path) -> tuple[list[Run], models.FlowDetail, str]:
    """Run the scenario with kills until it ends; return the runs, the stored flow, the output."""
    ledger = workdir / "ledger.jsonl"
    backend = backends.fetch(uri)
    with contextlib.closing(backend), contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
        book = models.LogBook(f"crash-{scenario.id}")
        conn.save_logbook(book)
        runs: list[Run] = []
        flow_uuid = None
        points = scenario.kill_points()
        seen = 0
        while True:
            started = _distinct_started(ledger)
            while points and points[0] <= started:
                points.pop(0)  # reached already (the kill landed late): take the next one
            kill_at = points.pop(0) if points else None
            out = workdir / f"run{len(runs) + 1}.out"
            hold = Path(crash_tasks.hold_path(str(ledger)))
            if kill_at is None:
                hold.unlink(missing_ok=True)
            else:
                hold.write_text(str(kill_at))  # the child waits there if the kill comes late
            if flow_uuid is None:
                argv = ["start", uri, scenario.engine, book.uuid,
                        json.dumps(scenario.factory_kwargs(ledger))]
            else:
                argv = ["resume", uri, scenario.engine, flow_uuid]
            with server.run(argv, out) as child:
                killed = _run_child(child, ledger, kill_at, out)
            records = crash_tasks.read_ledger(str(ledger))
            if flow_uuid is None:
                (flow_uuid,) = [fd.uuid for fd in conn.get_flows_for_book(book.uuid, lazy=True)]
            if not killed:
                assert child.returncode == 0, f"run {len(runs) + 1} failed:\n{out.read_text()}"
                runs.append(Run(records[seen:], None))
                return runs, conn.get_flow_details(flow_uuid), out.read_text()
            runs.append(Run(records[seen:], _stored_states(conn, flow_uuid)))
            seen = len(records)


# ---- the tests ------------------------------------------------------------------------------


def _check_end_state(scenario: Scenario, runs: list[Run], flow_detail: models.FlowDetail,
                     output: str) -> None:
    stored = {ad.name: ad for ad in flow_detail}
    if scenario.fail is None:
        assert output.splitlines()[:1] == ["final SUCCESS"], output
        assert flow_detail.state == states.SUCCESS
        assert {n: ad.state for n, ad in stored.items()} == dict.fromkeys(stored, states.SUCCESS)
        expected = crash_tasks.expected_results(scenario.shape, scenario.size)
        assert {name: stored[name].results for name in expected} == expected
        return
    assert output.splitlines()[:2] == ["final REVERTED", "raised Boom"], output
    assert flow_detail.state == states.REVERTED
    executed = {r["atom"] for run in runs for r in run.records if r["event"] == "execute-start"}
    assert set(scenario.executed()) <= executed
    reverted = {r["atom"] for run in runs for r in run.records if r["event"] == "revert-end"}
    left = {name: f"{stored[name].state}/{stored[name].intention}"
            for name in sorted(executed - reverted)}
    assert not left, (
        f"the flow ended {flow_detail.state}, but these tasks executed and were never reverted "
        f"(stored state/intention): {left}")
    assert reverted == executed, f"reverted tasks that never executed: {reverted - executed}"
    assert {n: stored[n].state for n in executed} == dict.fromkeys(executed, states.REVERTED)


def _check_scenario(server: ForkServer, uri: str, scenario: Scenario, tmp_path: Path) -> None:
    replay = f"kill points {scenario.kill_points()}: replay with {SEED_ENV}={SEED}"
    print(replay)
    try:
        _check_kills(server, uri, scenario, tmp_path)
    except AssertionError as err:
        err.add_note(replay)
        raise


def _check_kills(server: ForkServer, uri: str, scenario: Scenario, tmp_path: Path) -> None:
    runs, flow_detail, output = crash_and_resume(server, uri, scenario, tmp_path)
    _check_end_state(scenario, runs, flow_detail, output)
    caught = check_resumption(runs, serial=scenario.engine == "serial")
    planned = len(scenario.kill_points())
    # A kill landing late may pass the next kill point; most must still land.
    assert caught["kills"] >= min(planned, max(1, planned - 1)), (
        f"only {caught['kills']} of {planned} kills landed: {caught}")
    assert caught["restarted"] >= 1, f"no kill caught work in flight that a resume re-ran: {caught}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.id)
def test_killed_engines_resume_without_repeating_finished_work(
        fork_server: ForkServer, uri: str, scenario: Scenario, tmp_path: Path) -> None:
    _check_scenario(fork_server, uri, scenario, tmp_path)


def test_serial_engine_records_each_atom_before_running_the_next(
        fork_server: ForkServer, tmp_path: Path) -> None:
    # Killed while l0t1 runs: l0t0 (same round) has returned, but is still stored RUNNING.
    scenario = Scenario("serial", "graph", work=0.2, random_kills=0, pinned=(2,))
    _check_scenario(fork_server, f"sqlite:///{tmp_path}/flows.db", scenario, tmp_path)


def test_a_revert_interrupted_while_siblings_run_is_resumed(
        fork_server: ForkServer, tmp_path: Path) -> None:
    # Killed as l2t1's revert starts (the 10th action), while l2t0 and l2t2 still execute.
    scenario = Scenario("parallel", "graph", fail="l2t1", work=0.3, random_kills=0,
                        pinned=(10,))
    _check_scenario(fork_server, f"sqlite:///{tmp_path}/flows.db", scenario, tmp_path)


def test_kill_points_vary_by_seed_and_replay_from_the_environment() -> None:
    scenario = SCENARIOS[0]
    assert scenario.kill_points(7) == scenario.kill_points(7)
    assert len({tuple(scenario.kill_points(seed)) for seed in range(20)}) > 1
    layered = Scenario("parallel", "graph")
    width = crash_tasks.LAYER_WIDTH
    for seed in range(200):
        points = layered.kill_points(seed)
        assert 0 < points[0] and points[-1] < len(layered.executed()), points
        assert len({(point - 1) // width for point in points}) == len(points), (seed, points)
    assert run_seed({SEED_ENV: " 12345 "}) == 12345
    assert run_seed({}) != run_seed({})  # from the clock: a new seed every run


# ---- the oracle can fail --------------------------------------------------------------------


def _events(*pairs: str) -> list[dict[str, Any]]:
    return [{"atom": p.split()[0], "event": p.split()[1], "pid": 1} for p in pairs]


def test_the_oracle_accepts_restarting_work_in_flight() -> None:
    runs = [Run(_events("a execute-start", "a execute-end", "b execute-start"),
                {"a": states.SUCCESS, "b": states.RUNNING}),
            Run(_events("b execute-start", "b execute-end"), None)]
    assert check_resumption(runs, serial=True) == {"kills": 1, "in flight": 1, "restarted": 1}


def test_the_oracle_rejects_rerunning_a_recorded_atom() -> None:
    runs = [Run(_events("a execute-start", "a execute-end", "b execute-start"),
                {"a": states.SUCCESS, "b": states.RUNNING}),
            Run(_events("a execute-start", "a execute-end", "b execute-start", "b execute-end"),
                None)]
    with pytest.raises(AssertionError, match="a execute: finished and recorded before kill 1"):
        check_resumption(runs, serial=True)


def test_the_oracle_rejects_running_more_before_recording_a_finished_atom() -> None:
    runs = [Run(_events("a execute-start", "a execute-end", "b execute-start"),
                {"a": states.RUNNING, "b": states.RUNNING}),
            Run(_events("a execute-start", "a execute-end", "b execute-start", "b execute-end"),
                None)]
    assert check_resumption(runs, serial=False)["returned, not yet stored"] == 1
    with pytest.raises(AssertionError, match="meanwhile started b"):
        check_resumption(runs, serial=True)


def test_the_oracle_accepts_an_interrupted_execute_that_was_reverted() -> None:
    runs = [Run(_events("a execute-start"), {"a": states.RUNNING}),
            Run(_events("a revert-start", "a revert-end"), None)]
    assert check_resumption(runs, serial=True)["kills"] == 1


def test_the_oracle_rejects_an_action_that_never_ends() -> None:
    runs = [Run(_events("a execute-start"), {"a": states.RUNNING}), Run([], None)]
    with pytest.raises(AssertionError, match="a execute never ended"):
        check_resumption(runs, serial=True)
