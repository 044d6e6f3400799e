"""The record of how a flow runs, kept in its flow detail so a resume runs it the same way.

For the worker-based engine the record holds its broker options and topics; passwords and
secret-looking transport options are stored masked (``***``), so a resume that needs them must
be given them again. ``flowengine run`` and ``engines.load`` write it; ``flowengine run
--resume`` and the dashboard read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowengine.persistence.backends._uri import mask_urls

#: The flow detail metadata key holding the record.
META_KEY = "cli_run"
#: What stands for a secret in the record.
MASK = "***"
#: Engine names (URI schemes) of the worker-based engine.
WORKER_ENGINES = frozenset({"worker-based", "workers"})
#: Transport option names containing one of these are secrets.
_SECRET_WORDS = ("password", "passwd", "secret", "token", "key", "credential", "auth")


def is_worker_based(engine: str) -> bool:
    """Whether ``engine`` (a name or an engine URI) is the worker-based engine."""
    return engine.split("://", 1)[0] in WORKER_ENGINES


def _is_secret(name: str) -> bool:
    return any(word in name.lower() for word in _SECRET_WORDS)


def record(engine: str, broker: Mapping[str, Any], topics: list[str]) -> dict[str, Any]:
    """The record of how a flow runs, with every secret masked.

    Args:
        engine: The engine name or URI.
        broker: The worker-based engine's broker options (``url``, ``exchange``, ``transport``,
            ``transport_options``, ``taskflow_compat``); ignored for other engines.
        topics: The worker-based engine's topics.
    """
    found: dict[str, Any] = {"engine": mask_urls(engine)}
    if is_worker_based(engine):
        url = broker.get("url")
        found["broker"] = {
            "url": mask_urls(url) if url else None,
            "exchange": broker.get("exchange"),
            "transport": broker.get("transport"),
            "transport_options": {k: MASK if _is_secret(k) else v
                                  for k, v in (broker.get("transport_options") or {}).items()},
            "taskflow_compat": bool(broker.get("taskflow_compat")),
        }
        found["topics"] = list(topics)
    return found
