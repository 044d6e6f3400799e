"""Signed messages: an engine and a worker sharing a key, and an engine without it refused.

Both sides read the key from a file (``signing_key_file``; in production a file only they can
read, or ``FLOWENGINE_SIGNING_KEY``). Every request, reply and announcement then carries an
HMAC-SHA256 signature in its headers, and anything unsigned or signed with another key is
refused, never run or applied. An engine without the key does not quietly half work: its
discovery is refused by the worker, it refuses the worker's signed announcements, both log the
reason, and its request ends in RequestTimeout.

Run: python examples/wbe_signed.py
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import tempfile
import threading

import wbe_tasks

from flowengine import engines
from flowengine.flows import linear_flow
from flowengine.worker_based.worker import Worker

EXCHANGE = "wbe-signed"
TOPIC = "orders"
TRANSPORT = "memory"
STORE = {"item": "widget", "quantity": 2, "unit_price": 9.99}


def build_flow() -> linear_flow.Flow:
    return linear_flow.Flow("reserve").add(wbe_tasks.ReserveStock("reserve_stock"))


def main() -> None:
    os.environ.pop("FLOWENGINE_SIGNING_KEY", None)  # this example passes its key explicitly
    logging.basicConfig(stream=sys.stdout, level=logging.ERROR, format="log: %(message)s")
    logging.getLogger("flowengine.worker_based.signing").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as folder:
        key_file = os.path.join(folder, "signing.key")
        with open(key_file, "w", encoding="utf-8") as stream:
            stream.write(secrets.token_urlsafe(32))
        worker = Worker(EXCHANGE, TOPIC, [wbe_tasks.ReserveStock], threads_count=1,
                        transport=TRANSPORT, events=False, signing_key_file=key_file)
        thread = threading.Thread(target=worker.run, kwargs={"display_banner": False},
                                  daemon=True)
        thread.start()
        try:
            if not worker.wait(timeout=10):
                raise RuntimeError("the worker did not start consuming within 10s")
            signed = engines.load(build_flow(), engine="worker-based", exchange=EXCHANGE,
                                  topics=[TOPIC], transport=TRANSPORT, store=STORE,
                                  signing_key_file=key_file)
            signed.run()
            print(f"with the key: {signed.storage.get_flow_state()}, "
                  f"reservation {signed.storage.fetch('reservation')}")
            keyless = engines.load(build_flow(), engine="worker-based", exchange=EXCHANGE,
                                   topics=[TOPIC], transport=TRANSPORT, store=STORE,
                                   transition_timeout=2)
            try:
                keyless.run()
                print("without the key: ran (unexpected)")
            except Exception as err:
                print(f"without the key: {type(err).__name__}")
        finally:
            worker.stop(grace=5)
            thread.join(timeout=10)


if __name__ == "__main__":
    main()
