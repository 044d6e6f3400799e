"""The worker wire protocol: message types, TaskFlow's schemas and the request lifecycle.

The base layer is TaskFlow 6.x's, byte for byte (see ``doc/`` and ``TASKFLOW-WIRE.md``): message
property ``type`` is NOTIFY, REQUEST or RESPONSE and bodies are JSON documents matching the schemas
below. flowengine's additions never go into a body a TaskFlow peer reads; they travel in message
headers named by the ``HEADER_*`` constants, which TaskFlow peers ignore.

The whole wire contract (types, schemas, headers, bounds, request lifecycle) is importable from
this module, because TaskFlow programs import these names from ``protocol``; the request
lifecycle lives in :mod:`~flowengine.worker_based.wire.request_machine` and the header extensions in
:mod:`~flowengine.worker_based.wire.headers`.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import logging
import threading
import time
import uuid as uuid_mod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import futurist
import jsonschema
from jsonschema import exceptions as schema_exc

from flowengine import exceptions as exc
from flowengine.engines.executor import EXECUTED, REVERTED
from flowengine.types.failure import Failure
from flowengine.worker_based.wire.bounds import MAX_BODY_BYTES, MAX_NESTING_DEPTH, exceeds_depth
from flowengine.worker_based.wire.headers import (
    HEADER_ATOM_UUID,
    HEADER_ATTEMPT,
    HEADER_CAPACITY,
    HEADER_DEADLINE,
    HEADER_FLOW_UUID,
    HEADER_ORIGIN,
    HEADER_PROTOCOL,
    HEADER_REQUEST_ID,
    HEADER_TASK_NAME,
    HEADER_TIME_LIMIT,
    HEADER_WORKER,
    HEADER_WORKER_STATUS,
    PROTOCOL_VERSION,
    QUIET_START_PROTOCOL,
    WORKER_OFFLINE,
    WORKER_ONLINE,
    origin,
)
from flowengine.worker_based.wire.request_machine import (
    _TRANSITIONS,
    EVENT,
    FAILURE,
    MACHINE,
    PENDING,
    RUNNING,
    STOP_TIMER_STATES,
    SUCCESS,
    WAITING,
    WAITING_STATES,
    build_a_machine,
    make_an_event,
)

if TYPE_CHECKING:
    from flowengine.atom import Atom

__all__ = [  # TaskFlow programs import these names from here
    "ACTION_TO_EVENT", "ANNOUNCEMENT_TTL", "DISCOVERY_ROUTING_KEY", "EVENT", "EXECUTE",
    "EXPIRES_AFTER", "FAILURE", "HEADER_ATOM_UUID", "HEADER_ATTEMPT", "HEADER_CAPACITY",
    "HEADER_DEADLINE", "HEADER_FLOW_UUID", "HEADER_ORIGIN", "HEADER_PROTOCOL",
    "HEADER_REQUEST_ID", "HEADER_TASK_NAME", "HEADER_TIME_LIMIT", "HEADER_WORKER",
    "HEADER_WORKER_STATUS", "MACHINE", "MAX_BODY_BYTES", "MAX_NESTING_DEPTH", "Message", "NOTIFY",
    "NOTIFY_PERIOD", "NO_RESULT", "Notify", "PENDING", "PROTOCOL_VERSION", "QUEUE_EXPIRE_TIMEOUT",
    "QUIET_START_PROTOCOL", "REQUEST", "REQUEST_TIMEOUT", "RESPONSE", "REVERT", "RUNNING",
    "Request", "Response", "STOP_TIMER_STATES", "SUCCESS", "WAITING", "WAITING_STATES",
    "WORKER_OFFLINE", "WORKER_ONLINE", "WorkUnit", "build_a_machine", "exceeds_depth",
    "failure_to_dict", "make_an_event", "origin", "task_class_name",
]

LOG = logging.getLogger(__name__)

# Message types (the message ``type`` property).
NOTIFY = "NOTIFY"
REQUEST = "REQUEST"
RESPONSE = "RESPONSE"

# Remote actions and the executor outcome each maps to.
EXECUTE = "execute"
REVERT = "revert"
ACTION_TO_EVENT = {EXECUTE: EXECUTED, REVERT: REVERTED}

#: Seconds a request may stay WAITING/PENDING before it fails (TaskFlow's default).
REQUEST_TIMEOUT = 60.0
QUEUE_EXPIRE_TIMEOUT = REQUEST_TIMEOUT
NOTIFY_PERIOD = 5.0
EXPIRES_AFTER = 60.0


class _NoResult:
    def __repr__(self) -> str:
        return "NO_RESULT"


#: Marks "no result given" where ``None`` is a valid result.
NO_RESULT: Any = _NoResult()

#: Routing key of worker announcements: a NOTIFY reply body, sent unsolicited on the worker's
#: exchange. Only flowengine engines bind their reply queue with this key, so TaskFlow peers never
#: see announcements, and nobody declares a queue named after it.
DISCOVERY_ROUTING_KEY = "flowengine.discovery"
#: Seconds an announcement lives in a queue, so the queue of an engine that died does not grow.
ANNOUNCEMENT_TTL = 60.0

def task_class_name(task: object) -> str:
    """The wire name of a task class (or of an instance's class): ``module.QualifiedName``."""
    cls = task if isinstance(task, type) else type(task)
    return f"{cls.__module__}.{cls.__qualname__}"


def failure_to_dict(failure: Failure) -> dict[str, Any]:
    """Encode ``failure`` as a JSON-able v1 dict, dropping ``exc_args`` if they are not JSON."""
    data = failure.to_dict()
    try:
        json.dumps(data)
    except (TypeError, ValueError):
        return failure.to_dict(include_args=False)
    return data


def _compile(schema: dict[str, Any]) -> Any:
    base = jsonschema.validators.validator_for(schema)
    # Locally built dicts hold tuples where decoded JSON has lists; accept both, as TaskFlow does.
    checker = base.TYPE_CHECKER.redefine("array", lambda _c, v: isinstance(v, (list, tuple)))
    return jsonschema.validators.extend(base, type_checker=checker)(schema)


def _check(validator: Any, data: Any, what: str) -> None:
    try:
        validator.validate(data)
    except schema_exc.ValidationError as err:
        raise exc.InvalidFormat(f"{what} not of the expected format: {err.message}", err) from err


# Fast paths. Every message is validated, and jsonschema takes 80-170 us per body; these
# recognise the common, plainly valid shapes in a few us. They only ever accept bodies the
# schemas accept: anything else goes to jsonschema, which decides and words the error.

def _plain_request(data: Any) -> bool:
    if type(data) is not dict:
        return False
    version = data.get("task_version")
    return (
        type(data.get("task_cls")) is str
        and type(data.get("task_name")) is str
        and (type(version) is str or type(version) in (list, tuple))
        and type(data.get("action")) is str and data["action"] in ACTION_TO_EVENT
        and type(data.get("arguments", {})) is dict
        and type(data.get("failures", {})) is dict
    )


def _plain_response(data: Any) -> bool:
    if type(data) is not dict or len(data) != 2:
        return False
    payload, state = data.get("data"), data.get("state")
    if type(state) is not str or state not in _RESPONSE_STATES or type(payload) is not dict:
        return False
    if not payload or payload.keys() == {"result"}:
        return True
    return (payload.keys() == {"event_type", "details"}
            and type(payload["event_type"]) is str and type(payload["details"]) is dict)


class Message(abc.ABC):
    """Base of the three message types."""

    TYPE: ClassVar[str]

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The JSON-able body."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.to_dict()!r}>"


class Notify(Message):
    """Discovery: an engine's ``{}`` query, or a worker's ``{"topic", "tasks"}`` reply."""

    TYPE = NOTIFY
    RESPONSE_SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "topic": {"type": "string"},
            "tasks": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["topic", "tasks"],
        "additionalProperties": False,
    }
    SENDER_SCHEMA: ClassVar[dict[str, Any]] = {"type": "object", "additionalProperties": False}

    def __init__(self, **data: Any) -> None:
        self._data = data

    @property
    def topic(self) -> str | None:
        """The replying worker's topic (replies only)."""
        return self._data.get("topic")

    @property
    def tasks(self) -> list[str] | None:
        """The task class names the worker runs (replies only)."""
        return self._data.get("tasks")

    def to_dict(self) -> dict[str, Any]:
        """The body: ``{}`` for a query, ``{"topic", "tasks"}`` for a reply."""
        return dict(self._data)

    @classmethod
    def validate(cls, data: Any, response: bool) -> None:
        """Check a query (``response=False``) or reply body; raise InvalidFormat if wrong."""
        if response:
            _check(_NOTIFY_RESPONSE, data, "Notify message response data")
        else:
            _check(_NOTIFY_SENDER, data, "Notify message sender data")


