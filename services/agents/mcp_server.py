"""The MCP server: one tool profile over the official ``mcp`` SDK's low-level server.

``engram mcp --profile P --user U`` serves one user over stdio (what a desktop agent spawns).
``engram mcp --profile P --http PORT`` serves several users over streamable HTTP; the user is
then named per request by the ``X-Engram-User`` header. Tool results are JSON text content (and
the same JSON as structured content); a tool's own errors are results with ``is_error`` set, in
requirements §4's ``{"error": {...}}`` shape, so the LLM can read and correct them. A user id the
contracts refuse is refused before anything is served: at start for stdio, with HTTP 400 for a
request (the session's first among them) whose header names one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server

from contracts import channels
from contracts.errors import EngramError, ErrorCode
from services.agents.specs import WRITE_TIMEOUT, ToolSpec, error
from services.agents.tools import ToolDispatcher, profile
from services.application.decoding import check_user_id
from services.bus.client import EngramClient

log = logging.getLogger("engram.mcp")

USER_HEADER = "X-Engram-User"


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
        user = user_id or _header_user(ctx)
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


def _header_user(ctx: Any) -> str | None:
    request = getattr(ctx, "request", None)
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    value = headers.get(USER_HEADER.lower())
    return str(value) if value else None


class RefuseBadUsers:
    """ASGI middleware: a request whose header names a user id the contracts refuse is answered
    400 with the reason in plain words (a JSON-RPC error), before a session is made for it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.responses import JSONResponse

        if scope["type"] == "http":
            named = [v for k, v in scope.get("headers", []) if k.lower() == USER_HEADER.lower().encode()]
            try:
                for value in named:
                    check_user_id(value.decode("latin-1"), USER_HEADER)
            except EngramError as e:
                reply = {"jsonrpc": "2.0", "id": None, "error": {"code": -32602, "message": e.message}}
                await JSONResponse(reply, status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def serve_stdio(client: EngramClient, profile_name: str, user_id: str, session_id: str | None) -> None:
    from mcp.server.stdio import stdio_server

    # Refused now, not on every call later: the agent's configuration is what is wrong.
    check_user_id(user_id, "--user")
    async with client:
        server = build_server(client, profile_name, user_id, session_id)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


async def serve_http(client: EngramClient, profile_name: str, host: str, port: int) -> None:
    import uvicorn

    async with client:
        server = build_server(client, profile_name, None)
        app = RefuseBadUsers(server.streamable_http_app(host=host))
        config = uvicorn.Config(app, host=host, port=port, log_level="warning")
        await uvicorn.Server(config).serve()
