"""Run the interop order flow on a worker-based engine of TaskFlow or flowengine; print JSON.

    python interop_engine.py {taskflow|flowengine} URL EXCHANGE TOPIC

Runs the flow twice: once to success, once with ``Ship`` failing so the flow reverts. Prints
one JSON document: for each run the final flow state, the results stored, each atom's state,
the progress ``reserve`` reported, and what ``run()`` raised (type names and messages of the
failures it carried). The library is chosen before ``interop_tasks`` is imported, so this
process's tasks have that library's base class.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

TRANSITION_TIMEOUT = 20


def main(library: str, url: str, exchange: str, topic: str) -> dict[str, Any]:
    os.environ["INTEROP_TASK_LIBRARY"] = library
    import interop_tasks as it

    if library == "taskflow":
        from taskflow import engines

        if url.startswith("beanstalk://"):  # kombu has none: flowengine's registers it
            import flowengine.worker_based.broker.transport_beanstalk  # noqa: F401
        from taskflow.patterns import linear_flow as lf

        options: dict[str, Any] = {}
    else:
        from flowengine import engines  # type: ignore[no-redef]
        from flowengine.flows import linear_flow as lf  # type: ignore[no-redef]

        options = {"taskflow_compat": True}

    def run(fail: bool) -> dict[str, Any]:
        reserve = it.Reserve("reserve", provides="reservation")
        heard: list[float] = []
        reserve.notifier.register("update_progress",
                                  lambda _event, details: heard.append(details["progress"]))
        flow = lf.Flow("order").add(reserve, it.Charge("charge", provides="receipt"),
                                    it.Ship("ship", provides="tracking"))
        engine = engines.load(
            flow, store={"item": "widget", "quantity": 2, "price": 9.99, "fail": fail},
            engine="worker-based", url=url, exchange=exchange, topics=[topic],
            transition_timeout=TRANSITION_TIMEOUT, **options,
        )  # fmt: skip
        raised: dict[str, Any] | None = None
        try:
            engine.run()
        except Exception as err:
            # Both libraries raise WrappedFailure, iterable over the failures, for remote ones.
            carried = list(err) if type(err).__name__ == "WrappedFailure" else []  # type: ignore
            raised = {"type": type(err).__name__, "message": str(err),
                      "failures": [{"message": f.exception_str, "types": list(f)}
                                   for f in carried]}
        storage = engine.storage
        return {
            "state": storage.get_flow_state(),
            "results": {name: storage.get(name) for name in ("reserve", "charge", "ship")
                        if storage.get_atom_state(name) == "SUCCESS"},
            "atoms": {name: storage.get_atom_state(name) for name in ("reserve", "charge", "ship")},
            "progress": heard,
            "raised": raised,
        }

    return {"library": library, "success": run(fail=False), "failure": run(fail=True)}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5]), default=repr))
