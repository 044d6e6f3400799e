"""Tasks the worker-side secrets test runs in ``flowengine worker`` processes."""

from __future__ import annotations

import logging
import os
import signal

from flowengine import task

#: Every encoding of each secret keeps its core (no quote, backslash or non-ASCII in it).
PASSWORD = "pw-c0re'\"\\Ω"
TOKEN = "tok-c0re"
CORES = ("pw-c0re", "tok-c0re")

LOG = logging.getLogger(__name__)


class Leak(task.Task):
    """Marks only ``token`` secret itself (``password`` is a ``Secret`` store value), logs
    and fails quoting both."""

    secret_args = ("token",)

    def execute(self, password: str, token: str) -> None:
        LOG.warning("logging in with %r and %s", password, token)
        raise ValueError(f"login with {password!r} / {token} refused", password)


class KillsItsWorker(task.Task):
    """SIGKILLs the worker process it runs in (so its request is parked as a dead letter)."""

    secret_args = ("token",)

    def execute(self, password: str, token: str) -> None:
        os.kill(os.getpid(), signal.SIGKILL)
