"""Generated programs give the same observable outcome on TaskFlow 6.5 and on flowengine.

Each program (see ``programs``) runs on both libraries in this process (``observe``); everything
it observes must match, except where notification order is not defined: on the parallel engine
atoms run concurrently, so there each atom's own notifications are compared in order and the
whole stream as a multiset. Examples are derandomized, so every run checks the same programs.

Some differences are compared in a weaker form, each pinned by a test below (a strict xfail
for those not fixed yet):

* With several atoms ready at once, TaskFlow's serial engine announces RUNNING for each before
  any completes, where flowengine stores each result before the next atom starts (deliberate,
  see doc/migration.rst), and siblings revert in another order: unless every flow is linear,
  notifications are compared per atom and the calls as a multiset, ``str`` lists sorted (graph
  flows iterate in another order).
* Parallel or non-linear programs where several tasks fail: their failures group into other
  rounds (on TaskFlow, by set order), so they are compared as parallel ones are (below), and
  of the error only that there is one (``_rounds_free``); those where TaskFlow's own engine
  breaks down (InvalidState) are not compared. Non-linear programs suspended in a round where
  another task fails are not compared (TaskFlow goes on retrying; flowengine stops).
* Parallel programs with one failing task: which ready atoms start before the engine sees the
  failure depends on thread timing, on TaskFlow as on flowengine (a CI run failed on a program
  where a later atom started in one library's run and not the other's). They are compared by
  what does not depend on it (``_timing_free``): the error, flow states and notifications, the
  failing task's own calls, and the final atom states with REVERTED and PENDING (started and
  reverted, or never started) alike; all of them when a retry makes the flow succeed. And
  flowengine must never have reverted a task that did not run.
* When a round of TaskFlow's serial engine has a failure, tasks made ready by another atom's
  success in that round are reverted without having run (``revert`` with no result), or not:
  it depends on the order of a set of futures. flowengine never reverts them; TaskFlow's
  outcome is compared as if it had not (``_forget_unrun_reverts``).
* A retry's history read back from a backend: TaskFlow's ``RetryDetail.from_dict`` replaces
  the result of every entry that holds failures by the last of those failures (a loop variable
  reused), where flowengine keeps the result. Such entries are compared by their failures.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from servers import require_module

from . import compared
from .observe import run_program
from .programs import programs

require_module("taskflow")

#: Programs generated per run; the session's last line reports how many were compared.
EXAMPLES = 300
#: Fewer compared than this fails the run: most programs must not be set aside as a known
#: difference. (About 260 are compared; other hypothesis versions draw other programs.)
MIN_COMPARED = 240


def _all_linear(spec: dict[str, Any]) -> bool:
    if "pattern" not in spec:
        return True
    return spec["pattern"] == "linear" and all(_all_linear(item) for item in spec["items"])


def _failing_tasks(spec: dict[str, Any]) -> int:
    if "pattern" not in spec:
        return int(spec["fails"] > 0)
    return sum(_failing_tasks(item) for item in spec["items"])


def _reverted_unrun_atoms(outcome: dict[str, Any]) -> set[str]:
    """Tasks reverted without having been executed (TaskFlow does that, at random: see top)."""
    executed: set[str] = set()
    found = set()
    for call in outcome.get("ledger", []):
        if call[0] == "execute":
            executed.add(call[1])
        elif call[1] not in executed:
            found.add(call[1])
    return found


def _never_run(record: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in record["meta"].items() if k != "progress"}  # set by the revert
    return {**record, "state": "PENDING", "meta": meta}


def _forget_unrun_reverts(outcome: dict[str, Any]) -> dict[str, Any]:
    """``outcome`` as if TaskFlow had not reverted the tasks that never ran (they stay PENDING).

    TaskFlow's serial engine finds the atoms a round's completions make ready one completion at
    a time, in the order its set of finished futures pops them (memory addresses): when a
    success is popped before a failure of the same round, the atoms it readied are reverted
    without ever running; popped after it, they are left alone. flowengine always does the
    latter, so TaskFlow's outcome is compared as if it had popped the failure first.
    """
    unrun = _reverted_unrun_atoms(outcome)
    if not unrun:
        return outcome
    outcome = dict(outcome)
    outcome["ledger"] = [call for call in outcome["ledger"]
                         if not (call[0] == "revert" and call[1] in unrun)]
    runs = []
    for run in outcome["runs"]:
        run = dict(run)
        run["atom_events"] = [event for event in run["atom_events"] if event[0] not in unrun]
        run["atom_states"] = {name: states if name not in unrun else "PENDING"
                              for name, states in run["atom_states"].items()}
        run["records"] = {name: record if name not in unrun else _never_run(record)
                          for name, record in run["records"].items()}
        runs.append(run)
    outcome["runs"] = runs
    return outcome


def _first_line(error: dict[str, Any] | None) -> dict[str, Any] | None:
    # The message's first line; the nested causes after it come in no defined order.
    return error and {**error, "message": error["message"].split("\n")[0]}


def _comparable(outcome: dict[str, Any], program: dict[str, Any]) -> dict[str, Any]:
    outcome = dict(outcome)
    outcome["error"] = _first_line(outcome["error"])
    for run in outcome.get("runs", []):
        run["error"] = _first_line(run["error"])
    for run in outcome.get("runs", []):
        for record in run.get("records", {}).values():
            if isinstance(record["results"], list):  # a retry's history: see the docstring
                record["results"] = [[list(failures.values())[-1] if failures else data, failures]
                                     for data, failures in record["results"]]
    if program["engine"] != "parallel" and _all_linear(program["flow"]):
        return outcome
    outcome["str"] = sorted(outcome.get("str", []))  # graph flows iterate in another order
    # Which of several failures of one round is first is order too: count them instead.
    outcome["ledger"] = sorted((call[:3] + [len(call[3])] + call[4:] if call[0] == "revert"
                                else call for call in outcome["ledger"]), key=repr)
    for run in outcome.get("runs", []):
        if run["error"] and run["error"]["type"] == "WrappedFailure":
            run["error"]["message"] = None  # lists the causes in order; compared sorted
        run["fetch_all"] = {k: sorted(v, key=repr) if isinstance(v, list) else v
                            for k, v in run.get("fetch_all", {}).items()}
    runs = []
    for run in outcome.get("runs", []):
        run = dict(run)
        per_atom: dict[str, list[str]] = {}
        for atom, state in run["atom_events"]:
            per_atom.setdefault(atom, []).append(state)
        run["atom_events"] = per_atom
        run["run_iter"] = sorted(set(run.get("run_iter", [])))
        runs.append(run)
    outcome["runs"] = runs
    return outcome


def test_same_outcome_on_taskflow_and_flowengine() -> None:
    before = len(compared.PROGRAMS)
    _compare_generated_programs()
    done = len(compared.PROGRAMS) - before
    assert done >= MIN_COMPARED, (
        f"only {done} of {EXAMPLES} generated programs were compared with TaskFlow (at least"
        f" {MIN_COMPARED} must be): the others were set aside as known differences")


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck), print_blob=False)
@given(programs())
def _compare_generated_programs(program: dict[str, Any]) -> None:
    if _failing_tasks(program["flow"]) > 1 and (
            program["engine"] == "parallel" or not _all_linear(program["flow"])):
        if program["suspend_at"]:
            return  # a known difference: a suspension in the round where other atoms fail
        expected = run_program("taskflow", program)
        if any((run["error"] or {}).get("type") == "InvalidState" for run in expected["runs"]):
            return  # TaskFlow's engine itself broke down ("something bad must have happened")
        compared.append(program)
        assert _rounds_free(run_program("flowengine", program)) == _rounds_free(expected)
        return
    if _failing_tasks(program["flow"]) and program["engine"] == "parallel":
        # Which ready atoms start before the failure is seen is thread timing, on both.
        failing = _failing_task(program["flow"])
        actual = run_program("flowengine", program)
        assert _reverted_unrun_atoms(actual) == set()
        expected = _timing_free(run_program("taskflow", program), failing)
        compared.append(program)
        assert _timing_free(actual, failing) == expected
        return
    if program["suspend_at"] and _failing_tasks(program["flow"]) and \
            not _all_linear(program["flow"]):
        return  # a known difference: a suspension in the round where other atoms fail
    expected = _comparable(_forget_unrun_reverts(run_program("taskflow", program)), program)
    actual = _comparable(run_program("flowengine", program), program)
    compared.append(program)
    assert actual == expected


def _failing_task(spec: dict[str, Any]) -> str | None:
    if "pattern" not in spec:
        return spec["name"] if spec["fails"] else None
    return next(filter(None, map(_failing_task, spec["items"])), None)


#: Final atom states a parallel run may leave an atom in, depending on whether it started
#: before the engine saw a failure (then it ran and was reverted) or not.
_STARTED_OR_NOT = {"REVERTED": "REVERTED or PENDING", "PENDING": "REVERTED or PENDING"}


def _timing_free(outcome: dict[str, Any], failing: str | None) -> dict[str, Any]:
    """What a parallel program with one failing task observes whatever the threads' timing:
    the error, flow states and notifications, ``str``, the failing task's own calls, and, when
    the flow succeeds in the end (a retry), every atom's state and every stored value."""
    found = {key: outcome.get(key) for key in ("error", "str", "requires", "provides")}
    found["str"] = sorted(found["str"] or [])
    found["failing_calls"] = [call for call in outcome.get("ledger", []) if call[1] == failing]
    found["runs"] = []
    for run in outcome.get("runs", []):
        seen = {"error": _first_line(run["error"]), "flow_state": run.get("flow_state"),
                "flow_events": run["flow_events"]}
        if run.get("flow_state") == "SUCCESS":
            seen.update(atom_states=run["atom_states"], fetch_all=run["fetch_all"])
        else:
            seen["atom_states"] = {name: _STARTED_OR_NOT.get(state, state)
                                   for name, state in run.get("atom_states", {}).items()}
        found["runs"].append(seen)
    return found


