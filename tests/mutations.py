"""Break the product one line at a time and see which test notices: a mutation check run by hand.

Each :class:`Break` names one edit to one file of the product (a line made wrong: a check
dropped, a bound moved by one, a mask removed) and the test files that should notice it. For
each break this script copies the repository (without ``.git``) to a temporary folder, applies
that one edit there, and runs ``pytest -x`` on the named test files from that folder, with it
first on ``PYTHONPATH`` (worker processes and examples started by the tests import the broken
copy too). It then says which test caught the break and how long it took, or that every test
passed (a gap: add the test that is missing), or that the run had to be killed (a hang: the
per-test time limit should have ended it first).

It is a tool for people, not part of CI: a full run takes a while and uses the real test
servers, as the tests do. ``tests/test_mutations.py`` keeps it from rotting: every break must
still apply to the current code, and one is run end to end. See ``doc/testing.rst``.

Usage::

    python tests/mutations.py                      # every break, a table at the end
    python tests/mutations.py --only flow-meta-unmasked --only ack-unpublished
    python tests/mutations.py --list               # the breaks, and the tests that should notice
    python tests/mutations.py --check              # every break still applies (exit 1 if not)
    python tests/mutations.py --json results.json  # the results as JSON too
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Seconds after which a break's test run is killed and called hung. The per-test time limit
#: (pyproject.toml) should always end a run long before.
HARD_LIMIT = 1200.0

#: What is left out of the scratch copy.
_NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache",
                                     ".mypy_cache", ".ruff_cache", ".hypothesis", "results",
                                     "*.egg-info", "_build")

CAUGHT = "caught"
TIMED_OUT = "timed out"  # caught too: the per-test time limit ended the run with a stack dump
PASSED = "passed"  # nothing noticed: a missing test
HUNG = "hung"  # killed at the hard limit: the per-test time limit did not act
UNUSABLE = "unusable"  # the break no longer applies to the code


@dataclasses.dataclass(frozen=True)
class Break:
    """One edit that makes the product wrong, and the test files that should notice it.

    Attributes:
        name: A short name for the break (``--only`` takes it).
        area: engine, storage, worker-based, jobs, dashboard or cli.
        path: The file to break, relative to the repository root.
        old: Text found exactly once in that file (a line, with context where needed).
        new: What it becomes.
        tests: pytest arguments (test files or node ids) run against the broken copy.
        why: What the break does to the product.
    """

    name: str
    area: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str

    def problem(self, root: Path = ROOT) -> str | None:
        """Why this break cannot be applied under ``root`` (None: it can)."""
        target = root / self.path
        if not target.is_file():
            return f"{self.path} does not exist"
        found = target.read_text(encoding="utf-8").count(self.old)
        if found != 1:
            return f"{self.path} holds the text to break {found} times, not once: {self.old!r}"
        if self.old == self.new:
            return "the edit changes nothing"
        for test in self.tests:
            if not (root / test.split("::")[0]).is_file():
                return f"test file {test.split('::')[0]} does not exist"
        return None

    def apply(self, root: Path) -> None:
        """Make the edit in the copy of the repository at ``root``."""
        target = root / self.path
        text = target.read_text(encoding="utf-8")
        target.write_text(text.replace(self.old, self.new, 1), encoding="utf-8")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the tests made of one break."""

    name: str
    area: str
    verdict: str
    seconds: float
    caught_by: str = ""
    detail: str = ""


