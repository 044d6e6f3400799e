"""Flows for the CLI tests, imported by name (``cli_flows:make_ok``) as a user's module would be."""

from __future__ import annotations

import os
import signal
import threading
import urllib.request
from typing import Any

from flowengine import deciders, retry, task
from flowengine.flows import graph_flow, linear_flow, unordered_flow


class Journal(list[str]):
    """What each task did, in order; a test on another thread can wait for an entry."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = threading.Condition()

    def append(self, entry: str) -> None:
        with self._changed:
            super().append(entry)
            self._changed.notify_all()

    def wait_for(self, entry: str, timeout: float) -> bool:
        """True once ``entry`` is in the journal; False if ``timeout`` seconds pass first."""
        with self._changed:
            return self._changed.wait_for(lambda: entry in self, timeout)


#: What each task did, in order (the tests read it after a run in the same process).
JOURNAL = Journal()


class Add(task.Task):
    """Adds one to ``x``, reporting progress half way."""

    def execute(self, x: int) -> int:
        JOURNAL.append(f"execute {self.name}")
        self.update_progress(0.5)
        return x + 1

    def revert(self, **kwargs: Any) -> None:
        JOURNAL.append(f"revert {self.name}")


class Fail(task.Task):
    """Always fails."""

    def execute(self, **kwargs: Any) -> None:
        JOURNAL.append(f"execute {self.name}")
        raise RuntimeError(f"{self.name} cannot go on")

    def revert(self, **kwargs: Any) -> None:
        JOURNAL.append(f"revert {self.name}")


class BadRevert(Add):
    """Runs, but its revert fails too."""

    def revert(self, **kwargs: Any) -> None:
        JOURNAL.append(f"revert {self.name}")
        raise ValueError(f"{self.name} cannot be undone")


class Interrupt(task.Task):
    """Sends SIGINT to its own process, as an operator's Ctrl-C would, then finishes."""

    def execute(self) -> str:
        JOURNAL.append(f"execute {self.name}")
        os.kill(os.getpid(), signal.SIGINT)
        return "interrupted"


class InterruptTwice(task.Task):
    """Sends SIGINT twice, as an impatient operator would, the first time it runs: the second
    one stops the run at once."""

    fired = False

    def execute(self) -> str:
        JOURNAL.append(f"execute {self.name}")
        if not InterruptTwice.fired:
            InterruptTwice.fired = True
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return "interrupted"


class Echo(task.Task):
    """Returns a fixed value."""

    def execute(self, **kwargs: Any) -> str:
        JOURNAL.append(f"execute {self.name}")
        return self.name


def make_ok(start: int = 1) -> linear_flow.Flow:
    """a then b: succeeds, b = start + 2."""
    return linear_flow.Flow("ok").add(
        Add("a", provides="y", inject={"x": start}),
        Add("b", provides="z", rebind={"x": "y"}),
    )


class FailsFirst(task.Task):
    """Fails the first attempt of its retry controller."""

    def execute(self, attempt: int) -> int:
        if attempt == 1:
            raise RuntimeError("first attempt fails")
        return attempt


def make_delayed() -> linear_flow.Flow:
    """A retry controller that waits 0.01 s before its second attempt."""
    return linear_flow.Flow("delayed", retry=retry.Times(
        2, name="again", provides="attempt", delay=0.01)).add(FailsFirst("flaky"))


def make_needs_x() -> linear_flow.Flow:
    """Needs ``x`` from --store."""
    return linear_flow.Flow("needs-x").add(Add("a", provides="y"))


def make_reverted() -> linear_flow.Flow:
    """a runs, b fails: a and b are reverted (b first)."""
    return linear_flow.Flow("reverted").add(Add("a", provides="y", inject={"x": 1}), Fail("b"))


def make_revert_fails() -> linear_flow.Flow:
    """a runs, b fails, a's revert fails: the flow ends in FAILURE."""
    return linear_flow.Flow("revert-fails").add(BadRevert("a", provides="y", inject={"x": 1}),
                                                Fail("b"))


def make_suspending() -> linear_flow.Flow:
    """first, interrupt (Ctrl-C), last: suspended after interrupt; a resume runs last."""
    return linear_flow.Flow("suspending").add(Echo("first"), Interrupt("interrupt"), Echo("last"))


def make_impatient() -> linear_flow.Flow:
    """first, interrupt twice, last: the second Ctrl-C stops the run."""
    return linear_flow.Flow("impatient").add(Echo("first"), InterruptTwice("interrupt"),
                                             Echo("last"))


class Waits(task.Task):
    """An async task."""

    async def execute(self) -> str:
        JOURNAL.append(f"execute {self.name}")
        return self.name