def _rounds_free(outcome: dict[str, Any]) -> dict[str, Any]:
    """What a program where several tasks fail observes however the failures group into
    rounds: ``_timing_free``, and of the error only that there is one (one failure re-raised
    or a WrappedFailure of several depends on which failures share a round)."""
    found = _timing_free(outcome, None)
    for run in found["runs"]:
        run["error"] = run["error"] is not None
    return found


def _two_ready_tasks() -> dict[str, Any]:
    task = {"requires": [], "provides": None, "rebind": {}, "inject": {}, "fails": 0}
    return {"flow": {"pattern": "unordered", "name": "f", "retry": None,
                     "items": [{**task, "name": "a"}, {**task, "name": "b"}]},
            "store": {}, "engine": "serial", "options": {}, "suspend_at": None}


def test_serial_engine_stores_each_result_before_the_next_atom_starts() -> None:
    # A deliberate difference (doc/migration.rst): TaskFlow announces every ready atom RUNNING
    # before storing any result; flowengine stores each, so a crash never loses finished work.
    program = _two_ready_tasks()
    expected = run_program("taskflow", program)["runs"][0]["atom_events"]
    assert [state for _, state in expected] == ["RUNNING", "RUNNING", "SUCCESS", "SUCCESS"]
    actual = run_program("flowengine", program)["runs"][0]["atom_events"]
    assert [state for _, state in actual] == ["RUNNING", "SUCCESS", "RUNNING", "SUCCESS"]
    assert actual[0][0] == actual[1][0] != actual[2][0] == actual[3][0]