BREAKS: tuple[Break, ...] = (
    # ---- engine ---------------------------------------------------------------------------
    Break("engine-async-slots-one", "engine", "flowengine/engines/event_loop.py",
          "self._slots = asyncio.Semaphore(self._max_concurrent)",
          "self._slots = asyncio.Semaphore(1)",
          ("tests/behaviour/test_async_tasks.py",),
          "local engines await one async task at a time, whatever max_async_tasks says"),
    Break("revert-before-successors", "engine", "flowengine/engines/runtime.py",
          "return state in _REVERTIBLE and frontier.succs_undone(atom)",
          "return state in _REVERTIBLE",
          ("tests/behaviour/test_revert.py",),
          "an atom reverts before the atoms after it have reverted"),
    Break("retry-one-attempt-too-many", "engine", "flowengine/retry.py",
          "return RETRY if len(history) < self._attempts else self._revert_action",
          "return RETRY if len(history) <= self._attempts else self._revert_action",
          ("tests/behaviour/test_retry.py",),
          "retry.Times(n) runs its subflow n + 1 times"),
    Break("deciders-ignored", "engine", "flowengine/engines/runtime.py",
          "if (apply_deciders and intention == states.EXECUTE",
          "if (False and intention == states.EXECUTE",
          ("tests/behaviour/test_deciders.py",),
          "link deciders are never asked: every atom runs"),
    Break("local-time-limits-ignored", "engine", "flowengine/engines/time_limits.py",
          "return float(limit) if limit else None",
          "return None",
          ("tests/behaviour/test_time_limits.py",),
          "Task.time_limit and the time_limits option do nothing on local engines"),
    Break("interrupted-retry-never-resumes", "engine", "flowengine/engines/runtime.py",
          "_STARTABLE = frozenset((states.PENDING, states.RETRYING))",
          "_STARTABLE = frozenset((states.PENDING,))",
          ("tests/behaviour/test_retry_delay.py", "tests/behaviour/test_suspend_resume.py"),
          "a retry left RETRYING by an interrupted run never starts its next attempt"),
    Break("completed-atoms-startable", "engine", "flowengine/engines/runtime.py",
          "_STARTABLE = frozenset((states.PENDING, states.RETRYING))",
          "_STARTABLE = frozenset((states.PENDING, states.RETRYING, states.SUCCESS))",
          ("tests/behaviour/test_patterns.py",),
          "an atom that completed is ready to run again"),
    # ---- storage --------------------------------------------------------------------------
    Break("flow-meta-unmasked", "storage", "flowengine/persistence/secret_keeping.py",
          "fd.meta = self.masker.value(fd.meta)",
          "fd.meta = fd.meta",
          ("tests/behaviour/test_secrets_at_rest.py", "tests/unit/test_secrets.py"),
          "flow metadata is written with its secrets in clear"),
    Break("atom-records-unmasked", "storage", "flowengine/persistence/secret_keeping.py",
          "data.update({key: self.masker.value(data[key]) for key in _VALUE_FIELDS})",
          "data.update({})",
          ("tests/behaviour/test_secrets_at_rest.py",),
          "atom results and failures are written with their secrets in clear"),
    Break("sql-revert-failure-dropped", "storage",
          "flowengine/persistence/backends/_sql/session.py",
          '_ATOM_JSON = ("version", "meta", "results", "failure", "revert_results", '
          '"revert_failure")',
          '_ATOM_JSON = ("version", "meta", "results", "failure", "revert_results")',
          ("tests/unit/test_persistence_backends.py",
           "tests/behaviour/test_persistence_contract.py"),
          "the SQL backends neither write nor read an atom's revert failure"),
    Break("dir-cache-never-stale-checked", "storage",
          "flowengine/persistence/backends/impl_dir.py",
          "if cached is not None and cached[:3] == key:",
          "if cached is not None:",
          ("tests/unit/test_persistence_backends.py", "tests/unit/test_taskflow_shapes.py"),
          "the dir backend serves a cached record after another process rewrote it"),
    Break("callers-backend-closed", "storage", "flowengine/engines/helpers.py",
          "        yield backend, False\n",
          "        yield backend, True\n",
          ("tests/unit/test_persistence_factories.py", "tests/unit/test_persistence_backends.py",
           "tests/behaviour/test_persistence_contract.py"),
          "an engine closes a backend object its caller passed (doc/persistence.rst: never)"),
    # ---- worker-based ---------------------------------------------------------------------
    Break("worker-async-slots-one", "worker-based",
          "flowengine/worker_based/worker_side/async_runner.py",
          "self._slots = asyncio.Semaphore(self.concurrency)",
          "self._slots = asyncio.Semaphore(1)",
          ("tests/unit/test_wb_async_worker.py",),
          "a worker awaits one async task at a time, whatever async_concurrency says"),
    Break("lease-never-lapses", "worker-based",
          "flowengine/worker_based/engine_side/lifecycle.py",
          "if (attempt.lease_until is not None and now > attempt.lease_until",
          "if (False",
          ("tests/unit/test_wb_leases.py",),
          "a RUNNING request whose worker went silent is waited on forever"),
    Break("remote-cleanup-not-awaited", "worker-based",
          "flowengine/worker_based/engine_side/lifecycle.py",
          "grace = CLEANUP_GRACE if self.awaited and self.flowengine_peer else 0.0",
          "grace = 0.0",
          ("tests/unit/test_wb_lifecycle.py", "tests/behaviour/test_async_tasks.py"),
          "a worker-based engine reverts while a timed-out coroutine still cleans up"),
    Break("worker-lost-one-attempt-late", "worker-based",
          "flowengine/worker_based/engine_side/lifecycle.py",
          "if attempt.counted < attempt.policy.max_attempts:",
          "if attempt.counted <= attempt.policy.max_attempts:",
          ("tests/unit/test_wb_leases.py", "tests/unit/test_wb_redelivery.py"),
          "a task that loses its worker is sent max_attempts + 1 times"),
    Break("request-never-expires", "worker-based",
          "flowengine/worker_based/engine_side/lifecycle.py",
          "if policy.timeout is not None and now - attempt.created > policy.timeout:",
          "if False:",
          ("tests/unit/test_wb_leases.py", "tests/unit/test_wb_server.py"),
          "a request no worker takes waits past its transition_timeout"),
    Break("impostor-reply-applied", "worker-based", "flowengine/worker_based/executor.py",
          "if impostor is not None:",
          "if False:",
          ("tests/unit/test_wb_signing.py",),
          "a reply from a worker other than the one running the attempt is applied"),
    Break("redelivered-request-runs", "worker-based", "flowengine/worker_based/server.py",
          "if message.redelivered and from_flowengine(headers):",
          "if False:",
          ("tests/unit/test_wb_redelivery.py",),
          "a worker runs a request the broker redelivered instead of handing it back"),
    Break("ack-unpublished", "worker-based", "flowengine/worker_based/server.py",
          "        if published:\n            message.ack()",
          "        if True:\n            message.ack()",
          ("tests/unit/test_wb_server.py", "tests/unit/test_wb_proxy_publish.py",
           "tests/unit/test_wb_outcome_keeping.py"),
          "a worker acknowledges a request whose outcome it could not publish (lost)"),
    Break("revoked-request-runs", "worker-based", "flowengine/worker_based/server.py",
          'if self._revoked.take(props["correlation_id"]):',
          "if False:",
          ("tests/unit/test_wb_cancel.py",),
          "a request its engine revoked still runs when a worker takes it"),
    Break("past-deadline-request-runs", "worker-based", "flowengine/worker_based/server.py",
          "if isinstance(deadline, (int, float)) and time.time() > deadline:",
          "if False:",
          ("tests/unit/test_wb_server.py",),
          "a worker runs a request that reached its deadline unstarted"),
    Break("incompatible-version-runs", "worker-based", "flowengine/worker_based/server.py",
          "if vs.major(work.task_version) != vs.major(task.version):",
          "if False:",
          ("tests/unit/test_wb_server.py",),
          "a worker runs a request for another major version of its task"),
    # ---- jobs -----------------------------------------------------------------------------
    Break("fence-ignores-expiry", "jobs", "flowengine/conductors/claims.py",
          "elif self._clock() >= self._valid_until:",
          "elif False:",
          ("tests/jobs/test_claim_keeping.py",),
          "a conductor whose claim was not renewed in time still stores its progress"),
    Break("redis-claims-uncounted", "jobs", "flowengine/jobs/backends/_redis_scripts.py",
          "redis.call('HSET', KEYS[2], uuid, attempts + 1)",
          "redis.call('HSET', KEYS[2], uuid, attempts)",
          ("tests/jobs/test_jobboard_behaviour.py",),
          "claims on Redis are not counted, so a failing job is never trashed"),
    Break("job-details-unmasked", "jobs", "flowengine/jobs/masking.py",
          "return {k: MASK if is_secret_key(k) else masked(v) for k, v in data.items()}",
          "return {k: masked(v) for k, v in data.items()}",
          ("tests/jobs/test_jobs_api.py", "tests/jobs/test_jobs_cli.py"),
          "job details show values under secret-looking keys"),
    Break("conductor-errors-show-job-secrets", "jobs", "flowengine/jobs/masking.py",
          "return mask_urls(Masker(_secret_values(details)).text(text))",
          "return mask_urls(text)",
          ("tests/jobs/test_conductor_behaviour.py", "tests/jobs/test_jobs_api.py"),
          "errors the conductor logs quote the job's secret values"),
    # ---- events and tracing ---------------------------------------------------------------
    Break("event-fields-not-dropped", "worker-based", "flowengine/worker_based/event_outbox.py",
          "if str(k) not in FORBIDDEN_FIELDS}",
          "if True}",
          ("tests/unit/test_events_stream.py", "tests/unit/test_events_listeners.py"),
          "events carry arguments, results and stores (doc/operations.rst: never)"),
    Break("tracing-failure-url-shown", "engine", "flowengine/tracing/runs.py",
          "message = mask_urls(failure.exception_str)",
          "message = failure.exception_str",
          ("tests/tracing/test_tracing_engines.py",),
          "a span's exception event shows URL passwords"),
    Break("listener-input-masks-ignored", "engine", "flowengine/formatters.py",
          'attrs["requires"] = storage.masked(_mask_keys(requires, self._mask_inputs_keys))',
          'attrs["requires"] = storage.masked(requires)',
          ("tests/unit/test_formatters.py", "tests/unit/test_listeners.py"),
          "DynamicLoggingListener's mask_inputs_keys hides nothing"),
    # ---- dashboard ------------------------------------------------------------------------
    Break("dashboard-secret-keys-shown", "dashboard", "flowengine/dashboard/masking.py",
          "return {str(k): MASK if SECRET_KEY.search(str(k)) else _mask(v, secrets, depth + 1)",
          "return {str(k): _mask(v, secrets, depth + 1)",
          ("tests/dashboard/test_dashboard_app.py", "tests/dashboard/test_dashboard_interface.py"),
          "the dashboard shows values under secret-looking keys"),
    Break("dashboard-access-log-on", "dashboard", "flowengine/cli/dashboard.py",
          'uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning",',
          'uvicorn.run(app, host=host, port=port, access_log=True, log_level="info",',
          ("tests/dashboard/test_dashboard_cli.py",),
          "the dashboard logs request lines, ?token= included"),
    # ---- cli ------------------------------------------------------------------------------
    Break("run-record-keeps-secret-options", "cli", "flowengine/engines/run_record.py",
          '"transport_options": {k: MASK if _is_secret(k) else v',
          '"transport_options": {k: v',
          ("tests/unit/test_cli_run.py", "tests/dashboard/test_dashboard_resuming.py"),
          "`flowengine run --backend` stores secret transport options in clear"),
    Break("run-record-keeps-url-password", "cli", "flowengine/engines/run_record.py",
          '"url": mask_urls(url) if url else None,',
          '"url": url,',
          ("tests/unit/test_cli_run.py", "tests/dashboard/test_dashboard_resuming.py"),
          "`flowengine run --backend` stores the broker URL's password in clear"),
    Break("cli-reverted-exits-0", "cli", "flowengine/cli/exits.py",
          "states.REVERTED: REVERTED,",
          "states.REVERTED: OK,",
          ("tests/unit/test_cli_run.py",),
          "`flowengine run` exits 0 for a flow that failed and was reverted"),
    Break("cli-unreachable-shows-password", "cli", "flowengine/cli/exits.py",
          'click.echo(f"error: cannot {what} {mask_urls(where)}: {mask_urls(str(err))}", '
          "err=True)",
          'click.echo(f"error: cannot {what} {where}: {err}", err=True)',
          ("tests/integration/test_events.py::"
           "test_commands_exit_1_when_the_broker_cannot_be_reached",),
          "a command that cannot reach its broker prints the broker's password"),
    # ---- locks, limits and upgrades -----------------------------------------------------------
    Break("lock-fences-ignored", "jobs", "flowengine/storage.py",
          "            guard(what)",
          "            pass",
          ("tests/jobs/test_locks.py::"
           "test_a_lease_not_renewed_in_time_refuses_the_next_write",),
          "a run whose lock lease lapsed (frozen past it) still stores its progress"),
    Break("limits-ignored-by-engines", "jobs", "flowengine/engines/admission.py",
          "            if name in self.concurrency:",
          "            if False:",
          ("tests/jobs/test_limits.py",),
          "engines run more tasks at once than their concurrency limit"),
    Break("other-version-dispatched", "worker-based", "flowengine/worker_based/types.py",
          'return major is None or served is None or served.split(".")[0] == major',
          "return True",
          ("tests/integration/test_rolling_upgrade.py::"
           "test_a_request_nobody_serves_at_its_version_fails_naming_the_versions_on_offer",),
          "an engine sends requests to workers of another major version"),
    Break("changed-shape-resumed", "engine", "flowengine/engines/shapes.py",
          "    if migration_for(flow_detail) is None:",
          "    if False:",
          ("tests/unit/test_shapes.py",),
          "a stored flow is resumed by code of another shape without a migration"),
)


