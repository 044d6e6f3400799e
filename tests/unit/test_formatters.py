"""FailureFormatter on failures of real engine runs."""

from __future__ import annotations

import os
from typing import Any

import pytest

from flowengine import engines, states, task
from flowengine.flows import graph_flow, linear_flow, unordered_flow
from flowengine.formatters import FailureFormatter
from flowengine.listeners import base
from flowengine.types.failure import Failure


class Provide(task.Task):
    """Returns a fixed value."""

    def __init__(self, name: str, value: Any, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self._value = value

    def execute(self, **kwargs: Any) -> Any:
        return self._value


class Broken(task.Task):
    def execute(self, **kwargs: Any) -> None:
        raise RuntimeError("Woot!")


class FormatsFailures(base.Listener):
    """Formats each task failure while the engine is still handling it (intention EXECUTE)."""

    def __init__(self, engine: Any, formatter: FailureFormatter) -> None:
        super().__init__(engine, task_listen_for=[states.FAILURE], flow_listen_for=())
        self._formatter = formatter
        self.formatted: list[tuple[Any, str]] = []

    def _task_receiver(self, state: str, details: dict[str, Any]) -> None:
        name = details["task_name"]
        self.formatted.append(self._formatter.format(details["result"], lambda a: a.name == name))


def run_and_format(flow: Any, **formatter_options: Any) -> tuple[Any, str]:
    engine = engines.load(flow)
    with FormatsFailures(engine, FailureFormatter(engine, **formatter_options)) as listener:
        with pytest.raises(RuntimeError, match="Woot!"):
            engine.run()
    [formatted] = listener.formatted
    return formatted


def lines(*text: str) -> str:
    return os.linesep.join(text)


def three_step_flow() -> linear_flow.Flow:
    return linear_flow.Flow("test").add(
        Provide("happy-1", 1, provides="x"),
        Provide("happy-2", 2, provides="y", requires="x"),
        Broken("broken", requires="y"),
    )


def test_details_list_predecessors_with_their_inputs_and_outputs() -> None:
    exc_info, details = run_and_format(three_step_flow())
    assert exc_info[0] is RuntimeError and str(exc_info[1]) == "Woot!"
    assert details == lines(
        "3 predecessors (most recent first):",
        "  Atom 'happy-2' {'intention': 'EXECUTE', 'state': 'SUCCESS', 'requires': {'x': 1},"
        " 'provides': 2}",
        "  |__Atom 'happy-1' {'intention': 'EXECUTE', 'state': 'SUCCESS', 'requires': {},"
        " 'provides': 1}",
        "     |__Flow 'test'",
    )


def test_inputs_and_outputs_can_be_hidden() -> None:
    _, details = run_and_format(three_step_flow(), hide_inputs_outputs_of=["happy-1", "happy-2"])
    assert details == lines(
        "3 predecessors (most recent first):",
        "  Atom 'happy-2' {'intention': 'EXECUTE', 'state': 'SUCCESS'}",
        "  |__Atom 'happy-1' {'intention': 'EXECUTE', 'state': 'SUCCESS'}",
        "     |__Flow 'test'",
    )


def test_inputs_and_outputs_can_be_masked() -> None:
    flow = linear_flow.Flow("test").add(
        Provide("login", [{"user": "u", "password": "p"}], provides="creds"),
        Broken("broken", requires="creds"),
    )
    _, details = run_and_format(flow, mask_outputs_keys=["password"])
    assert "'provides': [{'user': 'u', 'password': '***'}]" in details

    flow = linear_flow.Flow("test").add(
        Provide("login", {"token": "t"}, provides="session", inject={"secret": "s"}),
        Provide("use", 1, requires="session"),
        Broken("broken"),
    )
    _, details = run_and_format(flow, mask_inputs_keys=["token"])
    assert "'requires': {'session': {'token': '***'}}, 'provides': 1}" in details


def test_shared_predecessors_are_expanded_once() -> None:
    flow = linear_flow.Flow("f").add(
        Provide("a", 1, provides="x"),
        unordered_flow.Flow("u").add(Provide("c", 2, requires="x"), Provide("c2", 3, requires="x")),
        Broken("b"),
    )
    _, details = run_and_format(flow, hide_inputs_outputs_of=["a", "c", "c2"])
    done = "{'intention': 'EXECUTE', 'state': 'SUCCESS'}"
    assert details == lines(
        "5 predecessors (most recent first):",
        f"  Atom 'c' {done}",
        "  |__Flow 'u'",
        f"     |__Atom 'a' {done}",
        "        |__Flow 'f'",
        f"  Atom 'c2' {done}",
        "  |__Flow 'u' (see above)",
    )


def test_branches_of_a_graph_flow() -> None:
    flow = graph_flow.Flow("g").add(
        Provide("a", 1, provides="w"),
        Provide("b", 2, provides="x", requires="w"),
        Provide("c", 3, provides="y", requires="w"),
        Provide("d", 4, provides="z", requires=["x", "y"]),
        Broken("e", requires="z"),
    )
    _, details = run_and_format(flow, hide_inputs_outputs_of="abcd")
    done = "{'intention': 'EXECUTE', 'state': 'SUCCESS'}"
    assert details == lines(
        "5 predecessors (most recent first):",
        f"  Atom 'd' {done}",
        f"  |__Atom 'b' {done}",
        f"  |  |__Atom 'a' {done}",
        "  |     |__Flow 'g'",
        f"  |__Atom 'c' {done}",
        "     |__Atom 'a' (see above)",
    )


def test_no_details_once_the_atom_is_no_longer_executing() -> None:
    engine = engines.load(three_step_flow())
    with pytest.raises(RuntimeError):
        engine.run()
    fail = engine.storage.get_execute_failures()["broken"]
    exc_info, details = FailureFormatter(engine).format(fail, lambda a: a.name == "broken")
    assert engine.storage.get_atom_intention("broken") == states.REVERT
    assert len(exc_info) == 3 and details == ""

    exc_info, details = FailureFormatter(engine).format(fail, lambda a: False)
    assert len(exc_info) == 3 and details == ""


def test_a_failure_without_exc_info_brings_its_own_traceback() -> None:
    engine = engines.load(three_step_flow())
    with pytest.raises(RuntimeError):
        engine.run()
    remote = Failure.from_dict(engine.storage.get_execute_failures()["broken"].to_dict())
    engine.storage.set_atom_intention("broken", states.EXECUTE)
    exc_info, details = FailureFormatter(engine).format(remote, lambda a: a.name == "broken")
    assert exc_info is None
    traceback_text = remote.pformat(traceback=True)
    assert "RuntimeError: Woot!" in traceback_text
    assert details.startswith(traceback_text + os.linesep + "3 predecessors (most recent first):")


def test_a_very_long_flow_does_not_exhaust_the_stack() -> None:
    count = 1500
    flow = linear_flow.Flow("long").add(*(Provide(f"t{i}", i) for i in range(count)))
    engine = engines.load(flow)
    engine.prepare()
    try:
        raise RuntimeError("Woot!")
    except RuntimeError:
        fail = Failure()
    _, details = FailureFormatter(engine).format(fail, lambda a: a.name == f"t{count - 1}")
    text = details.splitlines()
    assert text[0] == f"{count} predecessors (most recent first):"
    assert (
        text[1]
        == f"  Atom 't{count - 2}' {{'intention': 'EXECUTE', 'state': 'PENDING', 'requires': {{}}}}"
    )
    assert text[-1].endswith("|__Flow 'long'")