def test_fetch_all_returns_a_failed_tasks_failure() -> None:
    program = _two_ready_tasks()
    program["flow"]["items"][0].update(provides="x", fails=1)
    expected = run_program("taskflow", program)["runs"][0]["fetch_all"]
    assert expected["x"] == "failure: a failed #1"
    assert run_program("flowengine", program)["runs"][0]["fetch_all"] == expected


def test_taskflow_reverts_tasks_that_never_ran_at_random() -> None:
    # The same program, run again and again on TaskFlow: b is sometimes reverted without having
    # run (see _forget_unrun_reverts), never on flowengine, whose outcome is TaskFlow's other one.
    task = {"requires": [], "provides": None, "rebind": {}, "inject": {}, "fails": 0}
    program = _two_ready_tasks()
    program["flow"] = {"pattern": "graph", "name": "f", "retry": None, "items": [
        {**task, "name": "a", "fails": 9},
        {"pattern": "linear", "name": "g", "retry": {"type": "AlwaysRevertAll", "name": "r",
                                                     "revert_all": True, "provides": None},
         "items": [{**task, "name": "b"}]}]}
    outcomes = [run_program("taskflow", program) for _ in range(40)]
    seen = {frozenset(_reverted_unrun_atoms(o)) for o in outcomes}
    assert seen == {frozenset(), frozenset({"b"})}
    actual = run_program("flowengine", program)
    assert not _reverted_unrun_atoms(actual)
    actual = _comparable(actual, program)
    for outcome in outcomes:
        assert actual == _comparable(_forget_unrun_reverts(outcome), program)