def copy_tree(into: Path) -> Path:
    """A copy of the repository (without its git data and caches) under ``into``."""
    scratch = into / "tree"
    shutil.copytree(ROOT, scratch, ignore=_NOT_COPIED, symlinks=True)
    return scratch


_SUMMARY = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)
_NODE = re.compile(r"(tests/\S+?\.py::\S+)")
_TIMEOUT = re.compile(r"^\++ Timeout \++$", re.MULTILINE)


def judge(returncode: int, output: str) -> tuple[str, str, str]:
    """``(verdict, caught_by, detail)`` from a finished pytest run's exit code and output."""
    if returncode == 0:
        return PASSED, "", ""
    timeout = _TIMEOUT.search(output)
    if timeout is not None:
        nodes = _NODE.findall(output[:timeout.start()])
        return TIMED_OUT, nodes[-1] if nodes else "?", "pytest-timeout ended the run"
    summary = _SUMMARY.search(output)
    if summary is not None:
        return CAUGHT, summary.group(1), ""
    last = output.strip().splitlines()[-1:] or [""]
    return CAUGHT, "?", f"pytest exited {returncode}: {last[0][:200]}"


def run_break(item: Break, hard_limit: float = HARD_LIMIT, log: Path | None = None) -> Outcome:
    """Apply ``item`` to a scratch copy of the repository and run its tests there."""
    problem = item.problem()
    if problem is not None:
        return Outcome(item.name, item.area, UNUSABLE, 0.0, detail=problem)
    with tempfile.TemporaryDirectory(prefix=f"mutation-{item.name}-") as folder:
        scratch = copy_tree(Path(folder))
        item.apply(scratch)
        env = dict(os.environ, CI=os.environ.get("CI", "true"),
                   PYTHONPATH=os.pathsep.join(
                       filter(None, [str(scratch), os.environ.get("PYTHONPATH")])))
        command = [sys.executable, "-m", "pytest", "-x", "-v", "-rfE", "-p", "no:cacheprovider",
                   *item.tests]
        started = time.monotonic()
        # A session of its own, so a hung run is killed with every process it started.
        proc = subprocess.Popen(command, cwd=scratch, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=hard_limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            verdict, caught_by, detail = HUNG, "", f"killed after {hard_limit:.0f}s"
        else:
            verdict, caught_by, detail = judge(proc.returncode, output)
        seconds = time.monotonic() - started
    if log is not None:
        log.mkdir(parents=True, exist_ok=True)
        (log / f"{item.name}.log").write_text(output, encoding="utf-8")
    return Outcome(item.name, item.area, verdict, seconds, caught_by, detail)


def table(outcomes: Iterable[Outcome]) -> str:
    """The outcomes as a plain-text table, one break a line."""
    rows = [("break", "area", "verdict", "seconds", "caught by")]
    rows += [(o.name, o.area, o.verdict, f"{o.seconds:.1f}", o.caught_by or o.detail)
             for o in outcomes]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths))
                     + "  " + row[4] for row in rows)


