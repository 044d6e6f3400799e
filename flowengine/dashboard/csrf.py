"""Protection against cross-site requests: every action is a POST carrying a CSRF token.

Double submit: each page sets a random token in a ``SameSite=Strict`` cookie and puts the same
token in its forms; a POST is accepted only when the form's token equals the cookie's, and,
when the browser says where the request came from (``Origin``, else ``Referer``), only from
this dashboard's own address. Another site can make a browser send the cookie, but can neither
read it nor forge the matching form field.
"""

from __future__ import annotations

import hmac
import secrets
import urllib.parse

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "flowengine_csrf"
FIELD = "csrf_token"


def token(request: Request) -> str:
    """The request's CSRF token: the cookie's, or a new one (set it with :func:`remember`)."""
    found = request.cookies.get(COOKIE)
    return found if found and len(found) >= 32 else secrets.token_urlsafe(32)


def remember(response: Response, value: str) -> None:
    """Set the CSRF cookie on ``response``."""
    response.set_cookie(COOKIE, value, httponly=True, samesite="strict", path="/")


def _same_origin(request: Request) -> bool:
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source or source == "null":
        return source is None  # "null": a sandboxed or privacy-stripped cross-site request
    parts = urllib.parse.urlsplit(source)
    return parts.netloc == request.headers.get("host", "")


async def check(request: Request) -> str | None:
    """Why a POST must be refused (None: it may go on)."""
    cookie = request.cookies.get(COOKIE)
    if not cookie:
        return "no CSRF cookie: reload the page and try again"
    form = await request.form()
    sent = form.get(FIELD)
    if not isinstance(sent, str) or not hmac.compare_digest(sent, cookie):
        return "the CSRF token does not match: reload the page and try again"
    if not _same_origin(request):
        return "the request came from another site"
    return None
