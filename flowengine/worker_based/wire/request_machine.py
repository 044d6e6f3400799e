"""The request lifecycle of TaskFlow's worker protocol: its states and their machine.

WAITING -> PENDING -> RUNNING -> SUCCESS | FAILURE, as TaskFlow's ``build_a_machine`` draws it;
EVENT is the progress pseudo-state of a RESPONSE, never a request's. These names are part of
:mod:`~flowengine.worker_based.protocol`, which re-exports them.
"""

from __future__ import annotations

from automaton import machines

# Request states (protocol states, unrelated to atom states) and the progress pseudo-state.
WAITING = "WAITING"
PENDING = "PENDING"
RUNNING = "RUNNING"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
EVENT = "EVENT"
#: States in which ``transition_timeout`` runs; once RUNNING, the engine's lease takes over.
WAITING_STATES = (WAITING, PENDING)
STOP_TIMER_STATES = (RUNNING, SUCCESS, FAILURE)


def make_an_event(new_state: str) -> str:
    """The machine event that moves a request into ``new_state``."""
    return f"on_{new_state}".lower()


def build_a_machine(freeze: bool = True) -> machines.FiniteMachine:
    """Build the request lifecycle: WAITING -> PENDING -> RUNNING -> SUCCESS | FAILURE."""
    m = machines.FiniteMachine()
    for state in (WAITING, PENDING, RUNNING):
        m.add_state(state)
    for state in (SUCCESS, FAILURE):
        m.add_state(state, terminal=True)
    m.default_start_state = WAITING
    for start, end in (
        (WAITING, PENDING),  # published to a worker
        (WAITING, FAILURE),  # expired, or no worker can run it
        (PENDING, RUNNING),  # a worker started it
        (PENDING, FAILURE),  # expired, publish failed, or the worker refused it
        (RUNNING, SUCCESS),
        (RUNNING, FAILURE),
    ):
        m.add_transition(start, end, make_an_event(end))
    if freeze:
        m.freeze()
    return m


#: The one request machine; requests keep their own state and look transitions up here.
MACHINE = build_a_machine()
_TRANSITIONS: dict[tuple[str, str], str] = {(s, e): end for s, e, end in MACHINE}
