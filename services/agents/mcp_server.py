"""The MCP server: one tool profile over the official ``mcp`` SDK's low-level server.

``engram mcp --profile P --user U`` serves one user over stdio (what a desktop agent spawns).
``engram mcp --profile P --http PORT`` serves several users over streamable HTTP, and who calls
comes from authentication, never from what a request says of itself: every request carries a
bearer token (``engram tokens create``; checked by the SDK's ``mcp.server.auth`` middleware
against ``services/agents/tokens.py``), and a request without a valid one is answered 401 before
any tool runs. A user's token acts as that user only; an operator's token, or a gateway's shared
secret (only when the server is started with it), names the user per request in the
``X-Engram-User`` header. Tool results are JSON text content (and the same JSON as structured
content); a tool's own errors are results with ``is_error`` set, in requirements §4's
``{"error": {...}}`` shape, so the LLM can read and correct them. A user id the contracts refuse
is refused before anything is served: at start for stdio, with HTTP 400 for a request whose
header names one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from typing import Any

import mcp_types as types
from mcp.server.auth.provider import TokenVerifier
from mcp.server.lowlevel import Server

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.agents.mcp_sessions import SessionLimits
from engram_ledger.services.agents.specs import WRITE_TIMEOUT, ToolSpec, error
from engram_ledger.services.agents.tokens import GATEWAY_SCOPE, USER_SCOPE, TokensUnreachable
from engram_ledger.services.agents.tools import ToolDispatcher, profile
from engram_ledger.services.application.decoding import check_user_id
from engram_ledger.services.bus.client import EngramClient

log = logging.getLogger("engram.mcp")

USER_HEADER = "X-Engram-User"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def mcp_tool(spec: ToolSpec) -> types.Tool:
    """A tool spec as MCP lists it, its read-only mark as annotations."""
    return types.Tool(
        name=spec.name,
        description=spec.description,
        input_schema=spec.parameters,
        annotations=types.ToolAnnotations(
            read_only_hint=spec.read_only, destructive_hint=not spec.read_only and "forget" in spec.name
        ),
    )


# Users whose dispatchers an HTTP server keeps: every request names its user in a header, so the
# cache would otherwise grow by one for every name anyone sends.
MAX_DISPATCHERS = 1_024


class Dispatchers:
    """One ``ToolDispatcher`` per user, each keeping that user's read-your-writes token, for the
    ``limit`` users seen last; the least recently used is dropped (a dispatcher is cheap to make
    again). A user's next dispatcher starts from the latest token dropped from their partition,
    which is at or after their own last write: their reads still see it (waiting, at worst, for
    a few of another user's writes besides)."""

    def __init__(
        self, client: EngramClient, profile_name: str, session_id: str | None = None, limit: int = MAX_DISPATCHERS
    ) -> None:
        self._client = client
        self._profile = profile_name
        self._session = session_id
        self._limit = limit
        self._kept: OrderedDict[str, ToolDispatcher] = OrderedDict()
        self._dropped: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def __call__(self, user: str) -> ToolDispatcher:
        found = self._kept.get(user)
        if found is not None:
            self._kept.move_to_end(user)
            return found
        made = ToolDispatcher(self._client, user, self._profile, self._session)
        made.track(self._dropped.get(channels.partition_of(user, self._client.partitions)))
        self._kept[user] = made
        while len(self._kept) > self._limit:
            _, old = self._kept.popitem(last=False)
            self._remember(old.last_token)
        return made

    def _remember(self, token: str | None) -> None:
        if token is None:
            return
        partition, position = channels.parse_token(token)
        kept = self._dropped.get(partition)
        if kept is None or channels.parse_token(kept)[1] < position:
            self._dropped[partition] = token


def build_server(
    client: EngramClient,
    profile_name: str,
    user_id: str | None,
    session_id: str | None = None,
    dispatchers: Dispatchers | None = None,
) -> Server:
    """The MCP server of one profile: for ``user_id``, or (None) for the user each request names."""
    specs = profile(profile_name)
    dispatcher_for = dispatchers if dispatchers is not None else Dispatchers(client, profile_name, session_id)

    async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[mcp_tool(s) for s in specs])

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        user = user_id or _caller(ctx)
        spec = next((s for s in specs if s.name == params.name), None)
        timeout = spec.timeout if spec is not None else WRITE_TIMEOUT
        try:
            if user is None:
                raise EngramError(ErrorCode.INVALID_PARAMETER, f"name the user in the {USER_HEADER} header")
            result = await asyncio.wait_for(dispatcher_for(user).call(params.name, params.arguments), timeout)
        except EngramError as e:
            result = error(e.code, e.message)
        except TimeoutError:
            result = error("TIMEOUT", f"{params.name} took longer than {timeout:g} s")
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(result, ensure_ascii=False))],
            structured_content=result,
            is_error="error" in result,
        )

    return Server(
        "engram",
        version="0.1.0",
        instructions=f"Engram long-term memory, profile {profile_name!r}.",
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )


