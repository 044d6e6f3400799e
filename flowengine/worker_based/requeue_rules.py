"""Whether a dead letter should be sent again, and what that will do: one rule for every tool.

A parked request's engine gave up on it (the atom failed with ``WorkerLost``), so re-sending
the raw request runs the task on a worker while nothing records the outcome: the attempt is
over for its engine, and by the time an operator looks, the flow has usually reverted. So
``flowengine dead-letters requeue`` and the dashboard's requeue action both ask
:func:`judge`, given the flow's state read from the persistence backend:

* the flow finished (SUCCESS, REVERTED, FAILURE): refused; ``force`` re-sends it anyway;
* the flow did not finish (its engine died or suspended it): re-sent on request, or, better,
  ``resume``: the flow is resumed from its stored state, which re-runs the atom inside it;
* the state is unknown (no backend given, or the flow is not in it): re-sent, saying so;
* the request's secret arguments were removed when it was parked: never re-sent as it is
  (the task would run without them); ``resume`` asks for them again.
"""

from __future__ import annotations

import contextlib
import dataclasses

from flowengine import exceptions as exc
from flowengine import states
from flowengine.persistence import base
from flowengine.worker_based.dead_letters import DeadLetter, removed_message

__all__ = ["FINISHED", "FlowState", "Verdict", "flow_state", "judge"]

#: Flow states after which nothing waits for a task's outcome.
FINISHED = frozenset({states.SUCCESS, states.REVERTED, states.FAILURE})


@dataclasses.dataclass(frozen=True)
class FlowState:
    """What is known of a dead letter's flow: its state (None: unknown) and a sentence."""

    state: str | None
    described: str


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a requeue will do (``allowed``), or why it is refused (the ``message`` says)."""

    allowed: bool
    resume: bool
    message: str


def flow_state(backend: base.Backend | None, letter: DeadLetter) -> FlowState:
    """The state of ``letter``'s flow, read from ``backend`` (None: no backend given)."""
    if backend is None:
        return FlowState(None, "its flow's state cannot be known without the persistence "
                               "backend it is saved in (--backend)")
    if not letter.flow_uuid:
        return FlowState(None, "the dead letter does not name its flow (an older engine "
                               "parked it)")
    with contextlib.closing(backend.get_connection()) as conn:
        try:
            fd = conn.get_flow_details(letter.flow_uuid)
        except exc.NotFound:
            return FlowState(None, f"its flow {letter.flow_uuid} is not in that backend")
    return FlowState(fd.state, f"its flow {fd.name!r} ({fd.uuid}) is {fd.state}")


def judge(letter: DeadLetter, flow: FlowState, force: bool = False,
          resume: bool = False) -> Verdict:
    """Whether to requeue ``letter`` whose flow is ``flow``, and what it will do.

    Args:
        letter: The parked request.
        flow: What is known of its flow (:func:`flow_state`).
        force: Re-send the raw request even though its flow finished.
        resume: Resume the flow instead of re-sending the raw request.
    """
    task = f"task {letter.task_name!r} ({letter.action})"
    if resume:
        if flow.state is None:
            return Verdict(False, True, f"Cannot resume: {flow.described}.")
        if flow.state in FINISHED:
            return Verdict(False, True, f"Cannot resume: {flow.described}: it has finished, "
                                        f"so there is nothing to resume.")
        return Verdict(True, True, f"{_cap(flow.described)}: resuming it from its stored "
                                   f"state, on the engine options it ran with; {task} runs "
                                   f"again inside it and the dead letter is removed.")
    finished = flow.state in FINISHED
    if finished and not force:
        hint = ("--force re-sends it anyway: the task runs again on a worker and its outcome "
                "shows only in the worker's log and the event stream." if not
                letter.removed_arguments else "Nor can it be forced: its secret argument(s) "
                f"{', '.join(map(repr, letter.removed_arguments))} were removed when it was "
                "parked.")
        return Verdict(False, False, f"Refused: {flow.described}: it has finished, so nothing "
                                     f"would record the outcome of {task} if it ran again. "
                                     f"{hint}")
    if letter.removed_arguments:
        return Verdict(False, False, removed_message(letter))
    gave_up = ("its engine gave up on this attempt when it parked it, so nothing will record "
               "the outcome")
    if flow.state is None:
        return Verdict(True, False, f"{_cap(flow.described)}: re-sending {task} as it was; "
                                    f"{gave_up}.")
    if finished:
        return Verdict(True, False, f"{_cap(flow.described)}, but --force: re-sending {task}; "
                                    f"it runs again and nothing records its outcome.")
    return Verdict(True, False, f"{_cap(flow.described)}: re-sending {task} as it was; "
                                f"{gave_up} (--resume re-runs it inside the flow instead).")


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]