def _provider_shapes() -> list[dict[str, Any]]:
    task = {"requires": [], "provides": "x", "rebind": {}, "inject": {}, "fails": 0}
    consumer = {**task, "name": "c", "requires": ["x"], "provides": None}

    def flow(pattern: str, name: str, *items: dict[str, Any]) -> dict[str, Any]:
        return {"pattern": pattern, "name": name, "retry": None, "items": list(items)}

    a, b, d = ({**task, "name": n} for n in "abd")
    return [
        flow("linear", "f", flow("unordered", "u", a, b), consumer),
        flow("linear", "f", a, flow("unordered", "u", b, d), consumer),
        flow("linear", "f", flow("linear", "g", a, flow("unordered", "u", b, d)), consumer),
        flow("linear", "f", a, flow("linear", "g", b, flow("linear", "h", d, consumer))),
        flow("graph", "f", flow("unordered", "u", a, b), flow("linear", "g", d, consumer)),
    ]


@pytest.mark.parametrize("shape", range(len(_provider_shapes())))
def test_a_consumer_reads_the_closest_of_several_providers(shape: int) -> None:
    # TaskFlow's scopes: the consumer's own flow first (the later of its providers first),
    # then each enclosing flow. fetch_all lists every provider's value, in storage order.
    program = {**_two_ready_tasks(), "flow": _provider_shapes()[shape]}

    def seen(outcome: dict[str, Any]) -> Any:
        calls = [call for call in outcome["ledger"] if call[1] == "c"]
        return calls, outcome["runs"][0]["fetch_all"], list(outcome["runs"][0]["records"])

    assert seen(run_program("flowengine", program)) == seen(run_program("taskflow", program))


def test_a_reverted_flow_raises_the_failures_of_earlier_attempts_too() -> None:
    # t4 fails once and is retried; t5 then fails for good: the run raises a WrappedFailure of
    # both (TaskFlow's storage lists a retried atom's failure until it fails again), and
    # every revert is passed both as flow_failures.
    task = {"requires": [], "provides": None, "rebind": {}, "inject": {}, "fails": 0}
    program = _two_ready_tasks()
    program["flow"] = {"pattern": "linear", "name": "f", "retry": {
        "type": "Times", "name": "r", "attempts": 2, "revert_all": False, "provides": None},
        "items": [{**task, "name": "t4", "fails": 1}, {**task, "name": "t5", "fails": 2}]}
    expected = run_program("taskflow", program)
    assert expected["runs"][0]["error"]["causes"] == ["t4 failed #1", "t5 failed #1"]
    assert run_program("flowengine", program) == expected


def test_a_retry_decided_reverted_is_not_retried_by_a_failure_of_the_same_round() -> None:
    # t5 and t4 fail in one round: t5's controller r1 retries everything (r3 included, which
    # gets the REVERT intention); t4's controller r3 then asks to retry its own subflow, which
    # must not override that (TaskFlow's bug 2043808), or r3's subflow runs on while the flow
    # ends REVERTED with atoms left SUCCESS.
    task = {"requires": [], "provides": None, "rebind": {}, "inject": {}, "fails": 0}
    program = {**_two_ready_tasks(), "engine": "parallel", "flow": {
        "pattern": "graph", "name": "f0", "retry": {
            "type": "ForEach", "name": "r1", "values": [3, 5], "revert_all": False,
            "provides": "attempt"},
        "items": [{"pattern": "linear", "name": "f2", "retry": {
            "type": "ForEach", "name": "r3", "values": [3, 0, 0], "revert_all": False,
            "provides": None}, "items": [{**task, "name": "t4", "fails": 2}]},
            {**task, "name": "t5", "provides": "v5", "fails": 2}]}}
    actual = run_program("flowengine", program)
    assert actual["runs"][0]["flow_state"] == "REVERTED"
    assert set(actual["runs"][0]["atom_states"].values()) == {"REVERTED"}
    assert _rounds_free(actual) == _rounds_free(run_program("taskflow", program))
