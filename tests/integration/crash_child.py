"""Runs (or resumes) one crash-test flow in its own process, until it ends or is SIGKILLed.

Usage::

    python crash_child.py start  URI ENGINE BOOK_UUID FACTORY_KWARGS_JSON
    python crash_child.py resume URI ENGINE FLOW_DETAIL_UUID
    python crash_child.py serve

``start`` builds the flow with :func:`crash_tasks.make_flow` through
``engines.load_from_factory`` (which records the factory and its arguments in a new flow detail
of the logbook ``BOOK_UUID``); ``resume`` loads flow detail ``FLOW_DETAIL_UUID`` from the backend
and rebuilds its flow with ``engines.load_from_detail``. Either way the engine runs to an end
state, then the child prints ``final <flow state>`` (and ``raised <exception type>`` when the run
re-raised a failure) and exits with status 0.

``serve`` saves each run the second it takes to start Python and import SQLAlchemy and
flowengine: it imports them once, then reads requests (``{"argv": [...], "out": path}``, one JSON
line each) from stdin and forks a new process per request, which runs ``argv`` as above with its
output going to ``out``. It answers ``pid <pid>`` at once and ``exit <pid> <returncode>`` when
that process has ended (the return code is negative for a signal, as with ``subprocess``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback

import crash_tasks
import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401  (imported once, before forking)
import sqlalchemy.dialects.sqlite.pysqlite  # noqa: F401

from flowengine import engines
from flowengine.exceptions import WrappedFailure
from flowengine.persistence import backends


def main(argv: list[str]) -> int:
    mode, uri, engine_kind, ref = argv[:4]
    backend = backends.fetch(uri)
    with contextlib.closing(backend), contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
        if mode == "start":
            book = conn.get_logbook(ref)
            engine = engines.load_from_factory(
                crash_tasks.make_flow, factory_kwargs=json.loads(argv[4]), book=book,
                backend=backend, engine=engine_kind)
        elif mode == "resume":
            flow_detail = conn.get_flow_details(ref)
            engine = engines.load_from_detail(flow_detail, backend=backend, engine=engine_kind)
        else:
            raise SystemExit(f"unknown mode {mode!r} (expected 'start' or 'resume')")
        raised: list[str] = []
        try:
            engine.run()
        except crash_tasks.Boom as err:
            raised.append(type(err).__name__)
        except WrappedFailure as err:
            # A failure read back from storage has no traceback left to re-raise (as TaskFlow).
            raised.extend("Boom" if f.check(crash_tasks.Boom) else repr(f) for f in err)
        print(f"final {engine.storage.get_flow_state()}", flush=True)
        if raised:
            print(f"raised {', '.join(raised)}", flush=True)
    return 0


def _run_forked(argv: list[str], out: str) -> None:
    code = 1
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        code = main(argv)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # Never return into the server's loop; skip the interpreter's shutdown too.
        os._exit(code)


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_forked(request["argv"], request["out"])
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {pid} {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        sys.exit(main(sys.argv[1:]))
