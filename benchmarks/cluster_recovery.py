"""How long flowengine takes to recover when a member of a clustered server dies.

Runs the cluster suite's fault tests (real worker, engine and conductor processes on the servers of
``.ci/cluster.sh``; it starts them first and stops them after if it started them) ``--repeat``
times, each writing what it measured (see ``tests/cluster_servers.py``'s ``report``), and prints
one JSON document: for each measurement, the seconds of every run, their median and maximum.

- RabbitMQ: a node every worker and engine is connected to is killed with SIGKILL mid-flow; from
  the kill to the first task of the flows' next step (their gated tasks end meanwhile).
- Redis Sentinel: the master is killed mid-flow; until the Sentinels promote the replica, and
  until the flows' next task starts.
- ZooKeeper, etcd, Redis Sentinel jobboards: the leader (master) is killed while a conductor
  runs a job's step; from the kill until a client of the board sees the job done.
- MariaDB: the server is stopped while ``flowengine run`` runs a step; how long the restart
  takes (the run halts with exit code 6 meanwhile and ``--resume`` finishes it).

Example::

    python benchmarks/cluster_recovery.py --repeat 3 > benchmarks/results/cluster_recovery.json

Measured (three runs on a two-core machine shared with other test runs; median / max seconds):
RabbitMQ node kill 2.0 / 13.8 (a lease of 5 s lapsed once), Sentinel promotion 2.2 / 2.4 and
the flows' next task 6.3 / 6.3, ZooKeeper leader 0.6 / 0.9, etcd leader 1.2 / 1.5, Redis board
master 2.8 / 2.8, MariaDB restart 2.9 / 4.2. doc/deployment.rst explains them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "cluster.sh"
TESTS = ["tests/integration/test_cluster_rabbitmq.py", "tests/integration/test_cluster_sentinel.py",
         "tests/jobs/test_cluster_coordination.py", "tests/integration/test_lost_database.py"]


def _cluster_up() -> bool:
    done = subprocess.run([sys.executable, "-c", "import cluster_servers as cs; "
                           "raise SystemExit(cs.problem() is not None)"],
                          cwd=ROOT / "tests", capture_output=True)
    return done.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of the fault tests")
    args = parser.parse_args()
    started_here = not _cluster_up()
    if started_here:
        subprocess.run(["bash", str(SCRIPT), "start"], check=True, stdout=sys.stderr)
    log = Path(tempfile.mkdtemp(prefix="cluster-recovery-")) / "recovery.jsonl"
    env = {**os.environ, "CI": "true", "FLOWENGINE_RECOVERY_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    began = time.monotonic()
    try:
        for run in range(args.repeat):
            print(f"== run {run + 1} of {args.repeat}", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-m", "cluster", "-k", "not test_quorum and not priority", *TESTS],
                           cwd=ROOT, env=env, check=True, stdout=sys.stderr)
    finally:
        if started_here:
            subprocess.run(["bash", str(SCRIPT), "stop"], stdout=sys.stderr)
    seconds: dict[str, list[float]] = defaultdict(list)
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        seconds[entry["what"]].append(entry["seconds"])
    print(json.dumps({
        "benchmark": "cluster_recovery",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "runs": args.repeat,
        "wall_s": round(time.monotonic() - began, 1),
        "results": {what: {"seconds": values, "median_s": round(statistics.median(values), 3),
                           "max_s": max(values)} for what, values in sorted(seconds.items())},
    }, indent=2))


if __name__ == "__main__":
    main()
