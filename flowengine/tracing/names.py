"""Span names and attribute keys: what operators search and group traces by.

Names follow OpenTelemetry's advice of low-cardinality names: the flow, atom or task name, never
an id (ids are attributes). Attributes are namespaced ``flowengine.*``; the request's topic and
id also use the ``messaging.*`` keys of OpenTelemetry's messaging conventions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowengine.engines.engine import ActionEngine

#: ``flow <flow name>``: one engine run.
FLOW = "flow {}"
#: ``execute <atom name>`` / ``revert <atom name>``: one execution or revert of a task or retry.
EXECUTE = "execute {}"
REVERT = "revert {}"
#: ``send <task name>``: one request attempt, from its publication to its outcome (producer).
SEND = "send {}"
#: ``run <task name>``: a worker serving one request (consumer).
RUN = "run {}"
#: ``job <job name>``: a conductor running one claimed job.
JOB = "job {}"

FLOW_NAME = "flowengine.flow.name"
FLOW_UUID = "flowengine.flow.uuid"
ENGINE = "flowengine.engine"
#: The end state: SUCCESS, FAILURE, REVERTED, SUSPENDED (flows); SUCCESS, FAILURE, REVERTED,
#: REVERT_FAILURE (atoms); SUCCESS, FAILURE, lost, ... (request attempts and worker runs).
OUTCOME = "flowengine.outcome"
ATOM_NAME = "flowengine.atom.name"
ATOM_UUID = "flowengine.atom.uuid"
ATOM_KIND = "flowengine.atom.kind"
#: 1 for an atom's first execution (or revert) in this run, 2 after a retry, ...
ATOM_ATTEMPT = "flowengine.atom.attempt"
#: RETRY, REVERT or REVERT_ALL: what was decided about an atom's failure.
RETRY_DECISION = "flowengine.retry.decision"
RETRY_NAME = "flowengine.retry.name"
TASK_NAME = "flowengine.task.name"
REQUEST_ATTEMPT = "flowengine.request.attempt"
WORKER = "flowengine.worker.id"
#: Seconds between a request's publication and a worker starting it (two hosts' clocks).
QUEUE_TIME = "flowengine.request.queue_time"
MESSAGE_ID = "messaging.message.id"
DESTINATION = "messaging.destination.name"
OPERATION = "messaging.operation.type"
JOB_NAME = "flowengine.job.name"
JOB_UUID = "flowengine.job.uuid"
CONDUCTOR = "flowengine.conductor"
#: True when the job's flow was started by an earlier claim (another conductor, say).
RESUMED = "flowengine.job.resumed"

_ENGINE_KINDS = {
    "SerialActionEngine": "serial",
    "ParallelActionEngine": "parallel",
    "WorkerBasedActionEngine": "worker-based",
}


def engine_kind(engine: ActionEngine) -> str:
    """``serial``, ``parallel``, ``worker-based`` (or the class name of another engine)."""
    for cls in type(engine).__mro__:
        if cls.__name__ in _ENGINE_KINDS:
            return _ENGINE_KINDS[cls.__name__]
    return type(engine).__name__


def clean(values: Mapping[str, Any]) -> dict[str, Any]:
    """Attribute values OpenTelemetry accepts: None dropped, anything not primitive as str."""
    return {k: v if isinstance(v, (str, bool, int, float)) else str(v)
            for k, v in values.items() if v is not None}
