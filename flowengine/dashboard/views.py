"""What the templates need beyond the data: filters, and the flows page's query string."""

from __future__ import annotations

import datetime
import json
import urllib.parse
from collections.abc import Mapping
from typing import Any

import jinja2
from starlette.datastructures import QueryParams

from flowengine.cli import formatting as fmt
from flowengine.dashboard.masking import mask_text
from flowengine.persistence import queries

#: States offered by the flows page's filter.
FLOW_STATES = ("PENDING", "RUNNING", "SUCCESS", "FAILURE", "REVERTED", "SUSPENDED", "RESUMING",
               "SUSPENDING", "REVERTING")


def _time(text: str | None, what: str) -> datetime.datetime | None:
    if not text:
        return None
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError as err:
        raise ValueError(f"{what} {text!r} is not an ISO date or time (2026-01-31T12:00)") from err
    if when.tzinfo is not None:
        when = when.astimezone(datetime.UTC).replace(tzinfo=None)
    return when


def flow_query(params: QueryParams, page_size: int) -> queries.FlowQuery:
    """The flows page's filter and page from its query string.

    Raises:
        ValueError: a parameter is malformed (the message names it).
    """
    wanted = tuple(s.upper() for s in params.getlist("state") if s)
    unknown = [s for s in wanted if s not in FLOW_STATES]
    if unknown:
        raise ValueError(f"unknown state {unknown[0]!r} (one of {', '.join(FLOW_STATES)})")
    try:
        page = int(params.get("page") or 1)
    except ValueError as err:
        raise ValueError(f"page {params.get('page')!r} is not a number") from err
    if page < 1:
        raise ValueError(f"page must be 1 or more, got {page}")
    # The pager's links carry the cursor of the row next to the page they lead to, so deep
    # pages are seeks in the index; a typed-in page number alone is an offset.
    after, before = (queries.FlowCursor.parse(params[key]) if params.get(key) else None
                     for key in ("after", "before"))
    return queries.FlowQuery(
        states=wanted, name=params.get("name") or None, uuid=params.get("uuid") or None,
        since=_time(params.get("since"), "since"), until=_time(params.get("until"), "until"),
        offset=(page - 1) * page_size, limit=page_size, after=after, before=before)


def query_params(query: queries.FlowQuery) -> str:
    """The filter as a query string (for the page links), without the page."""
    found: list[tuple[str, str]] = [("state", state) for state in query.states]
    found += [(key, getattr(query, key)) for key in ("name", "uuid") if getattr(query, key)]
    found += [(key, minutes(getattr(query, key))) for key in ("since", "until")
              if getattr(query, key) is not None]
    return urllib.parse.urlencode(found)


def cursor(value: queries.FlowCursor | None, key: str) -> str:
    """``&key=<cursor>`` for a pager link, or nothing when the row has no cursor."""
    return "" if value is None else "&" + urllib.parse.urlencode({key: value.text()})


def minutes(when: datetime.datetime | None) -> str:
    """``when`` as a ``datetime-local`` input's value."""
    return "" if when is None else when.isoformat(timespec="minutes")


def reason(err: BaseException) -> str:
    """An error as one masked line for a page."""
    return mask_text(f"{type(err).__name__}: {err}".splitlines()[0])


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _when(value: Any) -> str:
    if isinstance(value, datetime.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (int, float)):
        return fmt.timestamp(value) or "-"
    return "-" if value is None else str(value)


def _duration(seconds: Any) -> str:
    """Seconds, or milliseconds under one second (most atoms take less)."""
    if not isinstance(seconds, (int, float)):
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _ago(seconds: Any) -> str:
    return f"{seconds:.1f}s ago" if isinstance(seconds, (int, float)) else "-"


def _state_counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {state}" for state, n in counts.items())


def install_filters(env: jinja2.Environment) -> None:
    """Add the dashboard's filters to a Jinja environment."""
    env.filters.update(pretty=_pretty, when=_when, ago=_ago, duration=_duration,
                       percent=fmt.percent, state_counts=_state_counts,
                       minutes=minutes, cursor=cursor)
    env.globals.update(FLOW_STATES=FLOW_STATES)
