"""Retry controllers: run a subflow again when something in it fails.

1. ``Times`` retries a flaky upload up to 4 attempts, waiting 0.05 s before the second attempt
   and twice as long before each one after (``delay``/``backoff``). The wait never blocks other
   ready atoms: the engine keeps running them while the retry's timer counts down. Each wait is
   announced as it starts and ends (``engine.retry_waits``; the same as the ``task-delayed``
   and ``task-delay-ended`` events, and ``DELAYED UNTIL`` in ``flowengine show``).
2. ``ForEach`` tries one mirror after another until a download succeeds.

Run: python examples/retry_flow.py
"""

import time

from flowengine import engines, retry, task
from flowengine.engines import RetryWait
from flowengine.flows import linear_flow


class Upload(task.Task):
    """Fails on the first two attempts (a flaky network), then succeeds."""

    def __init__(self, started: float) -> None:
        super().__init__(name="upload", provides="receipt")
        self._started = started

    def execute(self, attempt: int) -> str:
        elapsed = time.monotonic() - self._started
        print(f"upload: attempt {attempt} at +{elapsed:.2f}s")
        if attempt < 3:
            raise ConnectionError(f"connection reset on attempt {attempt}")
        return f"uploaded on attempt {attempt}"

    def revert(self, attempt: int, **kwargs: object) -> None:
        print(f"upload: cleaning up the partial upload of attempt {attempt}")


class Download(task.Task):
    def execute(self, mirror: str) -> str:
        if mirror != "mirror-c":
            print(f"download: {mirror} is unreachable")
            raise OSError(f"{mirror} is unreachable")
        print(f"download: fetched from {mirror}")
        return mirror


def announce_wait(wait: RetryWait) -> None:
    if wait.due is not None:
        print(f"{wait.retry_name}: waiting {wait.seconds:.2f}s before attempt {wait.attempt}")
    else:
        print(f"{wait.retry_name}: wait over, attempt {wait.attempt} starts")


def upload_with_backoff() -> None:
    controller = retry.Times(4, name="upload-retry", provides="attempt", delay=0.05, backoff=2.0)
    flow = linear_flow.Flow("upload", retry=controller).add(Upload(time.monotonic()))
    engine = engines.load(flow)
    engine.retry_waits.subscribe(announce_wait)
    engine.run()
    results = engine.storage.fetch_all()
    print(f"result: {results['receipt']}")


def download_from_mirrors() -> None:
    mirrors = ["mirror-a", "mirror-b", "mirror-c"]
    controller = retry.ForEach(mirrors, name="mirror-retry", provides="mirror")
    flow = linear_flow.Flow("download", retry=controller).add(Download(provides="source"))
    results = engines.run(flow)
    print(f"result: downloaded from {results['source']}")


def main() -> None:
    print("== Times with delay=0.05 and backoff=2 ==")
    upload_with_backoff()
    print("== ForEach over mirrors ==")
    download_from_mirrors()


if __name__ == "__main__":
    main()