@dataclasses.dataclass(frozen=True, repr=False)
class WorkUnit(Message):
    """A REQUEST body as a plain value: what an engine sends and a worker decodes.

    Build one from a task with :meth:`of`; :meth:`Request.from_dict` decodes one from a
    validated body. Its :meth:`to_dict` is TaskFlow's REQUEST body exactly.
    """

    TYPE: ClassVar[str] = REQUEST

    task_cls: str
    task_name: str
    task_version: str | list[Any]
    action: str
    arguments: dict[str, Any]
    result: Any = NO_RESULT
    failures: dict[str, Failure] | None = None

    @classmethod
    def of(cls, task: Atom, action: str, arguments: Mapping[str, Any], result: Any = NO_RESULT,
           failures: Mapping[str, Failure] | None = None) -> WorkUnit:
        """The body of a request to run ``task``'s ``action`` with ``arguments`` (on revert,
        with what its execute gave, ``result``, and the flow's ``failures``)."""
        if action not in ACTION_TO_EVENT:
            raise ValueError(f"Request for task '{task.name}' has unknown action '{action}'")
        return cls(task_class_name(task), task.name, list(task.version), action,
                   dict(arguments), result, dict(failures) if failures else None)

    def to_dict(self) -> dict[str, Any]:
        """The REQUEST body; Failures become v1 failure dicts."""
        body: dict[str, Any] = {
            "task_cls": self.task_cls,
            "task_name": self.task_name,
            "task_version": self.task_version,
            "action": self.action,
            "arguments": self.arguments,
        }
        if self.result is not NO_RESULT:
            if isinstance(self.result, Failure):
                body["result"] = ["failure", failure_to_dict(self.result)]
            else:
                body["result"] = ["success", self.result]
        if self.failures:
            body["failures"] = {name: failure_to_dict(f) for name, f in self.failures.items()}
        return body


