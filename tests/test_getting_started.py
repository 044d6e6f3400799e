"""Run doc/getting-started.rst as a new user would: write its files, run its commands in order.

The page starts "from a clone of the repository": the test copies the source tree to a
temporary folder and runs every command there, the install block included (``python3 -m venv
.venv``, ``. .venv/bin/activate``, ``pip install -e .``, with pip taking packages from the
session's wheelhouse, see tests/fresh_venv.py), so what follows runs on the base install alone.
Each ``python`` block with a ``:caption:`` is written to that file; each ``$ command`` of a
console block runs in the same folder (``flowengine worker`` is started and left running, as in
a second terminal) and must print exactly the lines under it, where ``...`` stands for anything
(a uuid, a time) and runs of spaces for any spacing.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import fresh_venv
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "doc" / "getting-started.rst"
#: The install block's commands, as the page gives them.
INSTALL = ["python3 -m venv .venv", ". .venv/bin/activate", "pip install -e ."]


def _blocks(text: str) -> Iterator[tuple[str, str | None, list[str]]]:
    """``(language, caption, lines)`` of every code block, in page order, dedented."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        found = re.match(r"\.\. code-block:: (\w+)", lines[i])
        i += 1
        if not found:
            continue
        caption = None
        while i < len(lines) and lines[i].strip().startswith(":"):
            option = re.match(r"\s*:caption: (\S+)", lines[i])
            caption = option.group(1) if option else caption
            i += 1
        body: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        indent = min(len(line) - len(line.lstrip()) for line in body if line.strip())
        yield found.group(1), caption, [line[indent:] for line in body]


def _steps(text: str) -> Iterator[tuple[str, str, list[str]]]:
    """``("file", name, lines)`` and ``("run", command, expected output)`` in page order."""
    for language, caption, lines in _blocks(text):
        if language == "python" and caption:
            yield "file", caption, lines
        elif language == "console":
            command: str | None = None
            expected: list[str] = []
            for line in lines:
                if line.startswith("$ "):
                    if command is not None:
                        yield "run", command, expected
                    command, expected = line[2:].strip(), []
                else:
                    expected.append(line)
            if command is not None:
                yield "run", command, expected


def _pattern(expected: str) -> re.Pattern[str]:
    parts = [r"\s+".join(map(re.escape, piece.split())) for piece in expected.split("...")]
    return re.compile(r"\s*" + ".*".join(parts) + r"\s*")


def _check(command: str, proc: subprocess.CompletedProcess[str], expected: list[str]) -> None:
    assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    got = proc.stdout.splitlines()
    assert len(got) == len(expected), f"{command} printed:\n{proc.stdout}\nexpected:\n" + (
        "\n".join(expected))
    for line, want in zip(got, expected, strict=True):
        assert _pattern(want).fullmatch(line), f"{command}: {line!r} does not match {want!r}"


def _install(command: str, clone: pathlib.Path, env: dict[str, str],
             wheelhouse: pathlib.Path) -> None:
    """Run one command of the install block in ``clone``; ``activate`` changes ``env``."""
    venv = clone / ".venv"
    if command == ". .venv/bin/activate":  # what sourcing it does for the commands after it
        env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")
        return
    if command.startswith("python3 "):
        args = [sys.executable, *command.split()[1:]]
    else:
        args = [str(venv / "bin" / "pip"), *command.split()[1:]]
    fresh_venv.run(args, cwd=clone, env=fresh_venv.pip_env(wheelhouse, env))


def test_the_getting_started_page_runs_as_written(tmp_path: pathlib.Path,
                                                  wheelhouse: pathlib.Path) -> None:
    clone = fresh_venv.copy_source(tmp_path / "flowengine")
    # The embedded transport keeps its queues under the temp folder: this run's own.
    (tmp_path / "tmp").mkdir()
    env = fresh_venv.clean_env(TMPDIR=str(tmp_path / "tmp"), PYTHONUNBUFFERED="1")
    bin_dir = clone / ".venv" / "bin"
    background: list[subprocess.Popen[str]] = []
    ran: list[str] = []
    try:
        for kind, what, lines in _steps(PAGE.read_text()):
            if kind == "file":
                (clone / what).write_text("\n".join(lines) + "\n")
                continue
            ran.append(what)
            if what in INSTALL:
                _install(what, clone, env, wheelhouse)
                continue
            program, *args = what.split()
            executable = str(bin_dir / program)
            if what.startswith("flowengine worker"):
                background.append(subprocess.Popen(
                    [executable, *args], cwd=clone, env=env, text=True,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                continue
            proc = subprocess.run([executable, *args], cwd=clone, env=env, text=True,
                                  capture_output=True, timeout=120)
            _check(what, proc, lines)
    finally:
        for worker in background:
            worker.send_signal(signal.SIGTERM)
        for worker in background:
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    assert ran == [
        *INSTALL, "python run_local.py", "python run_failing.py", "python run_saved.py",
        "flowengine flows --backend sqlite:///flows.db",
        "flowengine worker --topic servers --task provisioning", "python run_on_workers.py",
    ]
    assert all(worker.returncode == 0 for worker in background), "a worker did not stop cleanly"


@pytest.mark.parametrize("line, expected, matches", [
    ("abc  provision  SUCCESS", "...  provision SUCCESS", True),
    ("abc  provision  FAILURE", "...  provision SUCCESS", False),
])
def test_expected_lines_match_as_documented(line: str, expected: str, matches: bool) -> None:
    assert bool(_pattern(expected).fullmatch(line)) is matches
