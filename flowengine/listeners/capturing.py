"""A listener that keeps the state changes it receives in a list (handy in tests)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from flowengine.listeners import base

if TYPE_CHECKING:
    from flowengine.engines.engine import ActionEngine

__all__ = ["CaptureListener"]


class CaptureListener(base.Listener):
    """Appends each flow, task and retry state change it receives to :attr:`values`.

    Each entry is what :meth:`_format_capture` returns, by default a ``(kind, state, details)``
    tuple where ``kind`` is :attr:`FLOW`, :attr:`TASK` or :attr:`RETRY`. Override
    :meth:`_format_capture` to keep something else (TaskFlow's own test suite keeps strings
    like ``'task1.t RUNNING'``).

    Args:
        engine: The engine to listen to.
        task_listen_for: Task states to capture.
        flow_listen_for: Flow states to capture.
        retry_listen_for: Retry states to capture.
        capture_flow: Whether to capture flow state changes at all.
        capture_task: Whether to capture task state changes at all.
        capture_retry: Whether to capture retry state changes at all.
        skip_tasks: Names of tasks whose changes are not captured.
        skip_retries: Names of retries whose changes are not captured.
        skip_flows: Names of flows whose changes are not captured.
        values: A list to append to (a new one when None).

    Attributes:
        values: The captured entries, oldest first.
    """

    #: Kind of a flow capture.
    FLOW: ClassVar[str] = "flow"
    #: Kind of a task capture.
    TASK: ClassVar[str] = "task"
    #: Kind of a retry capture.
    RETRY: ClassVar[str] = "retry"

    def __init__(
        self,
        engine: ActionEngine,
        task_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        flow_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        retry_listen_for: Iterable[str] | None = base.DEFAULT_LISTEN_FOR,
        capture_flow: bool = True,
        capture_task: bool = True,
        capture_retry: bool = True,
        skip_tasks: Iterable[str] | None = None,
        skip_retries: Iterable[str] | None = None,
        skip_flows: Iterable[str] | None = None,
        values: list[Any] | None = None,
    ) -> None:
        super().__init__(
            engine,
            task_listen_for=task_listen_for,
            flow_listen_for=flow_listen_for,
            retry_listen_for=retry_listen_for,
        )
        self._capture_flow = capture_flow
        self._capture_task = capture_task
        self._capture_retry = capture_retry
        self._skip_tasks = frozenset(skip_tasks or ())
        self._skip_retries = frozenset(skip_retries or ())
        self._skip_flows = frozenset(skip_flows or ())
        self.values: list[Any] = [] if values is None else values

    @staticmethod
    def _format_capture(kind: str, state: str, details: base.Details) -> Any:
        """What to keep for one state change; override to keep something else."""
        return (kind, state, details)

    def _task_receiver(self, state: str, details: base.Details) -> None:
        if self._capture_task and details["task_name"] not in self._skip_tasks:
            self.values.append(self._format_capture(self.TASK, state, details))

    def _retry_receiver(self, state: str, details: base.Details) -> None:
        if self._capture_retry and details["retry_name"] not in self._skip_retries:
            self.values.append(self._format_capture(self.RETRY, state, details))

    def _flow_receiver(self, state: str, details: base.Details) -> None:
        if self._capture_flow and details["flow_name"] not in self._skip_flows:
            self.values.append(self._format_capture(self.FLOW, state, details))
