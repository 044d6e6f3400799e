"""Who may use the dashboard: anyone on a loopback address, or whoever holds the token.

With ``--token``, every request must present it: as ``Authorization: Bearer <token>``, as the
password of HTTP basic auth (any user name), or once as ``?token=`` in a browser, which sets an
HttpOnly cookie and redirects to the same address without it (so it stays out of history).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import urllib.parse

from starlette.datastructures import URL
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "flowengine_auth"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address to bind) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _digest(token: str) -> str:
    # The cookie holds a digest, so a leaked cookie file does not leak the token itself.
    return hashlib.sha256(f"flowengine-dashboard:{token}".encode()).hexdigest()


def presented(conn: HTTPConnection) -> str | None:
    """The token a request presents (bearer or basic auth password), if any."""
    header = conn.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        import base64
        import binascii

        try:
            decoded = base64.b64decode(value.strip()).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2]
    return None


class TokenRequired:
    """ASGI middleware refusing requests without the token (401, naming how to give it).

    The 401 carries no ``WWW-Authenticate`` challenge, so a browser shows how to give the token
    instead of a password prompt; clients that send basic auth unasked (``curl -u``) still work.
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self._token, self._cookie = app, token, _digest(token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        given = presented(conn)
        if given is not None and hmac.compare_digest(given, self._token):
            await self.app(scope, receive, send)
            return
        cookie = conn.cookies.get(COOKIE, "")
        if cookie and hmac.compare_digest(cookie, self._cookie):
            await self.app(scope, receive, send)
            return
        query = conn.query_params.get("token")
        if query is not None and hmac.compare_digest(query, self._token):
            await self._enter(conn)(scope, receive, send)
            return
        await PlainTextResponse(
            "This dashboard needs its token: open it with ?token=..., or send it as a bearer "
            "token or basic auth password.\n", status_code=401)(scope, receive, send)

    def _enter(self, conn: HTTPConnection) -> Response:
        url = URL(scope=conn.scope)
        rest = [(k, v) for k, v in conn.query_params.multi_items() if k != "token"]
        target = url.path + (f"?{urllib.parse.urlencode(rest)}" if rest else "")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, self._cookie, httponly=True, samesite="strict", path="/")
        return response
