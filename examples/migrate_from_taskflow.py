"""Move a service from TaskFlow to flowengine while one of its flows is half done.

It needs TaskFlow installed beside flowengine (``pip install taskflow``), as a service being
migrated has. The script plays the three steps of the move (see doc/migration.rst):

1. The TaskFlow service: a copy of this script, started with ``EXAMPLE_LIBRARY=taskflow`` so
   that its imports are TaskFlow's, runs a provisioning flow on a TaskFlow engine with a SQLite
   store. While the third task runs the process is SIGKILLed, as a crash or a hard stop does:
   the flow stays RUNNING in TaskFlow's store, two tasks done, one started.
2. The operator copies TaskFlow's store into a flowengine store with
   ``flowengine db import-taskflow`` (TaskFlow's store is only read).
3. The flowengine service (the same code, its imports renamed) finds the flows in flight in the
   copy and resumes them. The tasks that finished under TaskFlow do not run again: their results,
   stored by TaskFlow, feed the tasks that run now.

Run: python examples/migrate_from_taskflow.py
"""

import os
import signal
import subprocess
import sys
import tempfile

LIBRARY = os.environ.get("EXAMPLE_LIBRARY", "flowengine")
if LIBRARY == "taskflow":
    from taskflow import engines, task
    from taskflow.patterns import linear_flow
    from taskflow.persistence import backends, models
else:  # the migration: these imports renamed, nothing else
    from flowengine import engines, task
    from flowengine.flows import linear_flow
    from flowengine.persistence import backends, models

BOOK = "provisioning"
#: What ran in this process, in order.
RAN: list[str] = []


def ran(name: str) -> None:
    RAN.append(name)
    print(f"{LIBRARY}: {name} ran", flush=True)


class CreateNetwork(task.Task):
    default_provides = "network"

    def execute(self, tenant):
        ran(self.name)
        return f"net-{tenant}"


class CreateVolume(task.Task):
    default_provides = "volume"

    def execute(self, tenant):
        ran(self.name)
        return f"vol-{tenant}"


class BootServer(task.Task):
    default_provides = "server"

    def execute(self, tenant, network, volume):
        if LIBRARY == "taskflow":
            print("taskflow: boot_server starts, and the TaskFlow service is killed", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        ran(self.name)
        return f"srv-{tenant} ({network}, {volume})"


class AttachAddress(task.Task):
    default_provides = "address"

    def execute(self, server):
        ran(self.name)
        return f"203.0.113.7 -> {server}"


def make_flow():
    return linear_flow.Flow("provision").add(
        CreateNetwork("create_network"), CreateVolume("create_volume"),
        BootServer("boot_server"), AttachAddress("attach_address"))


def taskflow_service(url):
    """Step 1, in the TaskFlow process: run the flow until the process is killed."""
    backend = backends.fetch({"connection": url})
    conn = backend.get_connection()
    conn.upgrade()
    book = models.LogBook("provisioning", uuid=BOOK)
    conn.save_logbook(book)
    engines.load(make_flow(), book=book, backend=backend, store={"tenant": "7"}).run()


def flowengine_service(url):
    """Step 3: resume every flow of the logbook that is still in flight."""
    with backends.backend(url) as backend:
        book = backend.get_connection().get_logbook(BOOK)
        for flow_detail in book:
            if flow_detail.state in ("SUCCESS", "REVERTED", "FAILURE"):
                continue
            print(f"flow {flow_detail.name} is {flow_detail.state} in the copy; resuming it")
            engine = engines.load(make_flow(), flow_detail=flow_detail, book=book,
                                  backend=backend)
            engine.run()
            print(f"flow {engine.storage.get_flow_state()}: "
                  f"{engine.storage.fetch('address')}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, EXAMPLE_LIBRARY="taskflow")
        child = subprocess.run([sys.executable, __file__, "sqlite:///taskflow.db"],
                               cwd=tmp, env=env)
        print(f"the TaskFlow service died (exit code {child.returncode})")

        command = ["db", "import-taskflow", "--from", "sqlite:///taskflow.db",
                   "--backend", "sqlite:///flowengine.db"]
        print("$ flowengine " + " ".join(command), flush=True)
        subprocess.run([sys.executable, "-m", "flowengine.cli.main", *command], cwd=tmp,
                       check=True)

        os.chdir(tmp)
        flowengine_service("sqlite:///flowengine.db")
        print(f"ran under flowengine: {', '.join(RAN)}")


if __name__ == "__main__":
    if LIBRARY == "taskflow":
        taskflow_service(sys.argv[1])
    else:
        main()
