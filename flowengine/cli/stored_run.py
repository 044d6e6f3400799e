"""What ``flowengine run`` stores about how a flow ran, so ``--resume`` runs it the same way.

A new flow saved by ``run --backend`` records its engine, and for the worker-based engine its
broker options and topics, in its flow detail's metadata. Passwords and secret-looking transport
options are stored masked (``***``): a resume that needs them must be given them again. A
resume uses the stored value of every option the command line and environment leave unset.
"""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from flowengine.cli import telemetry
from flowengine.engines import run_record
from flowengine.persistence import models
from flowengine.persistence.backends._uri import mask_urls

#: The flow detail metadata key holding the record.
META_KEY = run_record.META_KEY
#: What stands for a secret in the record.
MASK = run_record.MASK
#: The record of how a flow runs, with every secret masked.
record = run_record.record
_BROKER_KEYS = ("url", "exchange", "transport", "transport_options", "taskflow_compat")
# The click parameter names of what a resume may take from the record.
_PARAMETERS = ("engine_name", "topics", *_BROKER_KEYS)


def explicit_options(ctx: click.Context) -> frozenset[str]:
    """The options of ``run`` given on the command line or in the environment."""
    given = set()
    for name in _PARAMETERS:
        source = ctx.get_parameter_source(name)
        if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT,
                      ParameterSource.PROMPT):
            given.add(name)
    return frozenset(given)


def stored(flow_detail: models.FlowDetail) -> dict[str, Any] | None:
    """The record saved with ``flow_detail``, if ``run`` saved one."""
    found = flow_detail.meta.get(META_KEY)
    return found if isinstance(found, dict) else None


def needs_url(broker: dict[str, Any]) -> bool:
    """Whether the broker URL holds a password (which no record keeps)."""
    url = broker.get("url")
    return isinstance(url, str) and mask_urls(url) != url


def merge(saved: dict[str, Any], engine: str, broker: dict[str, Any], topics: list[str],
          explicit: frozenset[str]) -> tuple[str, dict[str, Any], list[str]]:
    """The engine, broker options and topics of a resume: what is given, else what is saved.

    Raises:
        click.UsageError: a saved secret is needed but was not given again.
    """
    if "engine_name" not in explicit and saved.get("engine"):
        engine = str(saved["engine"])
        if MASK in engine:
            raise click.UsageError(
                f"the flow ran on engine {engine}, whose password is not stored: give "
                f"--engine again to resume it")
    merged = dict(broker)
    for key, value in (saved.get("broker") or {}).items():
        if key in _BROKER_KEYS and key not in explicit:
            merged[key] = value
    if "topics" not in explicit and saved.get("topics"):
        topics = list(saved["topics"])
    if not telemetry.is_worker_based(engine):
        return engine, merged, topics
    if "url" not in explicit and MASK in str(merged.get("url") or ""):
        raise click.UsageError(
            f"the flow ran on broker {merged['url']}, whose password is not stored: give "
            f"--url (or FLOWENGINE_URL) to resume it")
    hidden = sorted(k for k, v in (merged.get("transport_options") or {}).items() if v == MASK)
    if hidden:
        raise click.UsageError(
            f"the flow ran with secret transport option(s) {', '.join(hidden)}, which are not "
            f"stored: give --transport-option again to resume it")
    return engine, merged, topics
