"""``engram http``: the HTTP API under ``/v1`` and MCP over streamable HTTP at ``/mcp``, on one
port, behind the same bearer tokens (``engram tokens``), loopback by default and TLS for anything
else, as ``engram mcp --http``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from mcp.server.auth.provider import TokenVerifier
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.agents.mcp_server import (
    MCP_PATH,
    build_server,
    http_app,
    serve_until_stopped,
    warn_without_tls,
)
from engram_ledger.services.agents.mcp_sessions import SessionLimits
from engram_ledger.services.agents.tokens import TokensUnreachable
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.http.auth import Shares
from engram_ledger.services.http.errors import error_response
from engram_ledger.services.http.events import events_endpoint
from engram_ledger.services.http.openapi import openapi
from engram_ledger.services.http.operations import OPERATIONS
from engram_ledger.services.http.paths import SegmentRoute
from engram_ledger.services.http.routes import Front, endpoint

log = logging.getLogger("engram.http")

API_PATH = "/v1"


def rest_app(
    client: EngramClient,
    verifier: TokenVerifier,
    shares: Shares | None = None,
    *,
    cluster: bool = False,
    check_seconds: float = 5.0,
) -> Starlette:
    """The API's routes (relative to ``/v1``), each request's bearer token checked by MCP's
    backend first; the routes answer a request without a valid one 401."""
    front = Front(client, shares or Shares())
    document = openapi()

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(document)

    # Each path parameter one segment of the path as sent: an id's "/" (%2F) never picks the route.
    routes: list[Route] = [SegmentRoute(op.path, endpoint(op, front), methods=[op.method]) for op in OPERATIONS]
    routes += [
        Route("/events", events_endpoint(front, verifier, cluster=cluster, check_seconds=check_seconds)),
        Route("/openapi.json", openapi_json),
    ]
    door = Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(verifier), on_error=_unchecked)
    return Starlette(routes=routes, middleware=[door], exception_handlers={HTTPException: _no_route})


def _unchecked(conn: HTTPConnection, exc: Exception) -> Response:
    """A token the registry could not check may be good: 503 and come back, not 401."""
    if isinstance(exc, TokensUnreachable):
        return error_response(EngramError(ErrorCode.UNAVAILABLE, str(exc)))
    return error_response(EngramError(ErrorCode.INVALID_PARAMETER, str(exc)))


async def _no_route(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    what = f"{request.method} {request.url.path}"
    # An id or key holding "/" sent as it is splits into segments and matches no route.
    message = "no such route (an id or key holding '/' is sent as %2F)" if exc.status_code == 404 else f"{exc.detail}"
    return error_response(EngramError(ErrorCode.INVALID_PARAMETER, f"{what}: {message}"), exc.status_code)


def api_app(
    client: EngramClient,
    verifier: TokenVerifier,
    *,
    host: str = "127.0.0.1",
    profile: str = "engram",
    shares: Shares | None = None,
    session_limits: SessionLimits | None = None,
    session_idle_seconds: float = 300.0,
    cluster: bool = False,
    check_seconds: float = 5.0,
) -> Starlette:
    """The HTTP API under ``/v1`` and the MCP server of ``profile`` at ``/mcp``: one app, whose
    lifespan runs MCP's session manager (a mounted app's own lifespan is not run). An event
    stream's token is checked again every ``check_seconds``."""
    server = build_server(client, profile, None)
    mcp = http_app(server, verifier, host, session_idle_seconds=session_idle_seconds, limits=session_limits)
    rest = rest_app(client, verifier, shares, cluster=cluster, check_seconds=check_seconds)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with mcp.router.lifespan_context(mcp):
            yield

    return Starlette(routes=[Mount(API_PATH, rest), Mount("/", mcp)], lifespan=lifespan)


async def serve_api(
    client: EngramClient,
    verifier: TokenVerifier,
    host: str,
    port: int,
    *,
    tls: tuple[str, str] | None = None,
    profile: str = "engram",
    shares: Shares | None = None,
    session_idle_seconds: float = 300.0,
    sessions_per_token: int = 16,
    cluster: bool = False,
) -> None:
    """Until stopped (SIGINT/SIGTERM); ``tls``: certificate and key files, for anything but loopback."""
    from engram_ledger.services.ops.listening import check_port, http_url

    check_port(host, port, "--port")
    warn_without_tls("HTTP", host, tls)
    async with client:
        limits = SessionLimits(verifier, per_token=sessions_per_token)
        app = api_app(
            client,
            verifier,
            host=host,
            profile=profile,
            shares=shares,
            session_limits=limits,
            session_idle_seconds=session_idle_seconds,
            cluster=cluster,
        )
        api = http_url(host, port, API_PATH, tls is not None)
        mcp = http_url(host, port, MCP_PATH, tls is not None)
        await serve_until_stopped(
            app,
            host,
            port,
            tls,
            limits,
            "engram http: the API at %s (OpenAPI at %s/openapi.json), MCP at %s",
            api,
            api,
            mcp,
        )
