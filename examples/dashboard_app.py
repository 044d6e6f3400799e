"""The dashboard on a store of flows: one that succeeded, one that failed and was reverted.

Stores both flows in a SQLite file (with their factory, so the dashboard can draw their graphs,
and with a timing listener, so it can draw their timelines), serves ``flowengine dashboard``'s
application with uvicorn on a free local port, and reads the pages as a browser would. Drawing a
graph imports and calls the flow's stored factory, so the dashboard is told which module's
factories it may use: this script's own (``flowengine dashboard --allow-factories MODULE``).

Run: python examples/dashboard_app.py           (reads the pages, then exits)
     python examples/dashboard_app.py --serve   (keeps serving: open the printed address)
"""

from __future__ import annotations

import contextlib
import re
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import uvicorn

from flowengine import engines, exceptions, task
from flowengine.dashboard import DashboardData, EventHub, create_app
from flowengine.engines.factory_policy import FactoryPolicy
from flowengine.flows import linear_flow
from flowengine.persistence import backends


class Reserve(task.Task):
    secret_args = ("card",)  # shown as *** wherever it appears

    def execute(self, item: str, card: str) -> str:
        return f"reservation-{item}"

    def revert(self, item: str, card: str, **_kwargs: object) -> None:
        print(f"revert reserve: released {item}")


class Charge(task.Task):
    def execute(self, reservation: str, amount: int) -> str:
        if amount > 100:
            raise RuntimeError(f"card declined for {amount}")
        return f"charged {amount} for {reservation}"


def order() -> linear_flow.Flow:
    return linear_flow.Flow("order").add(Reserve("reserve", provides="reservation"),
                                          Charge("charge"))


def store_order(backend: backends.base.Backend, amount: int) -> str:
    store = {"item": "book", "card": "4111-1111-1111-1111", "amount": amount}
    engine = engines.load_from_factory(order, store=store, backend=backend)
    # The engine stores when each atom ran, which the dashboard's timeline draws.
    with contextlib.suppress(exceptions.WrappedFailure, RuntimeError):
        engine.run()
    print(f"stored flow {engine.storage.flow_uuid}: {engine.storage.get_flow_state()}")
    return str(engine.storage.flow_uuid)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def main(serve: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        backend = backends.fetch(f"sqlite:///{Path(tmp) / 'flows.db'}")
        with contextlib.closing(backend.get_connection()) as conn:
            conn.upgrade()
        store_order(backend, 40)
        failed = store_order(backend, 400)
        # No broker here (EventHub(None)): history from the store only, nothing live.
        app = create_app(DashboardData(backend, EventHub(None),
                                       factories=FactoryPolicy.from_names("__main__")))
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               access_log=False, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        print(f"dashboard: {url}/flows")
        try:
            flows = read(f"{url}/flows")
            listed = re.findall(r'href="/flows/', flows)
            print(f"flows page lists {len(listed)} flows")
            page = read(f"{url}/flows/{failed}")
            states = dict(re.findall(r'data-atom="([^"]+)" data-state="([^"]+)"', page))
            shown = ", ".join(f"{name}={state}" for name, state in sorted(states.items()))
            print(f"failed flow's atoms: {shown}")
            links = page.count('class="link"')
            print(f"graph links drawn: {links}")
            print(f"failure shown: {'card declined for 400' in page}")
            print(f"card number shown: {'4111-1111-1111-1111' in page}")
            if serve:
                print("serving until Ctrl-C")
                thread.join()
        except KeyboardInterrupt:
            pass
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            backend.close()


if __name__ == "__main__":
    main(serve="--serve" in sys.argv[1:])
