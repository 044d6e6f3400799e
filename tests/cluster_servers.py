"""The cluster suite's servers (``.ci/cluster.sh``): where they listen, who leads, killing one.

Three RabbitMQ nodes, Redis with a replica and three Sentinels, three ZooKeeper members, three
etcd members and MariaDB, all on 127.0.0.1 and on ports of their own (the shared single servers
of ``.ci/services.sh`` are never touched). ``make test-cluster`` starts them before and stops
them after the suite. A run by hand gets them from :func:`use` (the ``cluster`` fixture): every
test process that uses them is counted in :data:`USERS`, under the state dir, so that the
processes of one run (pytest-xdist workers) and concurrent runs see one another; the first to
find a member silent starts them, and :func:`release` (at the end of each process's session)
stops them once the last user leaves, if tests started them. A test that kills a member brings
its service back whole with :func:`restore` before it starts, not after: a member left down is
what the clients of the other tests fail over from anyway, and the end of the run stops
everything.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from servers import LocalServers

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "cluster.sh"
STATE = Path(os.environ.get("FLOWENGINE_CLUSTER_DIR", "/tmp/flowengine-cluster"))
#: What the script needs installed (Debian's packages).
PROGRAMS = ("rabbitmq-server", "redis-server", "redis-sentinel", "/usr/share/java/zookeeper.jar",
            "etcd", "mariadbd", "mariadb-install-db")
#: The one :class:`~servers.LocalServers` of the cluster script in this test process.
CLUSTER = LocalServers(script=SCRIPT, programs=PROGRAMS, timeout=420.0, patience=30.0)

NODES = (1, 2, 3)
RABBIT_PORTS = {n: 5680 + n for n in NODES}
REDIS_PORTS = (6391, 6392)
SENTINEL_PORTS = tuple(26390 + n for n in NODES)
MASTER_NAME = "fe-cluster"
ZOOKEEPER_PORTS = {n: 2190 + n for n in NODES}
ETCD_PORTS = {n: 2390 + n for n in NODES}
MARIADB_PORT = 3316
MARIADB_URL = f"mysql://flowengine:flowengine-secret@127.0.0.1:{MARIADB_PORT}"


def rabbit_urls(first: int = 1) -> str:
    """The nodes' AMQP URLs as one ``;`` failover list, node ``first`` first."""
    order = [first] + [n for n in NODES if n != first]
    return ";".join(f"amqp://guest:guest@127.0.0.1:{RABBIT_PORTS[n]}//" for n in order)


def sentinel_url() -> str:
    """Kombu's Sentinel URL: every Sentinel, ``;`` separated (master name: transport option)."""
    return ";".join(f"sentinel://127.0.0.1:{port}" for port in SENTINEL_PORTS)


def zookeeper_hosts() -> str:
    """The ensemble's connection string."""
    return ",".join(f"127.0.0.1:{ZOOKEEPER_PORTS[n]}" for n in NODES)


def etcd_hosts() -> str:
    """The etcd members as a board URI's host list."""
    return ",".join(f"127.0.0.1:{ETCD_PORTS[n]}" for n in NODES)


