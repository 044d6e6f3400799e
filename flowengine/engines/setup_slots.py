"""Engines set up (compile, prepare, validate) one at a time; the others wait asleep.

Setting an engine up is CPU-bound Python, so under the GIL a thousand engines setting up at
once go no faster than a few at a time. They cost far more, though: every thread that is ready
to run but waiting for the GIL wakes every switch interval (5 ms by default) to ask for it
again. With 1,000 worker-based flows started together that was about 70 context switches per
task; admitting set-ups one at a time, with the rest asleep on a semaphore until their turn,
brought it to about 25 and the engine process's CPU per task down by about 15%, in 15 of 16
alternated runs (two at a time showed no gain: the two contend for the GIL as before). See
``doc/performance.rst``.

An engine whose storage is a database or a folder waits on I/O while it prepares, and one
stuck on a slow database must not hold up every other engine in the process: those set up in
a wider pool of their own (:data:`IO_SLOTS`).

The garbage collector stays paused (:mod:`~flowengine.engines.gc_pause`) from the moment a
set-up asks for a slot, not only while it holds one: a burst of set-ups allocates only
long-lived objects, and the gaps between one admitted set-up and the next let the collector
walk the growing heap again and again (measured: up to four full collections in one burst
instead of one).

A thread that already holds a slot (``prepare`` calls ``compile``; a listener may set another
engine up) goes on without taking a second one, so nesting never waits on itself.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from flowengine.engines import gc_pause

#: Set-ups of engines with in-memory storage (no I/O) that may run at once in the process.
SLOTS = 1
#: Set-ups of engines with a database or folder for storage that may run at once.
IO_SLOTS = 8

_slots: threading.BoundedSemaphore
_io_slots: threading.BoundedSemaphore
_held: threading.local


def _fresh() -> None:
    """Every slot free. Also in a forked child, which has only the forking thread: slots held
    by the parent's other threads would never be given back, and its first engine would
    wait for ever."""
    global _slots, _io_slots, _held
    _slots = threading.BoundedSemaphore(SLOTS)
    _io_slots = threading.BoundedSemaphore(IO_SLOTS)
    _held = threading.local()


_fresh()
os.register_at_fork(after_in_child=_fresh)


@contextlib.contextmanager
def admitted(io: bool = False) -> Iterator[None]:
    """Run the block as one of at most :data:`SLOTS` engine set-ups in the process (one of
    :data:`IO_SLOTS` if ``io``: the engine's storage does I/O)."""
    if getattr(_held, "depth", 0):
        _held.depth += 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    with gc_pause.paused(), (_io_slots if io else _slots):
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
