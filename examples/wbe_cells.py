"""Topics partition workers: each cell's flows run on that cell's workers only.

A service runs one worker per cell on one exchange (here in threads of this process, on kombu's
in-memory transport; between machines it would be RabbitMQ or Redis). Every flowengine worker
announces itself to every engine on the exchange, so the engine of cell 1 hears of the cell 2
worker too; it sends work only to the topics it lists, as TaskFlow does, so each volume is made
in its own cell. Where each task ran is read from what the engine stored (``flowengine show``
lists the same).

Run: python examples/wbe_cells.py
"""

from __future__ import annotations

import threading
from collections import Counter

import wbe_tasks

from flowengine import engines
from flowengine.flows import unordered_flow
from flowengine.worker_based.worker import Worker

EXCHANGE = "wbe-cells"
TRANSPORT = "memory"
CELLS = ("cell1", "cell2")
VOLUMES = 6


def build_flow(cell: str) -> unordered_flow.Flow:
    return unordered_flow.Flow(f"volumes-{cell}").add(*[
        wbe_tasks.ProvisionVolume(f"{cell}-vol-{i}", inject={"volume": f"{cell}-vol-{i}"})
        for i in range(VOLUMES)])


def main() -> None:
    workers = {cell: Worker(exchange=EXCHANGE, topic=cell, tasks=[wbe_tasks.ProvisionVolume],
                            threads_count=2, transport=TRANSPORT, events=False)
               for cell in CELLS}
    threads = [threading.Thread(target=w.run, kwargs={"display_banner": False}, daemon=True)
               for w in workers.values()]
    for thread in threads:
        thread.start()
    try:
        for cell, worker in workers.items():
            if not worker.wait(timeout=10):
                raise RuntimeError(f"the {cell} worker did not start consuming within 10s")
        cell_of = {worker.worker_id: cell for cell, worker in workers.items()}
        for cell in CELLS:
            engine = engines.load(build_flow(cell), engine="worker-based", exchange=EXCHANGE,
                                  topics=[cell], transport=TRANSPORT)
            engine.run()
            ran_in = Counter(
                cell_of.get(engine.storage.flow_detail.find(atom_uuid).meta.get("worker"), "?")
                for atom_uuid in (engine.storage.get_atom_uuid(f"{cell}-vol-{i}")
                                  for i in range(VOLUMES)))
            print(f"engine of {cell}: {engine.storage.get_flow_state()}, tasks run in "
                  + ", ".join(f"{where}={ran_in[where]}" for where in CELLS))
    finally:
        for worker in workers.values():
            worker.stop(grace=5)
        for thread in threads:
            thread.join(timeout=10)


if __name__ == "__main__":
    main()