def _caller(ctx: Any) -> str | None:
    """The user a request acts as: its token's, or (operator token, gateway) the header's.
    ``BindUser`` has refused every other combination before the session saw the request."""
    request = getattr(ctx, "request", None)
    if request is None:
        return None
    return bound_user(request.scope)


def bound_user(scope: Any) -> str | None:
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser

    who = scope.get("user")
    if not isinstance(who, AuthenticatedUser):
        return None
    if USER_SCOPE in who.scopes:
        return who.access_token.subject
    named = _named(scope)
    return named[0] if named else None


def _named(scope: Any) -> list[str]:
    """The users a request's ``X-Engram-User`` headers name."""
    header = USER_HEADER.lower().encode()
    return [v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == header]


class BindUser:
    """ASGI, behind the SDK's authentication and in front of its ``RequireAuthMiddleware``: an
    authenticated request whose ``X-Engram-User`` the contracts refuse is answered 400, one whose
    user token is bound to another user than the header names 403, in plain words (a JSON-RPC
    error). An unauthenticated request passes on, to be answered 401."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
        from starlette.responses import JSONResponse

        who = scope.get("user")
        if scope["type"] == "http" and isinstance(who, AuthenticatedUser):
            named = _named(scope)
            status, message = 0, ""
            try:
                for value in named:
                    check_user_id(value, USER_HEADER)
            except EngramError as e:
                status, message = 400, e.message
            if not status and len(named) > 1:
                # A gateway that adds its header beside the caller's would otherwise act as
                # whichever came first: the caller's own choice.
                status, message = 400, f"name one user: the request has {len(named)} {USER_HEADER} headers"
            if not status and USER_SCOPE in who.scopes and any(v != who.access_token.subject for v in named):
                status = 403
                message = f"this token acts as user {who.access_token.subject!r} only; {USER_HEADER} names another"
            if status:
                reply = {"jsonrpc": "2.0", "id": None, "error": {"code": -32602, "message": message}}
                await JSONResponse(reply, status_code=status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


# Where the MCP endpoint is served over HTTP.
MCP_PATH = "/mcp"


def session_holder(scope: Any) -> str | None:
    """Who holds the sessions a request opens: its token (by id), or for the gateway's shared
    secret the user the request names; None when unauthenticated."""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser

    who = scope.get("user")
    if not isinstance(who, AuthenticatedUser):
        return None
    if GATEWAY_SCOPE in who.scopes:
        named = _named(scope)
        return f"gateway/{named[0] if named else ''}"
    return f"token/{who.access_token.client_id}"


def http_app(
    server: Server,
    verifier: TokenVerifier,
    host: str = "127.0.0.1",
    path: str = MCP_PATH,
    session_idle_seconds: float = 300.0,
    limits: SessionLimits | None = None,
) -> Any:
    """The streamable HTTP app with the SDK's bearer authentication on ``path``. No OAuth flow
    is served: tokens are issued out of band (``engram tokens create``), so the issuer named
    to the SDK is this server itself and no authorization server is advertised. A session with
    no request for ``session_idle_seconds`` is closed; ``limits`` bounds the sessions of each
    token (by default 16), and ends those of a token revoked (its ``run`` must be running)."""
    from mcp.server.auth.settings import AuthSettings
    from pydantic import AnyHttpUrl
    from starlette.routing import Route

    authority = f"[{host}]" if ":" in host else host
    auth = AuthSettings(issuer_url=AnyHttpUrl(f"http://{authority}"), resource_server_url=None)
    app = server.streamable_http_app(
        streamable_http_path=path,
        host=host,
        auth=auth,
        token_verifier=verifier,
        session_idle_timeout=session_idle_seconds,
    )
    answer_unchecked_tokens(app)
    limits = limits if limits is not None else SessionLimits(verifier)
    limits.attach(server)
    for route in app.routes:
        if isinstance(route, Route) and route.path == path:
            # The SDK's route endpoint is its RequireAuthMiddleware, which runs after the
            # authentication middleware has set scope["user"]: the binding check goes there.
            route.app = BindUser(limits.guard(route.app, session_holder))
            break
    else:  # an SDK that lays its routes out otherwise must not serve unbound requests
        raise RuntimeError(f"the MCP SDK's app has no route {path}")
    return app


# Seconds a caller is asked to wait before trying again, when its token could not be checked.
UNCHECKED_RETRY_AFTER = 5


def answer_unchecked_tokens(app: Any) -> None:
    """A token the registry could not check is answered 503 with Retry-After, in plain words:
    the SDK's authentication middleware would otherwise answer 400, or 500 for any other error.
    Its answer to an authentication error is the ``on_error`` it is built with, and Starlette
    builds its middleware on the first request: set here, before that."""
    from starlette.middleware.authentication import AuthenticationMiddleware
    from starlette.responses import JSONResponse, PlainTextResponse, Response

    def on_error(conn: Any, exc: Exception) -> Response:
        if isinstance(exc, TokensUnreachable):
            reply = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": str(exc)}}
            return JSONResponse(reply, status_code=503, headers={"Retry-After": str(UNCHECKED_RETRY_AFTER)})
        return PlainTextResponse(str(exc), status_code=400)  # Starlette's own answer

    for middleware in app.user_middleware:
        if middleware.cls is AuthenticationMiddleware:
            middleware.kwargs["on_error"] = on_error
            return
    raise RuntimeError("the MCP SDK's app has no authentication middleware: bearer tokens would go unchecked")


async def serve_stdio(client: EngramClient, profile_name: str, user_id: str, session_id: str | None) -> None:
    from mcp.server.stdio import stdio_server

    # Refused now, not on every call later: the agent's configuration is what is wrong.
    check_user_id(user_id, "--user")
    async with client:
        server = build_server(client, profile_name, user_id, session_id)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


async def serve_http(
    client: EngramClient,
    profile_name: str,
    host: str,
    port: int,
    verifier: TokenVerifier,
    tls: tuple[str, str] | None = None,
    session_idle_seconds: float = 300.0,
    sessions_per_token: int = 16,
) -> None:
    """``tls``: certificate and key files, for anything but loopback."""
    from engram_ledger.services.ops.listening import check_port, http_url

    check_port(host, port, "--http PORT")
    warn_without_tls("MCP", host, tls)
    async with client:
        server = build_server(client, profile_name, None)
        limits = SessionLimits(verifier, per_token=sessions_per_token)
        app = http_app(server, verifier, host, session_idle_seconds=session_idle_seconds, limits=limits)
        announce = (
            "engram mcp: the %s profile over streamable HTTP at %s (each request's bearer token says who "
            "calls: `engram tokens create --user U`)"
        )
        await serve_until_stopped(
            app, host, port, tls, limits, announce, profile_name, http_url(host, port, MCP_PATH, tls is not None)
        )


def warn_without_tls(what: str, host: str, tls: tuple[str, str] | None) -> None:
    if tls is None and host not in LOOPBACK:
        log.warning(
            "serving %s on %s without TLS: bearer tokens cross the network in clear; "
            "give --tls-cert and --tls-key, or put a TLS proxy in front",
            what,
            host,
        )


async def serve_until_stopped(
    app: Any,
    host: str,
    port: int,
    tls: tuple[str, str] | None,
    limits: SessionLimits,
    announce: str,
    *args: object,
) -> None:
    """Serve ``app`` with uvicorn until stopped (SIGINT/SIGTERM), checking the sessions' tokens
    (``limits``) meanwhile; once it listens, log ``announce % args``."""
    import uvicorn

    certfile, keyfile = tls if tls is not None else (None, None)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", ssl_certfile=certfile, ssl_keyfile=keyfile)
    web = uvicorn.Server(config)
    serving = asyncio.create_task(web.serve())
    stop = asyncio.Event()
    checking = asyncio.create_task(limits.run(stop))
    while not web.started and not serving.done():
        await asyncio.sleep(0.05)
    if web.started:
        log.info(announce, *args)
    try:
        await serving
    finally:
        stop.set()
        await checking
