"""Reading a command's output line by line while it runs (real ``flowengine`` processes)."""

from __future__ import annotations

import queue
import subprocess
import threading
import time


def read_lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """The process's output lines, as they come (a thread reads them)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


def wait_for_line(lines: queue.Queue[str], text: str, timeout: float) -> list[str]:
    """Everything read until a line holding ``text`` (AssertionError after ``timeout``)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while not seen or text not in seen[-1]:
        try:
            seen.append(lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
        except queue.Empty:
            raise AssertionError(
                f"no line with {text!r} in {timeout}s:\n" + "\n".join(seen)) from None
    return seen