def answers(port: int) -> bool:
    """Whether something accepts connections on ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def problem() -> str | None:
    """Why the cluster is not usable (None: every member answers)."""
    ports = [*RABBIT_PORTS.values(), *REDIS_PORTS, *SENTINEL_PORTS, *ZOOKEEPER_PORTS.values(),
             *ETCD_PORTS.values(), MARIADB_PORT]
    silent = [port for port in ports if not answers(port)]
    return f"nothing answers on port(s) {silent}" if silent else None


def restore(*services: str) -> None:
    """Start whatever member of ``services`` (``rabbitmq``, ``redis``, ``zookeeper``, ``etcd``,
    ``mariadb``; none: all) is down, with the script's idempotent ``start``. With Redis, return
    once the master has its replica in sync again (a master that came back after a failover is
    made a replica by the Sentinels, and then copies the new master's data)."""
    done = subprocess.run(["bash", str(SCRIPT), "start", *services], capture_output=True,
                          text=True, timeout=420, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{SCRIPT} start failed: {done.stdout}{done.stderr}"
    if services and "redis" not in services:
        return
    deadline = time.monotonic() + 60.0
    while not _replica_in_sync():
        assert time.monotonic() < deadline, "the Redis replica did not come back in sync"
        time.sleep(0.2)  # the Sentinels and the servers get there on their own


def _replica_in_sync() -> bool:
    try:
        info = _redis_command(redis_master_port(), "INFO", "replication")
    except (OSError, AssertionError):
        return False
    assert isinstance(info, dict), info
    replica = info.get("slave0")
    return isinstance(replica, dict) and replica.get("state") == "online"


# ---- who uses the cluster, and who stops it ---------------------------------------------------


def process_identity(pid: int) -> str | None:
    """What tells process ``pid`` from a later one of the same number (its start time, in clock
    ticks since boot); None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from its end.
    return stat[stat.rindex(")") + 2:].split()[19]


class ClusterUsers:
    """The test processes that use the cluster now, and whether tests started it.

    One file per user under ``folder/users`` (named after its pid, holding its
    :func:`process_identity`), a ``started-by-tests`` marker, and a lock that every change takes,
    so that all the processes of a run (pytest-xdist workers) and concurrent runs share one
    count. A user that died without leaving (a crashed worker) counts no more.

    Args:
        folder: The cluster's state dir.
        identity: :func:`process_identity`, or a stand-in in tests.
        pid: This process's id.
    """

    def __init__(self, folder: Path, identity: Callable[[int], str | None] = process_identity,
                 pid: int | None = None) -> None:
        self.folder, self.identity = folder, identity
        self.pid = os.getpid() if pid is None else pid
        self.users, self.marker = folder / "users", folder / "started-by-tests"
        self.joined = False

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the lock on the count (waits while another process holds it)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / "users.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def join(self) -> None:
        """Count this process as a user (lock held)."""
        self.users.mkdir(parents=True, exist_ok=True)
        (self.users / str(self.pid)).write_text(self.identity(self.pid) or "")
        self.joined = True

    def mark_started(self) -> None:
        """Record that tests start the cluster, so that its last user stops it (lock held)."""
        self.marker.touch()

    def live(self) -> list[int]:
        """The users still running; the files of those that died are removed (lock held)."""
        found = []
        for entry in sorted(self.users.glob("*")) if self.users.is_dir() else ():
            identity = entry.read_text()
            if identity and self.identity(int(entry.name)) == identity:
                found.append(int(entry.name))
            else:
                entry.unlink()
        return found

    def leave(self) -> bool:
        """Count this process no more; whether it must now stop the cluster: tests started it
        and no user is left (lock held; call :meth:`stopped` once it is)."""
        (self.users / str(self.pid)).unlink(missing_ok=True)
        self.joined = False
        return self.marker.exists() and not self.live()

    def stopped(self) -> None:
        """Forget that tests started the cluster (lock held)."""
        self.marker.unlink(missing_ok=True)


#: The users of the cluster under :data:`STATE`, as this process sees them.
USERS = ClusterUsers(STATE)


@contextlib.contextmanager
def _test_clock_paused() -> Iterator[None]:
    # pytest-timeout (signal method) arms SIGALRM for the test whose setup brings the cluster
    # up. Starting it, or waiting for another process that does, may take minutes; an alarm in
    # the middle killed the script and left half a cluster with no session to stop it. The test
    # gets the time it had left afterwards.
    left, interval = signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        yield
    finally:
        if left:
            signal.setitimer(signal.ITIMER_REAL, left, interval)


def use() -> None:
    """Go on once every member answers, starting the cluster if one does not, and count this
    process as a user until :func:`release`; fail (``CI=true``) or skip the test otherwise."""
    with _test_clock_paused():
        with USERS.locked():
            USERS.join()
            if problem() is not None and not CLUSTER.missing():
                USERS.mark_started()
        # Outside the lock: the script runs one at a time by itself, and a user that leaves
        # meanwhile need not wait for a start.
        CLUSTER.require("The cluster suite's servers (.ci/cluster.sh)", problem)


def release() -> None:
    """This process's session is over: it uses the cluster no more, and if it was the last
    user of a cluster that tests started, it stops the cluster. So a run by hand leaves nothing
    behind, and never stops what another process still uses. Nothing to do where no test
    process ever marked the cluster as started by tests."""
    if not USERS.joined and not USERS.marker.exists():
        return
    with USERS.locked():
        if USERS.leave():
            # Under the lock: no process may join a cluster that is going away.
            subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=300,
                           stdin=subprocess.DEVNULL)
            USERS.stopped()


# ---- who leads, and taking a member away ---------------------------------------------------


def _pid(path: Path) -> int:
    return int(path.read_text().split()[0])


def kill_rabbit(n: int) -> None:
    """``kill -9`` RabbitMQ node ``n`` (its Erlang VM)."""
    os.kill(_pid(STATE / "rabbitmq" / f"fe-c{n}.pid"), 9)
    _wait_closed(RABBIT_PORTS[n])


def rabbit_queue_types(prefix: str, node: int = 2) -> dict[str, str]:
    """Queue name -> type (``quorum``, ``classic``) of the queues named ``prefix*``, as node
    ``node`` tells (``rabbitmqctl list_queues``)."""
    env = {**os.environ, "RABBITMQ_CTL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
           "ERL_EPMD_ADDRESS": "127.0.0.1"}
    done = subprocess.run(["rabbitmqctl", "-n", f"fe-c{node}@localhost", "-q", "list_queues",
                           "name", "type", "--no-table-headers"], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    found = (line.split("\t") for line in done.stdout.splitlines() if "\t" in line)
    return {name: kind for name, kind in found if name.startswith(prefix)}


def _wait_closed(port: int, patience: float = 30.0) -> None:
    deadline = time.monotonic() + patience
    while answers(port):
        assert time.monotonic() < deadline, f"port {port} still answers"
        time.sleep(0.05)  # another process lets go of it: nothing to wait on


def redis_master_port() -> int:
    """The port of the master the Sentinels name now."""
    for port in SENTINEL_PORTS:
        try:
            reply = _redis_command(port, "SENTINEL", "get-master-addr-by-name", MASTER_NAME)
        except OSError:
            continue
        return int(reply[1])
    raise AssertionError("no Sentinel answered")


def kill_redis(port: int) -> None:
    """``kill -9`` the Redis server on ``port`` (found through its own INFO)."""
    info = _redis_command(port, "INFO", "server")
    assert isinstance(info, dict), info
    os.kill(int(info["process_id"]), 9)
    _wait_closed(port)


def _redis_command(port: int, *words: str) -> object:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=3, decode_responses=True)
    try:
        return client.execute_command(*words)
    except redis.ConnectionError as err:
        raise OSError(str(err)) from err
    finally:
        client.close()


def zookeeper_leader() -> int:
    """The number of the ZooKeeper member that leads now."""
    for n, port in ZOOKEEPER_PORTS.items():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
                conn.sendall(b"srvr")
                text = conn.makefile("rb").read().decode()
        except OSError:
            continue
        if "Mode: leader" in text:
            return n
    raise AssertionError("no ZooKeeper member says it leads")


def kill_zookeeper(n: int) -> None:
    """``kill -9`` ZooKeeper member ``n``."""
    os.kill(_pid(STATE / "zookeeper" / f"zk{n}" / "pid"), 9)
    _wait_closed(ZOOKEEPER_PORTS[n])


def _etcd_status(port: int) -> dict[str, object]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v3/maintenance/status",
                                     data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=3) as answer:
        found: dict[str, object] = json.loads(answer.read())
        return found


def etcd_leader() -> int:
    """The number of the etcd member that leads now."""
    statuses = {}
    for n, port in ETCD_PORTS.items():
        try:
            statuses[n] = _etcd_status(port)
        except OSError:
            continue
    for n, status in statuses.items():
        header = status["header"]
        assert isinstance(header, dict)
        if header["member_id"] == status["leader"]:
            return n
    raise AssertionError(f"no etcd member leads: {statuses}")


def kill_etcd(n: int) -> None:
    """``kill -9`` etcd member ``n``."""
    os.kill(_pid(STATE / "etcd" / f"fe-e{n}.pid"), 9)
    _wait_closed(ETCD_PORTS[n])


def mariadb_pid() -> int:
    """The MariaDB server's process id."""
    return _pid(STATE / "mariadb" / "mariadb.pid")


@contextlib.contextmanager
def mariadb_restarted() -> Iterator[None]:
    """MariaDB is down inside the block (a fast shutdown: clients are cut) and started again
    when it ends; the restart's length is reported."""
    os.kill(mariadb_pid(), 15)
    _wait_closed(MARIADB_PORT, patience=60.0)
    try:
        yield
    finally:
        began = time.monotonic()
        restore("mariadb")
        report("mariadb restart (server back)", time.monotonic() - began)


#: Where measured recovery times go (one JSON object a line), besides the test's output.
RECOVERY_LOG = Path(os.environ.get("FLOWENGINE_RECOVERY_LOG",
                                   str(STATE / "recovery-times.jsonl")))


def report(what: str, seconds: float, **details: object) -> None:
    """Record a measured recovery time (printed, and appended to :data:`RECOVERY_LOG`, which
    ``benchmarks/cluster_recovery.py`` reads)."""
    line = {"what": what, "seconds": round(seconds, 3), **details}
    print(f"recovery: {json.dumps(line)}")
    RECOVERY_LOG.parent.mkdir(parents=True, exist_ok=True)
    with RECOVERY_LOG.open("a") as out:
        out.write(json.dumps(line) + "\n")
