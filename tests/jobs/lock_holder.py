"""A process that takes a lock and holds it until killed: ``lock_holder.py CONF KEY TTL``.

Prints ``held`` once it holds the lock.
"""

from __future__ import annotations

import sys
import threading

from flowengine import coordination


def main() -> None:
    conf, key, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    coordinator = coordination.connect(conf, ttl=ttl, owner="lock-holder")
    coordinator.acquire(key, details={"job": "held-by-a-child"})
    print("held", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
