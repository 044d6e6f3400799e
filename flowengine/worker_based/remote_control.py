"""Pushing a suspend (or cancel) request to a worker-based engine through its process's broker
client.

A suspend request is stored on the flow detail (:mod:`flowengine.engines.suspend_requests`),
which every engine reads between atom transitions. A worker-based engine can also be reached at
once: its process's broker client consumes one reply queue, ``<exchange>_<client uuid>``, and the
engine records that uuid and its exchange in ``running_on["broker"]``. A requester with options
for the same broker publishes a SUSPEND message (``{"flow_uuid": ...}``) to that queue; the
client hands it to the engine running that flow, which calls its own ``suspend()``. Only
flowengine engines record a reply queue, so no TaskFlow peer ever receives one; with a signing
key it is signed like every other message, and the client refuses an unsigned one.

A cancel request travels the same way: a SUSPEND whose ``action`` is ``"cancel"`` tells the
engine to read the cancel request stored with its flow now (who asked and why are there), rather
than at its next read. An engine older than this refuses the field, and reads the stored
request in its own time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from flowengine.worker_based import signing as sg
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.wire.control import ControlMessage

LOG = logging.getLogger(__name__)

#: The ``type`` property of a SUSPEND message (flowengine reply queues only).
SUSPEND = "SUSPEND"
#: Seconds a SUSPEND may wait in a queue: one its engine does not read by then is moot (the
#: stored request stands anyway).
EXPIRES = 60.0
#: What a SUSPEND asks: suspend the flow, or read its stored cancel request now.
ACTION_SUSPEND = "suspend"
ACTION_CANCEL = "cancel"


class Suspend(ControlMessage):
    """``{"flow_uuid": ..., "action": "suspend" | "cancel"}``: suspend (or cancel) the engine of
    this process that runs this flow (no ``action``: suspend)."""

    TYPE = SUSPEND
    SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"flow_uuid": {"type": "string", "minLength": 1, "maxLength": 128},
                       "action": {"enum": [ACTION_SUSPEND, ACTION_CANCEL]}},
        "required": ["flow_uuid"],
        "additionalProperties": False,
    }

    def __init__(self, flow_uuid: str, action: str = ACTION_SUSPEND) -> None:
        self.flow_uuid = flow_uuid
        self.action = action

    def to_dict(self) -> dict[str, Any]:
        """The body (a suspend says no action, as engines before cancel expect)."""
        body: dict[str, Any] = {"flow_uuid": self.flow_uuid}
        if self.action != ACTION_SUSPEND:
            body["action"] = self.action
        return body


def reach(broker: Any, reply_to: str) -> dict[str, Any]:
    """What an engine records in ``running_on["broker"]``: where its process can be told.

    Args:
        broker: Its process's :class:`~flowengine.worker_based.client.Broker`.
        reply_to: Its client's reply routing key.
    """
    return {"exchange": broker.exchange, "reply_to": reply_to,
            "url": px.mask_url(broker.url) if broker.url else None,
            "transport": None if broker.transport is None else str(broker.transport)}


def _same(where: Mapping[str, Any], own: Mapping[str, Any]) -> bool:
    url = own.get("url")
    transport = own.get("transport")
    return (own.get("exchange") == where.get("exchange")
            and (px.mask_url(url) if url else None) == where.get("url")
            and (None if transport is None else str(transport)) == where.get("transport"))


def push_suspend(running_on: Any, flow_uuid: str, broker: Mapping[str, Any] | None,
                 signing: sg.Signing | None = None, action: str = ACTION_SUSPEND) -> str | None:
    """Tell the engine recorded in ``running_on`` to suspend (or cancel) now, through the
    broker.

    Args:
        running_on: The flow's ``running_on`` record.
        flow_uuid: The flow.
        broker: The requester's broker options (``exchange``, ``url``, ``transport``,
            ``transport_options``), or None.
        signing: Signs the message (default: the key in the environment).
        action: :data:`ACTION_SUSPEND`, or :data:`ACTION_CANCEL` (the cancel request is stored
            with the flow already).

    Returns:
        What happened, one clause for a page or a terminal, or None when the engine takes
        requests from the store only (the stored request stands in every case: this only
        spares the engine waiting for its next atom transition).
    """
    where = running_on.get("broker") if isinstance(running_on, dict) else None
    if not isinstance(where, dict) or not where.get("reply_to"):
        return None
    if broker is None or not _same(where, broker):
        shown = where.get("url") or where.get("transport") or "the default broker"
        return (f"its engine listens on exchange {where.get('exchange')!r} of {shown}, not "
                "on this broker: it sees the stored request at its next atom transition")
    # Here, not at the top: the client handles the SUSPEND messages this module defines.
    from flowengine.worker_based import client as cl
    from flowengine.worker_based.broker_spec import Broker

    reach_it = Broker(str(broker["exchange"]), url=broker.get("url"),
                      transport=broker.get("transport"),
                      transport_options=broker.get("transport_options"),
                      signing=sg.Signing.from_options() if signing is None else signing)
    try:
        with cl.borrowed(reach_it) as client:
            # The reply queue exists while its process runs; declaring it here could clash
            # with its arguments (AMQP), and a queue made for a process that is gone would
            # linger.
            client.proxy.publish(Suspend(flow_uuid, action), str(where["reply_to"]),
                                 declare_queue=False, expiration=EXPIRES, retry=False)
    except Exception as err:
        LOG.warning("Could not push the %s of flow %s: %s", action, flow_uuid,
                    px.mask_url(str(err)))
        return ("its engine could not be told through the broker: it sees the stored request at "
                "its next atom transition")
    doing = "cancelling" if action == ACTION_CANCEL else "suspending"
    return f"its engine was told through the broker, and is {doing}"
