"""TaskFlow 6.5's own example programs print the same on flowengine (imports renamed).

Every example that needs no ZooKeeper runs once on TaskFlow and once, imports renamed, on
flowengine (see ``examples``): the worker-based ones run their workers on threads over the
in-memory transport, and TaskFlow's test helpers some import are renamed too. Only what is
legitimately random is normalised (``examples.normalise``): uuids, object addresses, durations,
timestamps, scratch paths and thread idents, plus the library's own module path in reprs (the
rename itself) and the frames of a printed traceback (each library's own code).
Examples whose tasks run concurrently compare their words as a multiset, since thread
scheduling orders (and interleaves) their lines; one whose tasks also sleep random times
compares the multiset of its lines. Examples that fail (``alphabet_soup`` asks for an executor
neither library has) fail with the same exit status, exception type and output.
"""

from __future__ import annotations

import collections
import concurrent.futures
import re

import pytest
from servers import require_module

require_module("taskflow")

from .examples import example_names, normalise, run_example  # noqa: E402

#: Examples whose output order depends on thread scheduling.
CONCURRENT = {"build_a_car", "buildsystem", "hello_world", "parallel_table_multiply",
              "calculate_in_parallel", "resume_vm_boot", "share_engine_thread",
              "wrapped_exception"}
_LIB_PATHS = re.compile(r"taskflow\.engines\.action_engine\.engine|flowengine\.engines\.engine")


#: Words of concurrent output. ``print`` writes a line and its newline separately, so another
#: thread's line can land between them ("Making volume 3Finished making volume 1"): split digits
#: from letters and a lower-case letter from a capital that follows it, as no word here has one.
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


#: Examples printing every ``run_iter`` state: how many WAITING/ANALYZING rounds a parallel run
#: takes depends on when its tasks finish, so their words are compared as a set.
STATE_STREAMS = {"parallel_table_multiply"}


#: Examples whose tasks sleep random times (drawn in thread order, so not the same on two runs
#: of TaskFlow) and print as they go: compared as the multiset of their lines, with interleaved
#: writes split at the start of each line they print.
RANDOM_TIMING = {"create_parallel_volume":
                 re.compile(r"(?=<<engines>\.|Making volume|Finished making| -- )")}
#: A traceback's frames are each library's own code; its first and last lines are compared.
_FRAMES = re.compile(r"^(Traceback \(most recent call last\):\n)(?:  .*\n)+", re.MULTILINE)


def _comparable(name: str, text: str) -> object:
    text = _FRAMES.sub(r"\1  <frames>\n", _LIB_PATHS.sub("<engines>", normalise(text)))
    if name in RANDOM_TIMING:
        lines = (line.strip() for line in RANDOM_TIMING[name].split(text.replace("\n", "")))
        return sorted(collections.Counter(line for line in lines if line).items())
    if name in STATE_STREAMS:
        return sorted(set(_WORD.findall(text)))
    if name in CONCURRENT:
        return sorted(collections.Counter(_WORD.findall(text)).items())
    return text


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].split(":")[0] if lines else ""


@pytest.mark.timeout(180)  # the slowest example took 23 s on a loaded 2-core machine
@pytest.mark.parametrize("name", example_names())
def test_example_prints_what_it_prints_on_taskflow(name: str) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        running = pool.submit(run_example, name, "taskflow")
        actual = run_example(name, "flowengine")
        expected = running.result()
    assert actual.returncode == expected.returncode, actual.stderr[-3000:]
    # An example that fails fails with the same exception type.
    assert _last_line(actual.stderr) == _last_line(expected.stderr) or expected.returncode == 0
    assert _comparable(name, actual.stdout) == _comparable(name, expected.stdout)
