"""``flowengine check --backend URI``: whether the current code can resume each stored flow.

For every unfinished flow (not SUCCESS, REVERTED or FAILURE) stored with its factory, the flow
is rebuilt from the factory and compiled, and its shape compared with the one stored (see
:mod:`flowengine.migrations`). A flow whose factory no longer imports or builds, or whose
shape changed while it has progress and no migration is registered, cannot be resumed.
"""

from __future__ import annotations

import click

from flowengine import engines, states
from flowengine.cli import exits, records
from flowengine.engines import shapes
from flowengine.engines.compiler import PatternCompiler
from flowengine.persistence import models

#: Flows that ended: nothing is left to resume.
_ENDED = frozenset((states.SUCCESS, states.REVERTED, states.FAILURE))


def verdict(flow_detail: models.FlowDetail) -> list[str]:
    """Why the current code cannot resume ``flow_detail`` (one line each; empty: it can)."""
    if "factory" not in (flow_detail.meta or {}):
        return ["no factory is stored with it: only the program that made it can resume it"]
    try:
        compilation = PatternCompiler(engines.flow_from_detail(flow_detail)).compile()
    except Exception as err:  # whatever stops the code from making it is the answer
        return [f"its factory cannot make it now: {type(err).__name__}: {err}"]
    try:
        shapes.check(flow_detail, compilation)
    except shapes.FlowShapeChanged as err:
        return ["its code now yields another shape and no migration is registered for it:",
                *(f"  {line}" for line in err.change.describe())]
    return []


def check_stored(backend_uri: str) -> int:
    """Print a line per unfinished stored flow; the exit code (1 if one cannot be resumed)."""
    backend = records.open_backend(backend_uri, create=False)
    unresumable = checked = 0
    with records.reading(backend, backend_uri) as conn:
        for _book, flow_detail in records.iter_flows(conn):
            if flow_detail.state in _ENDED:
                continue
            checked += 1
            why = verdict(flow_detail)
            name = f"flow {flow_detail.name!r} ({flow_detail.uuid}, {flow_detail.state or '-'})"
            if not why:
                click.echo(f"OK: {name}")
                continue
            unresumable += 1
            click.echo(f"CANNOT RESUME: {name}: {why[0]}")
            for line in why[1:]:
                click.echo(f"  {line}")
    click.echo(f"{checked} unfinished flow(s) checked, {unresumable} cannot be resumed by "
               f"this code", err=True)
    return exits.ERROR if unresumable else exits.OK
