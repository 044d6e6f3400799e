"""``flowengine dashboard``: a web page to watch and steer flows, workers and dead letters.

Needs the ``dashboard`` extra (``pip install 'flowengine[dashboard]'``). The package is small
on purpose: :mod:`.interface` holds every read and action, :mod:`.application` the routes,
:mod:`.csrf` and :mod:`.access` the protections, ``templates/`` the pages as small partials
and ``static/`` one stylesheet and one script.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"the dashboard needs the 'dashboard' extra: pip install 'flowengine[dashboard]' ({err})"
    ) from err

from flowengine.dashboard.application import create_app
from flowengine.dashboard.interface import ActionRefused, DashboardData, FlowView
from flowengine.dashboard.live import EventHub

__all__ = ["ActionRefused", "DashboardData", "EventHub", "FlowView", "create_app"]