def make_async() -> linear_flow.Flow:
    """One async task: every engine awaits it."""
    return linear_flow.Flow("async").add(Waits("waits"))


def make_missing() -> linear_flow.Flow:
    """b needs ``nowhere``, which nothing provides."""
    return linear_flow.Flow("missing").add(Echo("a"), Echo("b", requires=("nowhere",)))


def make_bad() -> int:
    """Not a flow."""
    return 42


def make_raising() -> linear_flow.Flow:
    raise KeyError("no such region")


def make_nested() -> graph_flow.Flow:
    """A graph flow: fetch -> (a retry-controlled unordered pair) and a decider-guarded report."""
    fetch = Echo("fetch", provides="data")
    pair = unordered_flow.Flow("pair", retry=retry.Times(2, name="again")).add(
        Echo("left", requires=("data",)), Echo("right", requires=("data",)))
    report = Echo("report")
    flow = graph_flow.Flow("nested").add(fetch, pair, report)
    flow.link(fetch, report, decider=lambda history: True,
              decider_depth=deciders.Depth.ATOM)
    return flow


def make_from_region(region: str, size: int = 1) -> linear_flow.Flow:
    """Factory arguments show up in the atom names."""
    return linear_flow.Flow(f"in-{region}").add(Echo(f"{region}-{size}"))


class Long(task.Task):
    """Returns a result too long for a table cell."""

    def execute(self) -> str:
        return "x" * 100


def make_long() -> linear_flow.Flow:
    """One task with a long result."""
    return linear_flow.Flow("long").add(Long("long"))


#: A flow object rather than a factory.
FLOW_OBJECT = linear_flow.Flow("object").add(Echo("only"))

#: A lambda factory: recorded through its ``module:attribute`` for resumption.
lambda_factory = lambda: linear_flow.Flow("from-lambda").add(Echo("lam"))  # noqa: E731


class Scrape(task.Task):
    """Reads the engine's metrics endpoint while the flow runs; returns the lines of the
    ``flowengine_`` samples whose labels name the engine."""

    def execute(self, port: int) -> list[str]:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return [line for line in text.splitlines()
                if line.startswith("flowengine_") and 'role="engine"' in line]


def make_scraping(port: int) -> linear_flow.Flow:
    """A task, then one that scrapes the metrics endpoint on ``port`` mid-run."""
    return linear_flow.Flow("scraping").add(Echo("before-scrape"),
                                            Scrape("scrape", inject={"port": port}))


class Login(task.Task):
    """Takes a secret password, then fails (so the flow can be resumed)."""

    secret_args = ("password",)

    def execute(self, password: str) -> None:
        JOURNAL.append(f"execute {self.name} with {len(password)} characters")
        raise RuntimeError(f"login refused for {password!r}")


def make_secretive() -> linear_flow.Flow:
    return linear_flow.Flow("secretive").add(Login("login"))


class Greet(task.Task):
    """Says its phrase back (so the phrase is in its result)."""

    def execute(self, phrase: str) -> str:
        JOURNAL.append(f"execute {self.name}")
        return f"said {phrase!r}"


def make_greeting() -> linear_flow.Flow:
    return linear_flow.Flow("greeting").add(Greet("greet", provides="said"))


class UntilCancelled(task.Task):
    """Waits (up to a minute) until its flow is cancelled, then returns."""

    def execute(self) -> str:
        from flowengine import context

        JOURNAL.append(f"execute {self.name}")
        if not context.current().wait(60):
            raise RuntimeError(f"{self.name} was never cancelled")
        JOURNAL.append(f"stopped {self.name}")
        return self.name

    def revert(self, **kwargs: Any) -> None:
        JOURNAL.append(f"revert {self.name}")


def make_until_cancelled() -> linear_flow.Flow:
    """a runs, then b waits until the flow is cancelled; c never runs."""
    return linear_flow.Flow("until-cancelled").add(Add("a", provides="y", inject={"x": 1}),
                                                   UntilCancelled("b"), Add("c", rebind=["y"]))


class RevertFailsWhile(Add):
    """Runs; its revert fails while the file ``fault`` exists."""

    def revert(self, fault: str, result: Any = None, **kwargs: Any) -> None:
        if os.path.exists(fault):
            JOURNAL.append(f"revert-failed {self.name}")
            raise ValueError(f"{self.name} cannot be undone while {fault} exists")
        JOURNAL.append(f"revert {self.name} of {result}")


def make_revert_fault(fault: str) -> linear_flow.Flow:
    """a runs, b's revert fails while ``fault`` exists, c fails: FAILURE until repaired."""
    return linear_flow.Flow("revert-fault").add(
        Add("a", provides="y", inject={"x": 1}),
        RevertFailsWhile("b", inject={"x": 10, "fault": fault}), Fail("c"))
