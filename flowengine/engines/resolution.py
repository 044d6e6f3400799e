"""Failure resolution: which atoms revert (and which retry) after an atom fails.

The failed atom's retry controller is asked first (``on_failure``); ``REVERT`` defers to the
enclosing controller, recursively, as TaskFlow does; with no controller everything reverts.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from flowengine import retry as retry_mod
from flowengine import states

if TYPE_CHECKING:
    from flowengine.atom import Atom
    from flowengine.engines.runtime import Runtime
    from flowengine.types.failure import Failure

LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class Strategy:
    """A resolution: ``apply`` changes intentions; ``strategy`` is the decision it stands for."""

    strategy: retry_mod.Decision
    retry: retry_mod.Retry | None = None

    def apply(self, runtime: Runtime) -> None:
        """Set the intentions this resolution implies."""
        if self.strategy is retry_mod.REVERT_ALL:
            runtime.reset_atoms(runtime.compilation.iter_atoms(), None, states.REVERT)
            return
        retry = self.retry
        assert retry is not None, "a REVERT or RETRY resolution names its controller"
        runtime.reset_atoms([retry], None,
                            states.REVERT if self.strategy is retry_mod.REVERT else states.RETRY)
        runtime.reset_atoms(runtime.compilation.successors_of(retry), None, states.REVERT)

    def __str__(self) -> str:
        target = f" of {self.retry.name!r}" if self.retry is not None else ""
        return f"{self.strategy.value}{target}"


#: What happens when no retry controller handles a failure: everything reverts. Kept distinct
#: from a controller's explicit REVERT_ALL, which must win over an inner REVERT.
UNDEFINED = Strategy(retry_mod.REVERT_ALL)


def determine(runtime: Runtime, atom: Atom, failure: Failure, defer_reverts: bool) -> Strategy:
    """Ask the controllers above ``atom`` how to handle ``failure``."""
    controller = runtime.compilation.retry_of(atom)
    if controller is None:
        return UNDEFINED
    decision = runtime.ask_retry(controller, atom, failure)
    if decision == retry_mod.RETRY:
        return Strategy(retry_mod.RETRY, controller)
    if decision == retry_mod.REVERT:
        parent = determine(runtime, controller, failure, defer_reverts)
        if defer_reverts:
            return parent
        if parent is not UNDEFINED and parent.strategy != retry_mod.REVERT:
            return parent
        return Strategy(retry_mod.REVERT, controller)
    if decision == retry_mod.REVERT_ALL:
        return Strategy(retry_mod.REVERT_ALL)
    raise ValueError(
        f"Retry {controller.name!r} returned unknown decision {decision!r} for the failure of "
        f"{atom.name!r}"
    )
