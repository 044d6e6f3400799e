"""The atom spans open in this process, found by atom uuid or by atom object.

The engine opens an atom's span when the atom starts; the code that runs the task (a thread of
the engine, or the worker-based executor sending a request) finds it here, without any span or
context being passed through the engine's internals.
"""

from __future__ import annotations

import threading
import time
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from flowengine.tracing import names
from flowengine.tracing import propagation as prop
from flowengine.tracing._api import otel

if TYPE_CHECKING:
    from flowengine.atom import Atom

#: Outcome of a request attempt replaced by another (lease lapsed, handed back).
LOST = "lost"


class AtomSpan:
    """An atom's open span and, for remote tasks, the span of its current request attempt."""

    __slots__ = ("attempt_span", "atom", "ended_at", "lock", "span", "tracer", "uuid")

    def __init__(self, tracer: Any, span: Any, atom: Atom | None, uuid: str) -> None:
        self.tracer, self.span, self.atom, self.uuid = tracer, span, atom, uuid
        self.attempt_span: Any = None
        self.ended_at: int | None = None  # a failed atom's end, while its resolution is due
        self.lock = threading.Lock()

    def send(self, headers: MutableMapping[str, Any], attributes: dict[str, Any],
             task_name: str) -> None:
        """Open the producer span of a new attempt (ending the one it replaces) and put its
        context in ``headers``."""
        trace = otel()[0]
        with self.lock:
            previous, links = self.attempt_span, []
            if previous is not None:
                previous.set_attribute(names.OUTCOME, LOST)
                previous.end()
                links.append(trace.Link(previous.get_span_context(), {names.OUTCOME: LOST}))
            span = self.tracer.start_span(
                names.SEND.format(task_name), context=trace.set_span_in_context(self.span),
                kind=trace.SpanKind.PRODUCER, attributes=attributes, links=links)
            self.attempt_span = span
        prop.inject(headers, span)
        headers[prop.SENT_AT] = time.time()

    def end_attempt(self, outcome: str) -> None:
        """End the current attempt's span with the atom's outcome."""
        with self.lock:
            span, self.attempt_span = self.attempt_span, None
        if span is not None:
            span.set_attribute(names.OUTCOME, outcome)
            span.end()


class Registry:
    """Open atom spans by uuid and by atom object (an object in two engines at once is in
    neither map, rather than in the wrong one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_uuid: dict[str, AtomSpan] = {}
        self._by_atom: dict[int, list[AtomSpan]] = {}

    def add(self, entry: AtomSpan) -> None:
        with self._lock:
            self.by_uuid[entry.uuid] = entry
            if entry.atom is not None:
                self._by_atom.setdefault(id(entry.atom), []).append(entry)

    def remove(self, entry: AtomSpan) -> None:
        with self._lock:
            if self.by_uuid.get(entry.uuid) is entry:
                del self.by_uuid[entry.uuid]
            held = self._by_atom.get(id(entry.atom))
            if held is not None and entry in held:
                held.remove(entry)
                if not held:
                    del self._by_atom[id(entry.atom)]

    def of_atom(self, atom: Atom) -> AtomSpan | None:
        """The atom object's open span, if exactly one engine runs it now."""
        held = self._by_atom.get(id(atom))
        if held is None or len(held) != 1:
            return None
        return held[0]


REGISTRY = Registry()
