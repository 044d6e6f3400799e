"""The ledger and the observed world: what the kit writes, what assertions read, and the file
ledger several processes share."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flowengine.testing import effects
from flowengine.testing import ledger as lg


def test_effects_record_the_value_before_and_after(tmp_path: Path) -> None:
    ledger = lg.MemoryLedger()
    previous = effects.use(ledger)
    try:
        effects.put("seat/1", "held")
        effects.put("seat/1", "held")
        assert effects.add("balance", -30) == -30
        effects.delete("seat/1")
        effects.delete("seat/1")
        effects.note("mail sent", to="ann")
    finally:
        effects.use(previous)
    changes = [(e.op, e.key, e.before, e.after, e.changed) for e in ledger.effects()]
    assert changes == [
        ("put", "seat/1", None, "held", True), ("put", "seat/1", "held", "held", False),
        ("add", "balance", None, -30, True), ("delete", "seat/1", "held", None, True),
        ("delete", "seat/1", None, None, False), ("note", "mail sent", None, None, False)]
    assert ledger.state() == {"balance": -30}
    assert ledger.effects("mail sent")[0].details == {"to": "ann"}


def test_add_refuses_a_key_that_holds_no_number() -> None:
    ledger = lg.MemoryLedger()
    previous = effects.use(ledger)
    try:
        effects.put("name", "ann")
        with pytest.raises(TypeError, match="'name' holds 'ann', not a number"):
            effects.add("name", 1)
    finally:
        effects.use(previous)


def test_the_ledger_named_in_the_environment_is_used_outside_a_kit(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    code = ("from flowengine.testing import effects; effects.put('k', 1); "
            "print(type(effects.ledger()).__name__)")
    env = dict(os.environ, **{effects.LEDGER_ENV: str(path)})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "FileLedger"
    assert lg.FileLedger(path).state() == {"k": 1}


def _add_many(path: str, times: int) -> None:
    ledger = lg.FileLedger(path)
    for _ in range(times):
        ledger.change("counter", "add", lambda before: (before or 0) + 1)


def test_processes_sharing_a_file_ledger_see_each_others_changes(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.jsonl")
    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=_add_many, args=(path, 50)) for _ in range(3)]
    for child in children:
        child.start()
    _add_many(path, 50)
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    ledger = lg.FileLedger(path)
    assert ledger.state() == {"counter": 200}  # no change lost: each read the one before it
    changes = ledger.effects("counter")
    assert [e.after for e in changes] == list(range(1, 201))
    assert [e.seq for e in ledger.entries()] == list(range(200))


def test_an_entry_survives_its_json_line() -> None:
    entry = lg.Entry(seq=3, kind=lg.EFFECT, atom="a", action="revert", op="put", key="k",
                     before={"x": [1]}, after=None, details={"why": "test"}, run="2", t=1.5)
    assert lg.Entry.from_json(entry.to_json()) == entry


def test_assertions_say_what_happened() -> None:
    ledger = lg.MemoryLedger()
    for atom in ("a", "b"):
        ledger.append(lg.CALL, atom=atom, action="execute", attempt=1, run="1")
    for atom in ("a", "b"):
        ledger.append(lg.CALL, atom=atom, action="revert", attempt=1, run="1")
    ledger.assert_ran_once("a")
    with pytest.raises(AssertionError, match=r"reverted \['a', 'b'\], expected \['b', 'a'\]"):
        ledger.assert_reverted_in_order("b", "a")
    with pytest.raises(AssertionError, match="c executed 0 time"):
        ledger.assert_ran_once("c")
    with pytest.raises(AssertionError, match="a was reverted 1 time"):
        ledger.assert_not_reverted("a")


def test_falsy_values_survive_the_json_line() -> None:
    for value in (0, False, "", [], 0.0):
        entry = lg.Entry(seq=0, kind=lg.EFFECT, op="put", key="k", before=value, after=value)
        again = lg.Entry.from_json(entry.to_json())
        assert (again.before, again.after) == (value, value)
        assert type(again.after) is type(value)
