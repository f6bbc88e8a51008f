"""Protections for an HTTP port on a personal machine, as pure ASGI middleware (no buffering of streams).

Order, outermost first (``install``): request metrics → ``HostGuard`` → CORS (only when origins are
configured) → ``ApiKeyGuard`` → the app. So:

The reasoning: docs/server.md, 'app/server/security.py'.
"""

from __future__ import annotations

import hmac
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.server.errors import ApiError, shape_for

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
OPEN_PATHS = frozenset({"/health"})

OnError = Callable[[ApiError], None]


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return v.decode("latin-1")
    return None


def host_name(host_header: str) -> str:
    """``"[::1]:8765"`` → ``"::1"``, ``"LocalHost:80"`` → ``"localhost"``."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """Loopback names, the bound address (unless a wildcard) and the configured extra host names."""
    names = set(LOOPBACK_HOSTS) | {host_name(h) for h in extra if h}
    if bind_host not in WILDCARD_BINDS:
        names.add(host_name(bind_host) if not bind_host.count(":") > 1 else bind_host.lower())
    return frozenset(names)


class HostGuard:
    def __init__(self, app: ASGIApp, hosts: frozenset[str], origins: Iterable[str], on_error: OnError) -> None:
        self.app, self.hosts, self.on_error = app, hosts, on_error
        self.origins = {o.rstrip("/") for o in origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            err = self._check(scope)
            if err is not None:
                self.on_error(err)
                await err.response(shape_for(scope["path"]))(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> ApiError | None:
        host = _header(scope, b"host") or ""
        if host_name(host) not in self.hosts:
            return ApiError(403, "invalid_request_error", f"Host {host!r} is not allowed; this server answers "
                            "loopback names and configured hosts only (DNS-rebinding protection)", None,
                            "host_not_allowed")
        origin = _header(scope, b"origin")
        if origin is None or "*" in self.origins or origin.rstrip("/") in self.origins:
            return None
        if urlsplit(origin).netloc.lower() == host.lower():  # same origin (a page this server serves)
            return None
        return ApiError(403, "invalid_request_error", f"Origin {origin!r} is not allowed; add it with "
                        "--cors-origin to let a web page use this server", None, "origin_not_allowed")


class ApiKeyGuard:
    def __init__(self, app: ASGIApp, api_key: str, on_error: OnError) -> None:
        self.app, self.on_error = app, on_error
        self.expected = f"Bearer {api_key}".encode()
        self.key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            got = (_header(scope, b"authorization") or "").strip().encode("latin-1")
            alt = (_header(scope, b"x-api-key") or "").strip().encode("latin-1")
            ok = hmac.compare_digest(got, self.expected) | hmac.compare_digest(alt, self.key)
            if not ok:
                err = ApiError(401, "invalid_request_error",
                               "missing API key" if not (got or alt) else "incorrect API key provided", None,
                               "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                self.on_error(err)
                await err.response(shape_for(scope["path"]))(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Cors(CORSMiddleware):
    """Starlette's CORS with the preflight answered 204 No Content (Starlette answers 200 "OK")."""

    def preflight_response(self, request_headers: Any) -> Response:
        resp = super().preflight_response(request_headers)
        if resp.status_code != 200:
            return resp
        headers = {k: v for k, v in resp.headers.items() if k not in ("content-length", "content-type")}
        return Response(status_code=204, headers=headers)


def install(app: Any, *, api_key: str | None, cors_origins: list[str], hosts: frozenset[str],
            on_error: OnError) -> None:
    """Add the middleware to a FastAPI/Starlette ``app`` (the last added runs first)."""
    if api_key:
        app.add_middleware(ApiKeyGuard, api_key=api_key, on_error=on_error)
    if cors_origins:
        app.add_middleware(Cors, allow_origins=list(cors_origins), allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["*"], expose_headers=["Retry-After"], max_age=600)
    app.add_middleware(HostGuard, hosts=hosts, origins=cors_origins, on_error=on_error)
