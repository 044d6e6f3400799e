"""An engine process the resume tests SIGKILL while its requests wait in a worker queue.

Usage::

    python resume_child.py SQLITE_URI BOOK_UUID ENGINE_OPTIONS_JSON [FACTORY]

It builds :func:`make_flow` (or the factory named ``FACTORY``, e.g. ``make_delayed_flow``)
through ``engines.load_from_factory`` (so a resuming process rebuilds it with
``engines.load_from_detail``) in a new flow detail of logbook ``BOOK_UUID``, prints ``flow
<uuid>`` and runs the flow on the worker-based engine until it ends or is killed.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fault_tasks as ft
from wbe_harness import HERE, subprocess_env

from flowengine import engines, retry
from flowengine.flows import linear_flow as lf
from flowengine.flows import unordered_flow as uf
from flowengine.persistence import backends

#: The flow's two gated tasks: on a one-thread worker one runs, the other waits in the queue.
GATES = ("first", "second")


def make_flow() -> uf.Flow:
    """Two independent :class:`fault_tasks.Gate` tasks."""
    return uf.Flow("resume-revokes").add(*(ft.Gate(name) for name in GATES))


def make_held_flow() -> uf.Flow:
    """One :class:`fault_tasks.Gate` task, ``held``."""
    return uf.Flow("held").add(ft.Gate("held"))


#: The wait before the second attempt of :func:`make_delayed_flow` (seconds).
DELAY = 600.0


def make_delayed_flow() -> lf.Flow:
    """A :class:`fault_tasks.FailsFirst` task whose retry waits :data:`DELAY` before attempt 2."""
    return lf.Flow("resume-delayed", retry=retry.Times(3, name="r", provides="attempt",
                                                       delay=DELAY)).add(ft.FailsFirst("flaky"))


def start(uri: str, book: str, options: Mapping[str, Any], err: Path,
          env: Mapping[str, str], factory: str = "make_flow") -> subprocess.Popen[str]:
    """Start this program on a new flow of ``factory`` in logbook ``book`` of the store at
    ``uri`` (its first line names the flow; its stderr goes to ``err``)."""
    return subprocess.Popen(
        [sys.executable, str(HERE / "resume_child.py"), uri, book, json.dumps(dict(options)),
         factory], stdout=subprocess.PIPE, stderr=err.open("w"), text=True,
        env=subprocess_env(env))


def main(argv: list[str]) -> int:
    uri, book_uuid, options = argv[0], argv[1], json.loads(argv[2])
    backend = backends.fetch(uri)
    with contextlib.closing(backend), contextlib.closing(backend.get_connection()) as conn:
        book = conn.get_logbook(book_uuid)
        import resume_child  # importable by name when resuming

        factory = getattr(resume_child, argv[3] if len(argv) > 3 else "make_flow")

        engine = engines.load_from_factory(factory, book=book, backend=backend,
                                           engine="worker-based", **options)
        print(f"flow {engine.storage.flow_uuid}", flush=True)
        engine.run()
        print(f"final {engine.storage.get_flow_state()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
