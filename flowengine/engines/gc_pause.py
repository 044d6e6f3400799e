"""Pausing the cyclic garbage collector while an engine builds what a flow will keep.

Compiling, preparing and validating a large flow allocate a few objects per atom, all of them
long-lived (graph nodes, atom details, provider entries). Each allocation burst makes CPython run
full collections that walk the whole, growing heap and find nothing to free: for a 10,000-atom
graph flow that was half the time of ``prepare`` and ``validate``. The collector is paused
around those phases only, and resumed exactly as it was: never enabled if the application had
disabled it. Nothing is leaked; collection simply happens after the phase.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_resume = False  # whether the outermost pause found the collector enabled


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Pause cyclic garbage collection for the block (nestable, from any thread)."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            # Never below zero: a pause entered before a fork ends in the child after the
            # child's count was reset (see _after_fork).
            _depth = max(_depth - 1, 0)
            if _depth == 0 and _resume:
                gc.enable()


def _after_fork() -> None:
    # A forked child has only the forking thread: pauses the parent's other threads were in
    # will never end there, and would leave the child's collector off for good.
    global _lock, _depth
    paused_at_fork, _lock, _depth = _depth > 0, threading.Lock(), 0
    if paused_at_fork and _resume:
        gc.enable()


os.register_at_fork(after_in_child=_after_fork)