class Request(Message):
    """One attempt at running a task remotely: TaskFlow's face over a :class:`WorkUnit` body
    and the request lifecycle (flowengine's executor tracks attempts with
    :mod:`~flowengine.worker_based.engine_side.lifecycle` instead).

    Created WAITING; ``transition_timeout`` (``timeout``) only runs while it is WAITING or
    PENDING, measured with ``clock`` so tests can move time without sleeping.

    Args:
        task: The local task object (gives the class name, name and version on the wire).
        uuid: The correlation id replies carry.
        action: :data:`EXECUTE` or :data:`REVERT`.
        arguments: The resolved keyword arguments (must be JSON-able).
        timeout: Seconds allowed in WAITING/PENDING; ``None`` waits forever.
        result: On revert, what execute returned (a value or a Failure).
        failures: On revert, the flow's failures by atom name.
        clock: Monotonic clock, in seconds.
        request_id: Unique id of this attempt (generated when not given).
        attempt: 1 for the first attempt.
    """

    TYPE = REQUEST
    SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "result": {},
            "failures": {"type": "object"},
            "task_cls": {"type": "string"},
            "task_name": {"type": "string"},
            "task_version": {"oneOf": [{"type": "string"}, {"type": "array"}]},
            "action": {"type": "string", "enum": list(ACTION_TO_EVENT)},
            "arguments": {"type": "object"},
        },
        "required": ["task_cls", "task_name", "task_version", "action"],
    }

    def __init__(
        self,
        task: Atom,
        uuid: str,
        action: str,
        arguments: Mapping[str, Any],
        timeout: float | None = REQUEST_TIMEOUT,
        result: Any = NO_RESULT,
        failures: Mapping[str, Failure] | None = None,
        clock: Callable[[], float] = time.monotonic,
        request_id: str | None = None,
        attempt: int = 1,
    ) -> None:
        self.body = WorkUnit.of(task, action, arguments, result, failures)
        self.task = task
        self.uuid = uuid
        self.action = action
        self.arguments = self.body.arguments
        self.result = result
        self.failures = dict(failures) if failures else {}
        self.timeout = timeout
        self.request_id = request_id or uuid_mod.uuid4().hex
        self.attempt = attempt
        self._clock = clock
        self.created_on = clock()
        self._state = WAITING
        self._lock = threading.Lock()
        self._future: futurist.Future[Any] | None = None

    @property
    def future(self) -> futurist.Future[Any]:
        """The request's own future, made on first use (the engine's executor tracks
        attempts with its own futures, so most requests never need one)."""
        with self._lock:
            if self._future is None:
                self._future = futurist.Future()
                self._future.atom = self.task  # type: ignore[attr-defined]
            return self._future

    @property
    def current_state(self) -> str:
        """The request's protocol state."""
        return self._state

    @property
    def expired(self) -> bool:
        """Whether it stayed WAITING/PENDING longer than its timeout."""
        if self._state not in WAITING_STATES or self.timeout is None:
            return False
        return self._clock() - self.created_on > self.timeout

    def set_result(self, result: Any) -> None:
        """Complete the future with ``(executed|reverted, result_or_Failure)``."""
        self.future.set_result((ACTION_TO_EVENT[self.action], result))

    def transition(self, new_state: str) -> bool:
        """Move to ``new_state``: True if moved, False if already there.

        Raises:
            InvalidState: If the lifecycle forbids the move; names the request and both states.
        """
        with self._lock:
            old = self._state
            if old == new_state:
                return False
            target = _TRANSITIONS.get((old, make_an_event(new_state)))
            if target is None:
                raise exc.InvalidState(
                    f"Request {self.request_id} for task '{self.task.name}' cannot go from"
                    f" {old} to {new_state} (event '{make_an_event(new_state)}')"
                )
            self._state = target
        LOG.debug("Request %s moved from %s to %s", self.request_id, old, target)
        return True

    def transition_and_log_error(
        self, new_state: str, logger: logging.Logger | None = None
    ) -> bool:
        """Like :meth:`transition`, but log a refused move (and return False) instead of raising."""
        try:
            return self.transition(new_state)
        except exc.InvalidState as err:
            (logger or LOG).warning("%s", err)
            return False

    def to_dict(self) -> dict[str, Any]:
        """The REQUEST body; Failures become v1 failure dicts."""
        return self.body.to_dict()

    @classmethod
    def validate(cls, data: Any) -> None:
        """Check a REQUEST body, including every failure dict it carries."""
        if not _plain_request(data):
            _check(_REQUEST, data, "Request message data")
        failures = list(data.get("failures", {}).values())
        if "result" in data:
            result = data["result"]
            if not (
                isinstance(result, (list, tuple))
                and len(result) == 2
                and result[0] in ("success", "failure")
            ):
                raise exc.InvalidFormat(
                    f"Request for task '{data['task_name']}' has a 'result' that is not"
                    " ['success', value] or ['failure', failure]"
                )
            if result[0] == "failure":
                failures.append(result[1])
        for failure in failures:
            Failure.validate(failure)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> WorkUnit:
        """Decode a **validated** REQUEST body (failure dicts become data-only Failures)."""
        result = NO_RESULT
        if "result" in data:
            kind, value = data["result"]
            result = Failure.from_dict(value) if kind == "failure" else value
        failures = data.get("failures")
        return WorkUnit(
            task_cls=data["task_cls"],
            task_name=data["task_name"],
            task_version=data["task_version"],
            action=data["action"],
            arguments=dict(data.get("arguments") or {}),
            result=result,
            failures={k: Failure.from_dict(v) for k, v in failures.items()} if failures else None,
        )


