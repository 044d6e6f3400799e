"""Run doc/getting-started.rst as a new user would: write its files, run its commands in order.

Each ``python`` block with a ``:caption:`` is written to that file; each ``$ command`` of a
console block runs in the same folder (``flowengine worker`` is started and left running, as in
a second terminal) and must print exactly the lines under it, where ``...`` stands for anything
(a uuid, a time) and runs of spaces for any spacing. Commands of the install block are skipped.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "doc" / "getting-started.rst"
#: Commands that set up an environment the test already runs in.
SKIPPED = ("python3 -m venv", ". .venv/bin/activate", "pip install")


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


def test_the_getting_started_page_runs_as_written(tmp_path: pathlib.Path) -> None:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("FLOWENGINE_")}
    # The embedded transport keeps its queues under the temp folder: this run's own.
    (tmp_path / "tmp").mkdir()
    env.update(TMPDIR=str(tmp_path / "tmp"), PYTHONUNBUFFERED="1")
    bin_dir = pathlib.Path(sys.executable).parent
    background: list[subprocess.Popen[str]] = []
    ran: list[str] = []
    try:
        for kind, what, lines in _steps(PAGE.read_text()):
            if kind == "file":
                (tmp_path / what).write_text("\n".join(lines) + "\n")
                continue
            if what.startswith(SKIPPED):
                continue
            program, *args = what.split()
            executable = sys.executable if program == "python" else str(bin_dir / program)
            if what.startswith("flowengine worker"):
                background.append(subprocess.Popen(
                    [executable, *args], cwd=tmp_path, env=env, text=True,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                ran.append(what)
                continue
            proc = subprocess.run([executable, *args], cwd=tmp_path, env=env, text=True,
                                  capture_output=True, timeout=120)
            _check(what, proc, lines)
            ran.append(what)
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
        "python run_local.py", "python run_failing.py", "python run_saved.py",
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
