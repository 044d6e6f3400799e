"""The web layer: routes that read :class:`~.interface.DashboardData` and render templates.

Pages are rendered on the server; each live part of a page is also served alone as a fragment
(``?fragment=1``), which the page's script fetches again when the event stream (``/events``,
server-sent events) says something changed. Actions are POSTs with a CSRF token, refused in
read-only mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from flowengine.dashboard import access, csrf, views
from flowengine.dashboard.interface import ActionRefused, DashboardData
from flowengine.dashboard.masking import mask

LOG = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
#: Seconds between keep-alive comments on an idle event stream.
KEEPALIVE = 15.0
#: Event fields a page may receive (events are scrubbed by publishers; this is a second net).
EVENT_FIELDS = ("type", "flow_uuid", "flow_name", "atom_uuid", "task_name", "worker", "attempt",
                "action", "progress", "timestamp", "kind")
PAGE_SIZE = 50


def create_app(data: DashboardData, *, read_only: bool = False, token: str | None = None,
               allowed_hosts: list[str] | None = None) -> Starlette:
    """The dashboard as an ASGI application.

    Args:
        data: What it shows and changes.
        read_only: Hide and refuse every action, and never import a stored factory (``data``
            must allow none).
        token: Required from every request when given (see :mod:`.access`).
        allowed_hosts: Answer only requests whose ``Host`` is one of these (a page of another
            site that renamed itself to 127.0.0.1 through its DNS cannot read this one).

    Raises:
        ValueError: ``read_only`` with ``data`` allowing stored factories.
    """
    if read_only and data.factories.allows_any:
        raise ValueError("a read-only dashboard never imports a stored flow factory: make its "
                         "DashboardData without factories")
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    views.install_filters(templates.env)

    def render(request: Request, name: str, context: dict[str, Any]) -> Response:
        value = csrf.token(request)
        context.update(read_only=read_only, csrf_token=value, jobs_enabled=data.board is not None,
                       notice=request.query_params.get("notice"),
                       live=data.hub.listening.is_set(), live_error=data.hub.error,
                       fragment=request.query_params.get("fragment") == "1")
        response = templates.TemplateResponse(request, name, context)
        csrf.remember(response, value)
        response.headers["Cache-Control"] = "no-store"
        return response

    async def flows(request: Request) -> Response:
        try:
            query = views.flow_query(request.query_params, PAGE_SIZE)
        except ValueError as err:
            return PlainTextResponse(f"bad filter: {err}", status_code=400)
        page = await run_in_threadpool(data.flows, query)
        return render(request, "flows.html", {"page": page, "query": query,
                                              "params": views.query_params(query)})

    async def flow(request: Request) -> Response:
        found = await run_in_threadpool(data.flow, request.path_params["uuid"])
        if found is None:
            return PlainTextResponse(f"no flow {request.path_params['uuid']!r}", status_code=404)
        return render(request, "flow.html", {"flow": found})

    async def listing(read: Callable[[], Any]) -> tuple[Any, str | None]:
        """What ``read`` returns, or nothing and why (a broker or board that is away)."""
        try:
            return await run_in_threadpool(read), None
        except Exception as err:
            return [], views.reason(err)

    async def workers(request: Request) -> Response:
        topics, error = ((None, None) if data.broker is None else await listing(data.topics))
        return render(request, "workers.html", {"workers": data.workers(), "topics": topics,
                                                "topics_error": error})

    async def dead_letters(request: Request) -> Response:
        letters, error = await listing(data.dead_letters)
        return render(request, "dead_letters.html", {"letters": letters, "error": error})

    async def jobs(request: Request) -> Response:
        found, error = await listing(data.jobs)
        trashed, trash_error = await listing(data.trash)
        alive, conductors_error = await listing(data.conductors)
        damaged, _ = await listing(data.damaged)
        ended, ended_error = await listing(data.ended)
        orphans, orphans_error = await listing(data.orphans)
        locks, locks_error = await listing(data.locks)
        return render(request, "jobs.html", {
            "jobs": found, "trashed": trashed, "conductors": alive, "damaged": damaged,
            "ended": ended, "ended_error": ended_error or orphans_error, "orphans": orphans,
            "locks": locks, "locks_error": locks_error,
            "error": error or trash_error or conductors_error})

    def action(do: Callable[..., str], back: Callable[[Request], str],
               fields: tuple[str, ...] = ()) -> Callable[[Request], Awaitable[Response]]:
        """A POST that calls ``do(key, *fields)``: the path's one parameter, then the form's
        ``fields`` (empty when absent)."""
        async def endpoint(request: Request) -> Response:
            if read_only:
                return PlainTextResponse("read-only dashboard: actions are disabled",
                                         status_code=403)
            refused = await csrf.check(request)
            if refused is not None:
                return PlainTextResponse(f"refused: {refused}", status_code=403)
            key = next(iter(request.path_params.values()))
            form = await request.form()  # read already, for the CSRF check
            given = [str(form.get(name) or "") for name in fields]
            try:
                notice = await run_in_threadpool(do, key, *given)
            except ActionRefused as err:
                notice = f"refused: {err}"
            LOG.info("dashboard action %s: %s", request.url.path, notice)
            target = back(request)
            return RedirectResponse(f"{target}?{urllib.parse.urlencode({'notice': notice})}",
                                    status_code=303)
        return endpoint

    async def events(request: Request) -> Response:
        subscription = data.hub.subscribe(request.query_params.get("flow"))

        async def stream() -> AsyncIterator[str]:
            try:
                yield "retry: 2000\nevent: hello\ndata: {}\n\n"
                while not await request.is_disconnected():
                    try:
                        event = await asyncio.wait_for(subscription.get(), KEEPALIVE)
                    except TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    shown = mask({k: event[k] for k in EVENT_FIELDS if k in event})
                    yield f"data: {json.dumps(shown)}\n\n"
            finally:
                data.hub.unsubscribe(subscription)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def home(_request: Request) -> Response:
        return RedirectResponse("/flows", status_code=307)

    routes = [
        Route("/", home),
        Route("/flows", flows),
        Route("/flows/{uuid}", flow),
        Route("/flows/{uuid}/resume", action(data.resume, lambda r: r.url.path.rsplit("/", 1)[0]),
              methods=["POST"]),
        Route("/flows/{uuid}/suspend",
              action(data.suspend, lambda r: r.url.path.rsplit("/", 1)[0]), methods=["POST"]),
        Route("/flows/{uuid}/cancel",
              action(data.cancel, lambda r: r.url.path.rsplit("/", 1)[0], ("reason",)),
              methods=["POST"]),
        Route("/flows/{uuid}/repair",
              action(data.repair, lambda r: r.url.path.rsplit("/", 1)[0],
                     ("action", "atom", "reason")), methods=["POST"]),
        Route("/workers", workers),
        Route("/dead-letters", dead_letters),
        Route("/dead-letters/{letter}/requeue", action(data.requeue, lambda r: "/dead-letters"),
              methods=["POST"]),
        Route("/dead-letters/{letter}/discard", action(data.discard, lambda r: "/dead-letters"),
              methods=["POST"]),
        Route("/events", events),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    if data.board is not None:
        routes += [Route("/jobs", jobs),
                   Route("/jobs/trash/{job}/repost", action(data.repost, lambda r: "/jobs"),
                         methods=["POST"])]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        data.hub.start()
        try:
            yield
        finally:
            data.hub.stop()
            data.close()

    app = Starlette(routes=routes, lifespan=lifespan)
    if token:
        app.add_middleware(access.TokenRequired, token=token)
    if allowed_hosts:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)
    app.state.started = datetime.datetime.now(datetime.UTC)
    return app