class Response(Message):
    """A worker's reply: RUNNING, EVENT (progress), SUCCESS or FAILURE."""

    TYPE = RESPONSE
    SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "state": {"type": "string", "enum": list(MACHINE.states) + [EVENT]},
            "data": {
                "anyOf": [
                    {"$ref": "#/definitions/event"},
                    {"$ref": "#/definitions/completion"},
                    {"$ref": "#/definitions/empty"},
                ]
            },
        },
        "required": ["state", "data"],
        "additionalProperties": False,
        "definitions": {
            "event": {
                "type": "object",
                "properties": {"event_type": {"type": "string"}, "details": {"type": "object"}},
                "required": ["event_type", "details"],
                "additionalProperties": False,
            },
            "empty": {"type": "object", "additionalProperties": False},
            "completion": {
                "type": "object",
                "properties": {"result": {}},
                "required": ["result"],
                "additionalProperties": False,
            },
        },
    }

    def __init__(self, state: str, **data: Any) -> None:
        self.state = state
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        """The RESPONSE body."""
        return {"state": self.state, "data": self.data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Response:
        """Decode a **validated** RESPONSE body; a FAILURE result becomes a Failure."""
        payload = dict(data["data"])
        if data["state"] == FAILURE and "result" in payload:
            payload["result"] = Failure.from_dict(payload["result"])
        return cls(data["state"], **payload)

    @classmethod
    def validate(cls, data: Any) -> None:
        """Check a RESPONSE body; unlike TaskFlow, also the nested failure of a FAILURE."""
        if not _plain_response(data):
            _check(_RESPONSE, data, "Response message data")
        state, payload = data["state"], data["data"]
        if state in (SUCCESS, FAILURE) and "result" not in payload:
            raise exc.InvalidFormat(f"Response in state {state} has no 'result' in its data")
        if state == EVENT and "event_type" not in payload:
            raise exc.InvalidFormat("Response in state EVENT has no 'event_type' in its data")
        if state == FAILURE:
            Failure.validate(payload["result"])


_RESPONSE_STATES = frozenset(Response.SCHEMA["properties"]["state"]["enum"])
_NOTIFY_RESPONSE = _compile(Notify.RESPONSE_SCHEMA)
_NOTIFY_SENDER = _compile(Notify.SENDER_SCHEMA)
_REQUEST = _compile(Request.SCHEMA)
_RESPONSE = _compile(Response.SCHEMA)
