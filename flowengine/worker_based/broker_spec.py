"""The identity of a process-wide broker client: how to reach one broker.

Kept apart from :mod:`~flowengine.worker_based.client` so option records and the CLI can build
and compare broker specs without the client's threads and registries.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flowengine.worker_based import backoff as bo
from flowengine.worker_based import signing as sg
from flowengine.worker_based.broker import dispatcher as dp
from flowengine.worker_based.broker import proxy as px
from flowengine.worker_based.broker.connection import TransportSpec, check_transport

__all__ = ["Broker"]


class Broker:
    """How to reach a broker: the frozen identity of a client (hashable).

    Args:
        exchange: The direct exchange workers listen on.
        url: Broker URL (None with no ``transport``: the embedded filesystem transport).
        transport: Kombu transport name or class.
        transport_options: Kombu transport options.
        retry_options: See :class:`~flowengine.worker_based.backoff.RetryOptions`.
        taskflow_compat: TaskFlow's exact queue declarations.
        signing: Signs requests and checks replies (default: the key in the environment).

    Raises:
        ValueError: A signing key with ``taskflow_compat`` (TaskFlow peers cannot sign).
    """

    __slots__ = ("exchange", "url", "transport", "transport_options", "retry",
                 "taskflow_compat", "signing", "_key")

    def __init__(self, exchange: str, url: str | None = None,
                 transport: TransportSpec | None = None,
                 transport_options: Mapping[str, Any] | None = None,
                 retry_options: Mapping[str, Any] | bo.RetryOptions | None = None,
                 taskflow_compat: bool = False, signing: sg.Signing | None = None) -> None:
        if not isinstance(exchange, str) or not exchange:
            raise ValueError(f"A broker needs an exchange name, not {exchange!r}")
        if url is not None and not isinstance(url, str):
            raise TypeError(f"Broker option 'url' must be a string, not {url!r}")
        self.exchange, self.url = exchange, url
        self.transport = check_transport(transport)
        self.transport_options = dict(transport_options or {})
        self.retry = bo.RetryOptions.from_options(retry_options)
        self.taskflow_compat = bool(taskflow_compat)
        self.signing = sg.Signing.from_options() if signing is None else signing
        if self.signing.enabled and self.taskflow_compat:
            raise ValueError("A signing key cannot be used with taskflow_compat (TaskFlow peers "
                             "neither sign nor check signatures)")
        options = json.dumps(self.transport_options, sort_keys=True, default=repr)
        self._key = (exchange, url, transport if _hashable(transport) else repr(transport),
                     options, self.retry, self.taskflow_compat, self.signing)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Broker) and other._key == self._key

    def __repr__(self) -> str:
        return f"Broker({px.mask_url(self.url)!r}, exchange={self.exchange!r})"

    def consumer(self, topic: str, type_handlers: Mapping[str, dp.Handler] | None = None,
                 **consuming: Any) -> px.Proxy:
        """A :class:`~flowengine.worker_based.broker.proxy.Proxy` on this broker that consumes
        ``<exchange>_<topic>`` with ``type_handlers``: the one place a consumer is made from
        a broker's identity (the process's client, a worker's server).

        Args:
            consuming: The Proxy's consumer options (``prefetch_count``, ``on_connected``,
                ``queue_expires``...); how to reach the broker comes from this spec.
        """
        return px.Proxy(topic, self.exchange, type_handlers, url=self.url,
                        transport=self.transport, transport_options=self.transport_options,
                        retry_options=self.retry, taskflow_compat=self.taskflow_compat,
                        signing=self.signing, **consuming)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
