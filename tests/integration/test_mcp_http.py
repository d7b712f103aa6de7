"""The MCP server over streamable HTTP, in this process (uvicorn on a free port, real HTTP), where
what it keeps per user can be counted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn

from services.adapters.redis_server import free_port
from services.agents.mcp_server import MAX_DISPATCHERS, USER_HEADER, Dispatchers, RefuseBadUsers, build_server
from services.bus.client import EngramClient
from tests.conftest import RunningService, service_settings

pytestmark = pytest.mark.integration

PROTOCOL = "2025-06-18"


class McpHttp:
    """One MCP session over HTTP; each call may name another user in the header."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http, self.url = http, url
        self.headers = {"Accept": "application/json, text/event-stream"}
        self.ids = 0

    async def post(self, user: str, method: str, params: dict[str, Any] | None = None) -> httpx.Response:
        self.ids += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
        if not method.startswith("notifications/"):
            message["id"] = self.ids
        return await self.http.post(self.url, headers={**self.headers, USER_HEADER: user}, json=message)

    async def start(self, user: str) -> None:
        info = {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
        started = await self.post(user, "initialize", info)
        assert started.status_code == 200, started.text
        self.headers |= {"mcp-session-id": started.headers["mcp-session-id"], "mcp-protocol-version": PROTOCOL}
        assert (await self.post(user, "notifications/initialized")).status_code == 202

    async def call(self, user: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        answered = await self.post(user, "tools/call", {"name": tool, "arguments": arguments})
        assert answered.status_code == 200, answered.text
        data = next(line[5:] for line in answered.text.splitlines() if line.startswith("data:"))
        result: dict[str, Any] = json.loads(json.loads(data)["result"]["content"][0]["text"])
        return result


@pytest.fixture
async def served(redis_url: str) -> AsyncIterator[tuple[McpHttp, Dispatchers]]:
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    try:
        async with EngramClient(redis_url) as client:
            dispatchers = Dispatchers(client, "engram")
            app = RefuseBadUsers(build_server(client, "engram", None, dispatchers=dispatchers).streamable_http_app())
            web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
            serving = asyncio.create_task(web.serve())
            while not web.started:
                assert not serving.done(), "uvicorn did not start"
                await asyncio.sleep(0.01)
            try:
                async with httpx.AsyncClient(timeout=30) as http:
                    session = McpHttp(http, f"http://127.0.0.1:{web.config.port}/mcp")
                    await session.start("alice")
                    yield session, dispatchers
            finally:
                web.should_exit = True
                await serving
    finally:
        await running.stop()


async def test_an_http_server_keeps_dispatchers_for_a_bounded_number_of_users(
    served: tuple[McpHttp, Dispatchers],
) -> None:
    """A dispatcher was kept for every user header ever sent: 5,000 junk names made 5,000. Now
    the least recently used are dropped past MAX_DISPATCHERS, and a user's reads still see their
    own writes after their dispatcher was dropped."""
    session, dispatchers = served
    saved = await session.call("alice", "save", {"content": "Alec is my boss"})
    assert "token" in saved, saved
    for i in range(2 * MAX_DISPATCHERS):
        refused = await session.call(f"junk-{i}", "list", {"bogus": 1})  # refused before the bus
        assert refused["error"]["code"] == "INVALID_PARAMETER"
    assert len(dispatchers) == MAX_DISPATCHERS
    listed = await session.call("alice", "list", {})
    assert [n["id"] for n in listed["notes"]] == [saved["note_id"]]
    assert dispatchers("alice").last_token == saved["token"], "the dropped token carried over"
