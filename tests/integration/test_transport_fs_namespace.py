"""A flowengine-fs data folder serves one PID namespace at a time (containers sharing a volume).

flowengine-fs tells processes apart by their pid, which processes of two PID namespaces may
share: a connection from another namespace than the folder's live processes is refused with an
error that says why and what to do; once those processes are gone, the folder is the new
namespace's. Driven with ``Membership``'s namespace given, and with a real process in a new PID
namespace (``unshare``, which needs root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import kombu
import pytest
from servers import unavailable

from flowengine.worker_based.broker import transport_fs_namespace as pidns

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: Connects to the folder given and prints ``connected``; the error's message otherwise.
CONNECT = """
import sys, kombu
import flowengine.worker_based.broker.transport_fs  # registers the transport's name
conn = kombu.Connection("flowengine-fs://", transport_options={"data_folder": sys.argv[1]})
try:
    conn.connect()
    print("connected")
except Exception as err:
    print(f"{type(err).__name__}: {err}")
finally:
    conn.release()
"""


def test_a_namespace_is_refused_while_another_ones_processes_use_the_folder(
        tmp_path: Path) -> None:
    first = pidns.Membership(str(tmp_path), namespace="111")
    also_first = pidns.Membership(str(tmp_path), namespace="111")  # its own: welcome
    with pytest.raises(pidns.ForeignNamespace, match=str(tmp_path)) as refused:
        pidns.Membership(str(tmp_path), namespace="222")
    assert "--pid=host" in str(refused.value) and "own data_folder" in str(refused.value)
    first.close()
    with pytest.raises(pidns.ForeignNamespace):  # one of its connections is still open
        pidns.Membership(str(tmp_path), namespace="222")
    also_first.close()
    second = pidns.Membership(str(tmp_path), namespace="222")  # theirs are all gone
    assert sorted(os.listdir(tmp_path / pidns.FOLDER)) == ["222.lock"]
    second.close()


def _unshare() -> list[str]:
    command = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
    if shutil.which("unshare") is None or subprocess.run(
            [*command, "true"], capture_output=True, timeout=30).returncode != 0:
        unavailable("unshare cannot make a PID namespace here (it needs root)")
    return command


def _connect_elsewhere(command: list[str], folder: Path) -> str:
    done = subprocess.run([*command, sys.executable, "-c", CONNECT, str(folder)],
                          capture_output=True, text=True, timeout=60, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_process_of_another_pid_namespace_is_refused_until_the_folders_processes_end(
        tmp_path: Path) -> None:
    command = _unshare()
    here = kombu.Connection("flowengine-fs://", transport_options={"data_folder": str(tmp_path)})
    here.connect()
    try:
        said = _connect_elsewhere(command, tmp_path)
        assert said.startswith("ForeignNamespace: flowengine-fs data folder "
                               f"{tmp_path} is in use by processes of another PID namespace"), said
    finally:
        here.release()
    assert _connect_elsewhere(command, tmp_path) == "connected"


# ---- a pid used again ---------------------------------------------------------------------------

#: Takes one message off queue ``work`` without acknowledging it, says so, and waits to be killed.
TAKE_AND_HANG = """
import sys, threading, kombu
import flowengine.worker_based.broker.transport_fs  # registers the transport's name
with kombu.Connection("flowengine-fs://", transport_options={"data_folder": sys.argv[1]}) as conn:
    message = conn.SimpleQueue("work").get(timeout=30)
    print(f"took {message.payload}", flush=True)
    threading.Event().wait()
"""


def _publish(folder: Path, payload: str) -> None:
    with kombu.Connection("flowengine-fs://",
                          transport_options={"data_folder": str(folder)}) as conn:
        conn.SimpleQueue("work").put(payload)


def _take_one(folder: Path) -> tuple[str, bool]:
    with kombu.Connection("flowengine-fs://",
                          transport_options={"data_folder": str(folder)}) as conn:
        message = conn.SimpleQueue("work").get(timeout=10)
        message.ack()
        return message.payload, message.delivery_info.get("redelivered", False)


def test_a_message_an_earlier_process_with_this_pid_took_is_delivered_again(
        tmp_path: Path) -> None:
    # What a process killed while holding a message leaves, where this process's pid is its.
    _publish(tmp_path, "left-behind")
    queue = tmp_path / "queues" / "work"
    [name] = os.listdir(queue)
    mine = tmp_path / "claimed" / str(os.getpid()) / "work"
    mine.mkdir(parents=True)
    os.rename(queue / name, mine / name)
    assert _take_one(tmp_path) == ("left-behind", True)
    assert not list(mine.glob("*.msg"))  # settled: nothing is held any more


def test_a_restarted_container_gets_the_message_its_killed_predecessor_held(
        tmp_path: Path) -> None:
    # Both "containers" run their process as pid 1 of a PID namespace of their own.
    command = _unshare()
    _publish(tmp_path, "in-flight")
    holder = subprocess.Popen([*command, sys.executable, "-c", TAKE_AND_HANG, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, cwd=REPO,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "took in-flight"
        assert os.listdir(tmp_path / "claimed") == ["1"]
    finally:
        holder.kill()  # unshare's forked child, pid 1 of its namespace, dies with it
        holder.wait(30)
    successor = subprocess.run(
        [*command, sys.executable, "-c", TAKE_AND_HANG.replace(
            "threading.Event().wait()", "message.ack()"), str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert successor.stdout.strip() == "took in-flight", successor.stderr
    assert "an earlier process with pid 1 ended holding 1 unsettled message" in successor.stderr


def test_a_folder_reached_through_a_symbolic_link_too_keeps_this_process_s_claims(
        tmp_path: Path) -> None:
    folder, link = tmp_path / "queues", tmp_path / "link"
    folder.mkdir()
    link.symlink_to(folder)
    _publish(folder, "held")
    with kombu.Connection("flowengine-fs://",
                          transport_options={"data_folder": str(link)}) as holder:
        message = holder.SimpleQueue("work").get(timeout=10)  # held, not acknowledged
        # The same folder under its own name, first used by this process now: what the
        # other spelling holds is this process's, not an earlier one's.
        _publish(folder, "next")
        assert _take_one(folder) == ("next", False)
        message.ack()
    assert not list((folder / "claimed").glob("*/work/*.msg"))
