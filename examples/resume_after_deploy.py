"""Resuming a stored flow after a deploy changed its code: refused with the difference, until
a migration says how to go on.

An order flow (reserve, then ship) is stored with its factory in SQLite and interrupted after
``reserve``. Then the code is "deployed" again, and the flow factory now has a ``charge`` step
between the two. Resuming the stored flow with the new code is refused, naming the atom the code
gained, before anything is written; ``flowengine check --backend`` reports it too. Once a
migration is registered for the flow (here: accept the new shape, so ``charge`` runs when its
turn comes), the flow resumes and runs ``charge`` and ``ship``, not ``reserve`` again.

Run: python examples/resume_after_deploy.py
"""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from flowengine import engines, migrations, states, task
from flowengine.flows import linear_flow
from flowengine.persistence import backends, models

#: Which code is deployed: "v1" (reserve, ship) or "v2" (reserve, charge, ship).
CODE = "ORDER_CODE"


class Step(task.Task):
    """One step of an order; prints that it ran."""

    def execute(self) -> None:
        print(f"  {self.name} ran")


def make_order() -> linear_flow.Flow:
    """The flow factory, as the deployed code builds it (stored by name with the flow)."""
    names = ["reserve", "charge", "ship"] if os.environ.get(CODE) == "v2" else ["reserve", "ship"]
    return linear_flow.Flow("order").add(*(Step(name) for name in names))


def stored_flow(backend: object) -> models.FlowDetail:
    with contextlib.closing(backend.get_connection()) as conn:
        [book] = list(conn.get_logbooks())
        return next(iter(book))


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="flowengine-deploy-"))
    uri = f"sqlite:///{folder / 'orders.db'}"
    backend = backends.fetch(uri)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
    os.environ[CODE] = "v1"
    print("code v1 runs the order flow, interrupted after reserve:")
    engine = engines.load_from_factory("resume_after_deploy.make_order",
                                       book=models.LogBook("orders"), backend=backend)
    for _state in engine.run_iter():
        if engine.storage.get_atom_state("reserve") == states.SUCCESS:
            engine.suspend()
    print(f"flow {engine.storage.get_flow_state()}")

    os.environ[CODE] = "v2"  # the deploy: the factory now has a charge step
    print("code v2 resumes it:")
    try:
        engines.load_from_detail(stored_flow(backend), backend=backend).run()
    except migrations.FlowShapeChanged as err:
        print(f"refused: {str(err).splitlines()[1].strip()}")
    check = subprocess.run([sys.executable, "-m", "flowengine.cli.main", "check", "--backend",
                            uri], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])})
    print(f"$ flowengine check --backend ... -> exit {check.returncode}")
    print(check.stdout.strip())

    migrations.register_migration("resume_after_deploy.make_order")
    print("with a migration registered for it:")
    engine = engines.load_from_detail(stored_flow(backend), backend=backend)
    engine.run()
    print(f"flow {engine.storage.get_flow_state()}")
    backend.close()
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
