"""Fills a TaskFlow store with real TaskFlow engines, the last one left in flight.

Usage (with ``SHOP_LIBRARY=taskflow``)::

    python taskflow_store_child.py URL ORDER:FAIL_AT ...

``URL`` is a TaskFlow persistence connection (``sqlite:///...``, ``postgresql+psycopg://...``)
or ``dir:///path``. For each ``ORDER:FAIL_AT`` (``FAIL_AT`` empty or ``ship``) a TaskFlow engine
runs ``taskflow_shop.make_order`` through ``engines.load_from_factory`` in the logbook
``shop-book`` (so the flow detail records its factory, as services that resume flows do), and
the child prints ``started ORDER FLOW_UUID`` before and ``ended ORDER STATE`` after. Set
``SHOP_BLOCK=ORDER`` and that order's ``pack`` blocks: the parent kills this process there.
"""

from __future__ import annotations

import contextlib
import sys

import taskflow_shop
from taskflow import engines
from taskflow import exceptions as tf_exc
from taskflow.persistence import backends, models

BOOK = "shop-book"


def main(url: str, orders: list[str]) -> int:
    conf = ({"connection": "dir", "path": url[len("dir://"):]} if url.startswith("dir://")
            else {"connection": url})
    backend = backends.fetch(conf)
    with contextlib.closing(backend.get_connection()) as conn:
        conn.upgrade()
        try:
            book = conn.get_logbook(BOOK)
        except tf_exc.NotFound:
            book = models.LogBook("shop", uuid=BOOK)
            book.meta = {"service": "shop", "since": 2019}
            conn.save_logbook(book)
    for spec in orders:
        order, _, fail_at = spec.partition(":")
        engine = engines.load_from_factory(
            taskflow_shop.make_order, factory_kwargs={"fail_at": fail_at}, book=book,
            backend=backend, store={"order": order, "quantity": 2})
        print(f"started {order} {engine.storage.flow_uuid}", flush=True)
        # A reverted order re-raises its failures (a WrappedFailure when there are several).
        with contextlib.suppress(taskflow_shop.ShippingError, tf_exc.WrappedFailure):
            engine.run()
        print(f"ended {order} {engine.storage.get_flow_state()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
