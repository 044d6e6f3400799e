"""What a dead letter keeps, and for how long: no secret in clear, and an expiry.

A request is parked with its secret arguments (those its :data:`~flowengine.worker_based.
secret_arguments.HEADER_SECRET_ARGS` header names) *removed* from its body, and every form of
their values masked in what remains (a revert's ``result`` and ``failures``). Such a letter
cannot be sent again as it is: the task would run without its arguments. It is re-run inside
its resumed flow instead, which asks for its secret inputs again (``flowengine dead-letters
requeue --resume``).

A dead letter expires :data:`DEFAULT_TTL` (14 days) after it is parked, or after the
engine's ``dead_letter_ttl``. Brokers with a native message TTL drop it themselves (RabbitMQ:
the message's ``expiration``, and flowengine-fs); on the others (Redis, beanstalkd's buried
jobs, kombu's memory transport) the expiry travels in header :data:`HEADER_DEAD_EXPIRES` and
expired letters are swept out whenever dead letters are parked, listed or requeued.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flowengine import exceptions as exc
from flowengine.worker_based import extensions as ext
from flowengine.worker_based import secret_arguments as sa

__all__ = ["DEFAULT_TTL", "HEADER_DEAD_EXPIRES", "RequeueRefused", "expired", "expires_at",
           "kept_body", "removed_secrets"]

#: Seconds a dead letter is kept, unless the engine's ``dead_letter_ttl`` says otherwise.
DEFAULT_TTL = 14 * 24 * 3600.0
#: Dead-letter header: UNIX time after which the letter is dropped.
HEADER_DEAD_EXPIRES = "x-flowengine-dead-expires"


def kept_body(body: Mapping[str, Any], secret: Iterable[str]) -> dict[str, Any]:
    """The REQUEST ``body`` as a dead letter keeps it: the ``secret`` arguments removed, and
    their values masked wherever else they appear (a revert's result and failures)."""
    names = set(secret)
    arguments = body.get("arguments")
    if not names or not isinstance(arguments, Mapping):
        return dict(body)
    masker = sa.masker(arguments, names)
    kept = {key: masker.value(value) for key, value in body.items() if key != "arguments"}
    kept["arguments"] = {k: masker.value(v) for k, v in arguments.items() if k not in names}
    return kept


def removed_secrets(body: Mapping[str, Any], headers: Mapping[str, Any]) -> list[str]:
    """The secret arguments a parked request's body no longer holds."""
    arguments = body.get("arguments")
    held = arguments if isinstance(arguments, Mapping) else {}
    return sorted(name for name in sa.names(headers) if name not in held)


def expires_at(headers: Mapping[str, Any]) -> float | None:
    """When a dead letter expires (letters parked before expiries existed: from their
    parking time and the default); None if it cannot be told."""
    for value in (headers.get(HEADER_DEAD_EXPIRES), _plus_default(headers.get(ext.HEADER_DEAD_AT))):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _plus_default(parked_at: Any) -> Any:
    if isinstance(parked_at, (int, float)) and not isinstance(parked_at, bool):
        return parked_at + DEFAULT_TTL
    return None


def expired(headers: Mapping[str, Any], now: float) -> bool:
    """Whether the dead letter with ``headers`` has expired at UNIX time ``now``."""
    when = expires_at(headers)
    return when is not None and now >= when


class RequeueRefused(exc.InvalidState):
    """A dead letter cannot be sent again as it is; the message says why and what to do."""
