"""The damaged postings a board found: skipped, reported once, listed for operators.

A value in a board's job folder that is not a posting (not JSON, not an object, a field of the
wrong type) must not stop the board's readers: every backend skips it, logs it once (board and
key, never the value), moves it to the trash when that is safe (nobody holds a claim on it and
it is unchanged since it was read) and lists it here, so ``flowengine jobs list`` can show it.
"""

from __future__ import annotations

import logging
import threading

from flowengine.jobs.records import DamagedPosting

__all__ = ["DamageLog"]

LOG = logging.getLogger("flowengine.jobs")


class DamageLog:
    """What one board found damaged, each logged once.

    Args:
        board: The board's name (for the log).
    """

    def __init__(self, board: str) -> None:
        self._board = board
        self._lock = threading.Lock()
        self._found: dict[str, DamagedPosting] = {}

    def found(self, key: str, reason: str) -> bool:
        """A damaged posting at ``key``; whether it is news (not yet trashed by this board)."""
        with self._lock:
            known = self._found.get(key)
            if known is not None and known.trashed:
                return False
            self._found[key] = DamagedPosting(key, reason)
        if known is None:
            LOG.warning("Jobboard %s skipped a damaged posting at %s: %s", self._board, key,
                        reason)
        return True

    def trashed(self, key: str) -> None:
        """The posting at ``key`` was moved to the trash."""
        with self._lock:
            known = self._found.get(key)
            if known is None or known.trashed:
                return
            self._found[key] = DamagedPosting(key, known.reason, trashed=True)
        LOG.warning("Jobboard %s moved the damaged posting at %s to the trash", self._board,
                    key)

    def cleared(self, key: str) -> None:
        """``key`` is gone from the board, or holds a posting again."""
        with self._lock:
            known = self._found.get(key)
            if known is not None and not known.trashed:
                del self._found[key]

    def listing(self) -> list[DamagedPosting]:
        """Every damaged posting found, by key: those still on the board and those trashed."""
        with self._lock:
            return sorted(self._found.values(), key=lambda d: d.key)
