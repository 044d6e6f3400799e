"""The contract between the engine core and its executors, and the atoms it hands them.

The core reads what :class:`~flowengine.atom.Atom`, :class:`~flowengine.task.Task` and
:class:`~flowengine.engines.executor.TaskExecutor` declare directly: a ``getattr``/``hasattr``
probe with a default would hide a misspelt name, and a capability an executor has must be part
of the contract, where every executor (and its reader) sees it.
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import pathlib
from typing import Any

import pytest

import flowengine
from flowengine import engines, task
from flowengine.atom import Atom
from flowengine.engines import executor as ex
from flowengine.flows import linear_flow

PACKAGE = pathlib.Path(flowengine.__file__).parent
#: The engine core and the worker-based engine: the modules the contract binds.
CORE = [PACKAGE / "engines", PACKAGE / "worker_based"]
#: Names a probe may still look up: not declared, looked up on purpose.
LOOKED_UP = {"__dict__", "execute", "revert"}
#: What the core calls the atoms and executors it holds.
RECEIVERS = {"task", "atom", "executor", "task_executor", "retry"}


def _receiver(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):  # sub.task, self._executor
        return node.attr.lstrip("_")
    return None


class _Noop(task.Task):
    def execute(self) -> None:
        return None


def _declared() -> set[str]:
    """What atoms, tasks and executors have: class attributes and what instances set."""
    names: set[str] = set()
    for cls in (Atom, task.Task, ex.TaskExecutor):
        names.update(name for name in dir(cls) if not name.startswith("__"))
    names.update(vars(_Noop("probe")))
    names.update(vars(ex.SerialTaskExecutor()))
    return names - LOOKED_UP


def _probes() -> list[str]:
    declared = _declared()
    found = []
    for root in CORE:
        for path in sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2):
                    continue
                name = node.args[1]
                if _receiver(node.args[0]) not in RECEIVERS:
                    continue
                if isinstance(name, ast.Constant) and name.value in declared:
                    where = path.relative_to(PACKAGE.parent)
                    found.append(f"{where}:{node.lineno} {node.func.id}(..., {name.value!r})")
    return found


def test_the_core_reads_declared_names_without_probing() -> None:
    assert _probes() == []


def test_a_local_executor_refuses_a_delay_naming_the_task() -> None:
    executor = ex.SerialTaskExecutor()
    with pytest.raises(ValueError, match=r"SerialTaskExecutor does not take a delay.*'late'"):
        executor.execute_task(_Noop("late"), "uuid-1", {}, delay=2.0)


def test_the_base_contract_declares_what_the_engines_ask() -> None:
    executor = ex.SerialTaskExecutor()
    assert executor.delays_dispatch is False
    # A local executor's calls die with their process: a resumed run has nothing to take back.
    assert executor.revoke_at_start(["a", "b"]) is None
    assert executor.delete_at_start(["job-1"]) is None
    assert executor.reserve_request_id("uuid-1") is None


def test_a_start_delay_is_waited_by_the_engine_of_an_executor_without_delays() -> None:
    class Late(_Noop):
        start_delay = 0.05

    ran: list[str] = []

    class Seen(Late):
        def execute(self) -> None:
            ran.append(self.name)

    engine = engines.load(linear_flow.Flow("late").add(Seen("a"), _Noop("b")))
    engine.run()
    assert ran == ["a"]
    assert engine.storage.get_flow_state() == "SUCCESS"


class _TaskFlowStyle(ex.TaskExecutor):
    """An executor written against TaskFlow's interface: execute_task and revert_task only,
    run inline, each call recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self._local = ex.SerialTaskExecutor()

    def execute_task(self, task: task.Task, task_uuid: str, arguments: Any,
                     progress_callback: Any = None) -> cf.Future:
        self.calls.append(("execute", task.name))
        return self._local.execute_task(task, task_uuid, arguments, progress_callback)

    def revert_task(self, task: task.Task, task_uuid: str, arguments: Any, result: Any,
                    failures: Any, progress_callback: Any = None) -> cf.Future:
        self.calls.append(("revert", task.name))
        return self._local.revert_task(task, task_uuid, arguments, result, failures,
                                       progress_callback)


class _Fails(task.Task):
    def execute(self) -> None:
        raise RuntimeError("boom")


def test_an_executor_with_taskflows_interface_runs_a_flow_through_submit() -> None:
    # Engines hand every call over through submit(); its default reaches TaskFlow's methods
    # (a TaskFlow executor's execute_task takes no delay: none is passed).
    executor = _TaskFlowStyle()
    engine = engines.load(linear_flow.Flow("f").add(_Noop("a"), _Fails("b")),
                          engine="parallel", executor=executor)
    with pytest.raises(RuntimeError, match="boom"):
        engine.run()
    assert executor.calls == [("execute", "a"), ("execute", "b"), ("revert", "b"),
                              ("revert", "a")]
    assert engine.storage.get_flow_state() == "REVERTED"


def test_work_names_what_is_wrong_with_it() -> None:
    with pytest.raises(ValueError, match=r"task 'a' needs action 'EXECUTE' or 'REVERT', not 'RUN'"):
        ex.Work(_Noop("a"), "uuid-1", "RUN", {})
    with pytest.raises(ValueError, match=r"revert is never delayed \(task 'a'"):
        ex.Work(_Noop("a"), "uuid-1", ex.REVERT, {}, delay=1.0)


def test_taskflows_methods_are_faces_of_submit_on_flowengines_executors() -> None:
    submitted: list[ex.Work] = []

    class Watched(ex.SerialTaskExecutor):
        def submit(self, work: ex.Work) -> cf.Future:
            submitted.append(work)
            return super().submit(work)

    executor = Watched()
    assert executor.execute_task(_Noop("a"), "uuid-a", {}).result() == (ex.EXECUTED, None)
    assert executor.revert_task(_Noop("a"), "uuid-a", {}, None, {}).result() == (
        ex.REVERTED, None)
    assert [(w.action, w.task_uuid) for w in submitted] == [(ex.EXECUTE, "uuid-a"),
                                                            (ex.REVERT, "uuid-a")]
