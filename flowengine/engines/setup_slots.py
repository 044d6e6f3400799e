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

The cyclic garbage collector stays paused (:func:`gc_paused`) from the moment a set-up asks
for a slot, not only while it holds one. Compiling, preparing and validating a flow allocate a
few objects per atom, all of them long-lived (graph nodes, atom details, provider entries);
each allocation burst makes CPython run full collections that walk the whole, growing heap and
find nothing to free (for a 10,000-atom graph flow, half the time of ``prepare`` and
``validate``), and the gaps between one admitted set-up and the next would let the collector
walk the heap again and again (measured: up to four full collections in one burst instead of
one). The collector is resumed exactly as it was found: never enabled if the application had
disabled it. Nothing is leaked; collection simply happens after the set-ups.

A thread that already holds a slot (``prepare`` calls ``compile``; a listener may set another
engine up) goes on without taking a second one, so nesting never waits on itself.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

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
    with gc_paused(), (_io_slots if io else _slots):
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0


# -- pausing the collector ------------------------------------------------------------------

_gc_lock = threading.Lock()
_gc_depth = 0
_gc_resume = False  # whether the outermost pause found the collector enabled


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause cyclic garbage collection for the block (nestable, from any thread)."""
    global _gc_depth, _gc_resume
    with _gc_lock:
        if _gc_depth == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            # Never below zero: a pause entered before a fork ends in the child after the
            # child's count was reset (see _gc_after_fork).
            _gc_depth = max(_gc_depth - 1, 0)
            if _gc_depth == 0 and _gc_resume:
                gc.enable()


def _gc_after_fork() -> None:
    # Pauses the parent's other threads were in will never end in the child, and would leave
    # its collector off for good.
    global _gc_lock, _gc_depth
    paused_at_fork, _gc_lock, _gc_depth = _gc_depth > 0, threading.Lock(), 0
    if paused_at_fork and _gc_resume:
        gc.enable()


def _after_fork() -> None:
    # A forked child has only the forking thread: what the parent's other threads held (set-up
    # slots, collector pauses) is never given back there.
    _fresh()
    _gc_after_fork()


os.register_at_fork(after_in_child=_after_fork)
