"""The MCP server as an agent meets it: `engram mcp` over stdio, driven by the official SDK's
own client session, against a running `engram serve`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.support import ROOT, ServeProcess, engram_env

pytestmark = pytest.mark.e2e


@pytest.fixture
def env(redis_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    values = engram_env(ENGRAM_REDIS_URL=redis_url, ENGRAM_DATA_DIR=str(tmp_path / "data"))
    serve = ServeProcess(values).start()
    yield values
    assert serve.stop() == 0


def params(env: dict[str, str], *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "services.cli", "mcp", *args], env=env, cwd=str(ROOT)
    )


async def test_an_mcp_client_lists_and_calls_the_runtime_tools_over_stdio(env: dict[str, str]) -> None:
    server = params(env, "--profile", "runtime", "--user", "alice")
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        assert [t.name for t in listed.tools] == ["memory_search", "memory_save", "memory_update", "memory_delete"]
        search = next(t for t in listed.tools if t.name == "memory_search")
        assert search.annotations is not None and search.annotations.read_only_hint is True
        assert search.input_schema["properties"]["top_k"]["maximum"] == 20

        saved = await session.call_tool("memory_save", {"content": "User's name is Shantanu"})
        body = json.loads(saved.content[0].text)  # type: ignore[union-attr]
        assert not saved.is_error and len(body["note_id"]) == 8
        found = await session.call_tool("memory_search", {"query": "what is the user's name?"})
        hits = json.loads(found.content[0].text)["results"]  # type: ignore[union-attr]
        assert hits[0]["note_id"] == body["note_id"] and hits[0]["text"] == "User's name is Shantanu"
        missing = await session.call_tool("memory_update", {"note_id": "ZZZZZZZZ", "content": "x"})
        assert missing.is_error and json.loads(missing.content[0].text)["error"]["code"] == "MEMORY_NOT_FOUND"  # type: ignore[union-attr]


async def test_the_forget_profile_over_mcp_needs_two_calls(env: dict[str, str]) -> None:
    server = params(env, "--profile", "engram", "--user", "bob")
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        saved = json.loads((await session.call_tool("save", {"content": "Bob lives in Lisbon"})).content[0].text)  # type: ignore[union-attr]
        first = json.loads(
            (await session.call_tool("forget", {"memory_id": saved["note_id"]})).content[0].text  # type: ignore[union-attr]
        )
        assert first["status"] == "confirmation_required"
        second = json.loads(
            (await session.call_tool("forget", {"memory_id": saved["note_id"]})).content[0].text  # type: ignore[union-attr]
        )
        assert second["status"] == "forgotten" and second["deleted"] == [saved["note_id"]]
