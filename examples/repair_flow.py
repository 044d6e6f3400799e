"""Repairing a flow a failed revert left behind, instead of editing the database by hand.

Creating a server reserves an IP address, creates the server, then configures it; configuring
fails, so the engine reverts. But releasing the IP address fails too (its API is down, which a
"fault" file stands for here): the flow ends FAILURE, with the address still reserved. That is
the resource stuck in ERROR that operators otherwise fix in the database.

Once the API is back, ``repair.retry_reverts`` runs the failed revert again (with what its
execute returned), then the remaining reverts in order, and the flow ends REVERTED with the
repair recorded. A second flow left in the same state is repaired the other way: an operator
who released the address by hand vouches for it (``mark_reverted``). ``flowengine repair`` does
both from a shell.

Run: python examples/repair_flow.py
"""

import contextlib
import os
import pathlib
import tempfile
from typing import Any

from flowengine import engines, task
from flowengine.engines import repair
from flowengine.flows import linear_flow
from flowengine.persistence import backends, models


class ReserveAddress(task.Task):
    def execute(self, fault: str) -> str:
        print("reserve_address: reserved 10.0.0.7")
        return "10.0.0.7"

    def revert(self, result: Any, fault: str, **kwargs: Any) -> None:
        if os.path.exists(fault):
            print(f"revert reserve_address: cannot release {result}: the IP API is down")
            raise ConnectionError(f"cannot release {result}: the IP API is down")
        print(f"revert reserve_address: released {result}")


class CreateServer(task.Task):
    def execute(self) -> str:
        print("create_server: created server-7")
        return "server-7"

    def revert(self, result: Any, **kwargs: Any) -> None:
        print(f"revert create_server: deleted {result}")


class Configure(task.Task):
    def execute(self) -> None:
        print("configure: failed")
        raise RuntimeError("the configuration service refused server-7")


def make_server(fault: str) -> linear_flow.Flow:
    return linear_flow.Flow("make-server").add(
        CreateServer("create_server"), ReserveAddress("reserve_address", inject={"fault": fault}),
        Configure("configure"))


def stuck(backend: Any, fault: str) -> str:
    """Run the flow while the IP API is down; return its uuid (it ends FAILURE)."""
    engine = engines.load(make_server(fault), backend=backend, book=models.LogBook("servers"))
    with contextlib.suppress(Exception):
        engine.run()
    print(f"flow state: {engine.storage.get_flow_state()}; reserve_address is "
          f"{engine.storage.get_atom_state('reserve_address')}")
    return str(engine.storage.flow_uuid)


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        fault = pathlib.Path(folder, "ip-api-down")
        fault.touch()
        with backends.backend(f"sqlite:///{folder}/flows.db") as backend:
            first = stuck(backend, str(fault))
            fault.unlink()
            print("-- the IP API is back: retry the failed revert")
            engine = repair.retry_reverts(backend, first, reason="IP API restored",
                                          by="ops", flow=make_server(str(fault)))
            [done] = engine.storage.flow_meta[repair.META_REPAIRS]
            print(f"flow state: {engine.storage.get_flow_state()}; repaired: {done['action']} "
                  f"by {done['by']} ({done['reason']}), atoms {done['atoms']}")

            fault.touch()
            second = stuck(backend, str(fault))
            print("-- the address was released by hand: say so")
            engine = repair.mark_reverted(backend, second, "reserve_address",
                                          reason="released in the IPAM console", by="ops",
                                          flow=make_server(str(fault)))
            print(f"flow state: {engine.storage.get_flow_state()}; reserve_address is "
                  f"{engine.storage.get_atom_state('reserve_address')}")


if __name__ == "__main__":
    main()