def select(names: Sequence[str]) -> list[Break]:
    """The breaks named (all of them when none is)."""
    known = {item.name: item for item in BREAKS}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"unknown break(s): {', '.join(unknown)} (see --list)")
    return [known[name] for name in names] if names else list(BREAKS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run this break (repeatable; default: all)")
    parser.add_argument("--list", action="store_true", help="list the breaks and exit")
    parser.add_argument("--check", action="store_true",
                        help="check that every break still applies, run nothing")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the outcomes here")
    parser.add_argument("--logs", type=Path, metavar="DIR", help="keep each run's output here")
    parser.add_argument("--hard-limit", type=float, default=HARD_LIMIT, metavar="SECONDS",
                        help=f"kill a break's run after this long (default {HARD_LIMIT:.0f})")
    args = parser.parse_args(argv)
    chosen = select(args.only)
    if args.list:
        for item in chosen:
            print(f"{item.name} [{item.area}] {item.path}: {item.why}\n    "
                  + " ".join(item.tests))
        return 0
    if args.check:
        problems = [(item.name, item.problem()) for item in chosen]
        for name, problem in problems:
            if problem is not None:
                print(f"{name}: {problem}")
        return 1 if any(problem for _, problem in problems) else 0
    outcomes = []
    for item in chosen:
        print(f"== {item.name}: {item.why}", file=sys.stderr, flush=True)
        outcome = run_break(item, args.hard_limit, args.logs)
        print(f"   {outcome.verdict} in {outcome.seconds:.1f}s {outcome.caught_by}",
              file=sys.stderr, flush=True)
        outcomes.append(outcome)
    print(table(outcomes))
    if args.json is not None:
        args.json.write_text(json.dumps([dataclasses.asdict(o) for o in outcomes], indent=2)
                             + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
