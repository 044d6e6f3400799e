"""Which engine, with which options, the dashboard resumes a stored flow on.

A flow saved by ``flowengine run`` carries a record of how it ran (meta ``cli_run``, see
:mod:`flowengine.cli.stored_run`): its engine and, for the worker-based engine, its broker
options and topics, with every secret masked. The dashboard resumes it on those options. A
masked secret is never used: it is taken from the dashboard's own broker options when they
name the same broker, and otherwise the resume is refused, naming what is missing. Flows
without that record fall back to meta ``engine`` (engine name and options) and the
dashboard's own broker options.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowengine.cli import stored_run
from flowengine.persistence import models
from flowengine.persistence.backends._uri import mask_urls

#: Flow detail metadata naming the engine to resume a flow on: ``{"engine": name, "options":
#: {...}}`` (broker settings are never stored there: the dashboard's own are used).
ENGINE_META = "engine"
_WORKER_ENGINES = ("worker-based", "workers")
#: Broker settings that are the dashboard's own, never taken from ``ENGINE_META`` options.
_BROKER_KEYS = ("exchange", "url", "transport", "transport_options")


class OptionsMissing(Exception):
    """A secret the flow ran with is not stored and the dashboard cannot supply it."""


def engine_options(fd: models.FlowDetail, broker: Mapping[str, Any] | None
                   ) -> tuple[str, dict[str, Any]]:
    """The engine name and ``engines.load`` options to resume ``fd`` on.

    Args:
        fd: The stored flow.
        broker: The dashboard's own broker options, or None.

    Raises:
        OptionsMissing: The flow ran with a secret that is neither stored nor the dashboard's.
    """
    saved = stored_run.stored(fd)
    if saved is not None and saved.get("engine"):
        return _from_record(fd, saved, broker)
    stored = fd.meta.get(ENGINE_META)
    if not isinstance(stored, dict):
        return "serial", {}
    name = str(stored.get("engine") or "serial")
    options = {k: v for k, v in dict(stored.get("options") or {}).items()
               if k not in _BROKER_KEYS}
    if name in _WORKER_ENGINES and broker is not None:
        options.update(broker)
    return name, options


def _from_record(fd: models.FlowDetail, saved: dict[str, Any],
                 own: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    engine = str(saved["engine"])
    if stored_run.MASK in engine:
        raise OptionsMissing(
            f"flow {fd.name!r} ran on engine {engine}, whose password is not stored; resume "
            f"it with: flowengine run --resume {fd.uuid} --engine <the engine URI>")
    if engine.split("://", 1)[0] not in _WORKER_ENGINES:
        return engine, {}
    saved_broker = dict(saved.get("broker") or {})
    same = own is not None and _same_broker(saved_broker, own)
    options = dict(saved_broker)
    url = saved_broker.get("url")
    if isinstance(url, str) and stored_run.MASK in url:
        if not same:
            raise OptionsMissing(_missing(fd, f"broker {url}, whose password is not stored",
                                          own, "--url"))
        assert own is not None
        options["url"] = own.get("url")
    hidden = sorted(k for k, v in dict(saved_broker.get("transport_options") or {}).items()
                    if v == stored_run.MASK)
    if hidden:
        given = dict((own or {}).get("transport_options") or {})
        absent = [k for k in hidden if not same or k not in given]
        if absent:
            raise OptionsMissing(_missing(
                fd, f"secret transport option(s) {', '.join(absent)}, which are not stored",
                own, "--transport-option"))
        options["transport_options"] = {**saved_broker["transport_options"],
                                        **{k: given[k] for k in hidden}}
    options["topics"] = list(saved.get("topics") or [])
    return engine, options


def _same_broker(saved: Mapping[str, Any], own: Mapping[str, Any]) -> bool:
    """Whether the dashboard's broker options name the broker the flow ran on."""
    own_url = own.get("url")
    return ((mask_urls(own_url) if own_url else None) == saved.get("url")
            and own.get("transport") == saved.get("transport"))


def _missing(fd: models.FlowDetail, what: str, own: Mapping[str, Any] | None,
             option: str) -> str:
    # Only masked URLs are named: this text reaches a page and the log.
    mine = mask_urls(str(own.get("url") or own.get("transport") or "the default broker")
                     ) if own is not None else None
    where = (f"this dashboard's broker ({mine}) is not that one" if mine is not None
             else "this dashboard has no broker options")
    return (f"flow {fd.name!r} ran with {what}, and {where}: start the dashboard with that "
            f"broker's {option}, or resume it with: flowengine run --resume {fd.uuid} {option} "
            f"...")
