"""Persistence benchmark: what storing every state change costs a 1,000-task linear flow.

The same flow of no-op tasks runs without persistence, with the memory backend, with a SQLite
file and with PostgreSQL. Each configuration runs ``--repeat`` times (a fresh database each time)
and its best ``engine.run()`` time is reported, with the ratios to no persistence and to the
memory backend. The project's target: SQLite costs at most 3x the memory backend's run time.

The run time covers everything ``engine.run()`` does: creating the atom records, storing each
state change (RUNNING, then SUCCESS with the result, per task) and the flow's own states. Loading
(building the flow, saving the logbook and flow detail) is reported apart as ``load_s``.

Prints one JSON document. Example::

    python benchmarks/persistence.py --size 1000 --repeat 3 \\
        --postgres postgresql://postgres@127.0.0.1:5432/flowengine
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from flowengine import engines, task
from flowengine.flows import linear_flow
from flowengine.persistence import backends, models
from flowengine.persistence.backends import impl_sqlalchemy

DEFAULT_POSTGRES = os.environ.get(
    "FLOWENGINE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/flowengine")


class Noop(task.Task):
    def execute(self) -> None:
        return None


def make_flow(size: int) -> linear_flow.Flow:
    return linear_flow.Flow("bench").add(*[Noop(f"t{i}") for i in range(size)])


@contextlib.contextmanager
def _sqlite(workdir: Path) -> Iterator[str]:
    path = workdir / f"{uuid.uuid4().hex}.db"
    try:
        yield f"sqlite:///{path}"
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


@contextlib.contextmanager
def _postgres(url: str) -> Iterator[str]:
    """A fresh schema on the server, dropped afterwards."""
    import sqlalchemy as sa

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{url}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def run_once(size: int, uri: str | None) -> dict[str, float]:
    """Load and run the flow once with a backend at ``uri`` (None: no persistence)."""
    backend = None
    if uri is not None:
        backend = backends.fetch(uri)
        with contextlib.closing(backend.get_connection()) as conn:
            conn.upgrade()
    try:
        started = time.perf_counter()
        book = models.LogBook("bench") if backend is not None else None
        engine = engines.load(make_flow(size), book=book, backend=backend)
        engine.compile()
        loaded = time.perf_counter()
        engine.run()
        finished = time.perf_counter()
    finally:
        if backend is not None:
            backend.close()
    return {"load_s": loaded - started, "run_s": finished - loaded}


def count_sqlite_statements(size: int, workdir: Path) -> dict[str, Any]:
    """Statements SQLite executes (by kind) while the flow runs once; not timed."""
    from sqlalchemy import event

    counts: dict[str, int] = {}
    with _sqlite(workdir) as uri:
        backend = impl_sqlalchemy.SQLAlchemyBackend({"connection": uri})

        @event.listens_for(backend.engine, "connect")
        def trace(dbapi_conn: Any, record: Any) -> None:
            def count(sql: str) -> None:
                kind = sql.split(None, 1)[0].upper()
                counts[kind] = counts.get(kind, 0) + 1
            dbapi_conn.set_trace_callback(count)

        try:
            with contextlib.closing(backend.get_connection()) as conn:
                conn.upgrade()
            engine = engines.load(make_flow(size), book=models.LogBook("bench"), backend=backend)
            engine.compile()
            counts.clear()
            engine.run()
        finally:
            backend.close()
    changes = 2 * size  # RUNNING, then SUCCESS with the result, per task
    # The INSERTs are the atom records, created once per flow (one executemany).
    other = sum(n for kind, n in counts.items() if kind != "INSERT")
    return {
        "during_run": dict(sorted(counts.items())),
        "atom_state_changes": changes,
        "statements_per_atom_state_change": round(other / changes, 3),
    }


def measure(size: int, repeat: int, where: Callable[[], contextlib.AbstractContextManager[
        str | None]]) -> dict[str, Any]:
    runs = []
    for _ in range(repeat):
        with where() as uri:
            runs.append(run_once(size, uri))
    best = min(runs, key=lambda r: r["run_s"])
    return {
        "run_s": best["run_s"],
        "load_s": best["load_s"],
        "run_s_all": [round(r["run_s"], 4) for r in runs],
        "run_s_median": statistics.median(r["run_s"] for r in runs),
        "us_per_task": best["run_s"] / size * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES,
                        help="server URL ('' skips PostgreSQL); a schema is made per run")
    parser.add_argument("--workdir", default=None, help="where SQLite files go (default: tmp)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        workdir = Path(tmp)
        configs: dict[str, Callable[[], contextlib.AbstractContextManager[str | None]]] = {
            "none": lambda: contextlib.nullcontext(None),
            "memory": lambda: contextlib.nullcontext("memory://"),
            "sqlite": lambda: _sqlite(workdir),
        }
        if args.postgres:
            configs["postgresql"] = lambda: _postgres(args.postgres)
        run_once(50, None)  # warm up imports and caches outside the measurements
        results: dict[str, Any] = {}
        for name, where in configs.items():
            try:
                results[name] = measure(args.size, args.repeat, where)
            except Exception as err:  # an unreachable server is reported, not fatal
                results[name] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
            print(json.dumps({name: results[name]}), file=sys.stderr)
        statements = count_sqlite_statements(args.size, workdir)

    for row in results.values():
        if "run_s" not in row:
            continue
        for base in ("none", "memory"):
            if "run_s" in results.get(base, {}):
                row[f"ratio_to_{base}"] = round(row["run_s"] / results[base]["run_s"], 2)
    sqlite_ratio = results.get("sqlite", {}).get("ratio_to_memory")
    print(json.dumps({
        "benchmark": "persistence",
        "flow": f"linear, {args.size} no-op tasks, serial engine",
        "repeat": args.repeat,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "results": results,
        "sqlite_statements": statements,
        "target": "sqlite run_s <= 3 x memory run_s",
        "target_met": None if sqlite_ratio is None else sqlite_ratio <= 3.0,
    }, indent=2))


if __name__ == "__main__":
    main()
