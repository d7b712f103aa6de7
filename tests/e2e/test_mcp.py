"""The MCP server as an agent meets it: `engram mcp` over stdio, driven by the official SDK's
own client session, against a running `engram serve`."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from engram_ledger.services.agents.specs import MIN_RELEVANCE
from engram_ledger.services.application.relevance import DEFAULT_FLOOR
from tests.support import ENGRAM_CLI, ROOT, ServeProcess, cli, engram_env, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def env(shared_bus: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One `engram serve` for the module (on each bus); each test works on users of its own."""
    values = engram_env(**shared_bus, ENGRAM_DATA_DIR=str(tmp_path_factory.mktemp("engram") / "data"))
    serve = ServeProcess(values).start()
    # The model loads in the background at start (6-9 s here); tool timeouts are 10-15 s, so
    # the tests begin once the index answers, as an agent would after a warm start.
    wait_until(lambda: cli(values, "search", "--user", "warm-up", "anything")[0] == 0, timeout=90, interval=0.5)
    yield values
    assert serve.stop() == 0


def params(env: dict[str, str], *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "engram_ledger.services.cli", "mcp", *args], env=env, cwd=str(ROOT)
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


async def test_over_mcp_a_search_that_matches_nothing_says_so_and_the_floor_off_ranks_everything(
    env: dict[str, str],
) -> None:
    server = params(env, "--profile", "engram", "--user", "alice-floor")
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.call_tool("save", {"content": "Alice's manager is Alec Torres"})
        await session.call_tool("save", {"content": "Alice keeps bees on her roof"})
        asked = {"query": "What is the capital of Peru?"}
        nothing = json.loads((await session.call_tool("search", asked)).content[0].text)  # type: ignore[union-attr]
        assert nothing["results"] == []
        assert nothing["message"].startswith("No memory matched 'What is the capital of Peru?'")
        every = json.loads((await session.call_tool("search", {**asked, "min_relevance": 0})).content[0].text)  # type: ignore[union-attr]
        assert len(every["results"]) == 2 and "message" not in every
        assert all(0 <= hit["relevance"] < DEFAULT_FLOOR for hit in every["results"]), every
        found = json.loads((await session.call_tool("search", {"query": "who is Alice's manager?"})).content[0].text)  # type: ignore[union-attr]
        best, *rest = found["results"]
        assert best["content"] == "Alice's manager is Alec Torres" and best["relevance"] > 0.5
        assert all(h["relevance"] < best["relevance"] for h in rest)
        listed = await session.list_tools()
        search = next(t for t in listed.tools if t.name == "search")
        assert search.input_schema["properties"]["min_relevance"] == {**MIN_RELEVANCE}


async def test_the_engram_profiles_forget_over_mcp_needs_two_calls_and_takes_the_saved_note_id(
    env: dict[str, str],
) -> None:
    """Within a profile an id has one name: ``save`` answers ``note_id`` and ``forget`` takes it."""
    server = params(env, "--profile", "engram", "--user", "bob")
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        saved = json.loads((await session.call_tool("save", {"content": "Bob lives in Lisbon"})).content[0].text)  # type: ignore[union-attr]
        first = json.loads(
            (await session.call_tool("forget", {"note_id": saved["note_id"]})).content[0].text  # type: ignore[union-attr]
        )
        assert first["status"] == "confirmation_required"
        assert first["pending"][0]["note_id"] == saved["note_id"]
        second = json.loads(
            (await session.call_tool("forget", {"note_id": saved["note_id"]})).content[0].text  # type: ignore[union-attr]
        )
        assert second["status"] == "forgotten" and second["deleted"] == [saved["note_id"]]


async def test_what_an_llm_got_wrong_is_answered_in_plain_words_naming_its_parameter(env: dict[str, str]) -> None:
    """The LLM reads the error to correct its call: the tool's own parameter and the allowed range or
    shape, never a contract's field (top_k, note_id) or a validator's jargon."""
    server = params(env, "--profile", "memento", "--user", "erin")
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for tool, arguments, says in (
            (
                "search_memories",
                {"query": "bees", "limit": 1000},
                "limit must be a whole number from 1 to 20; you gave 1000",
            ),
            (
                "search_memories",
                {"query": "bees", "limit": None},
                "limit must be a whole number from 1 to 20; you gave null",
            ),
            (
                "supersede_memory",
                {"old_memory_id": "nope", "new_memory_id": "AAAAAAAA"},
                "old_memory_id must be a memory id: 8 letters or digits",
            ),
            ("store_memory", {"content": "   "}, "content must not be blank"),
        ):
            result = await session.call_tool(tool, arguments)
            error = json.loads(result.content[0].text)["error"]  # type: ignore[union-attr]
            assert result.is_error and error["code"] == "INVALID_PARAMETER", error
            assert error["message"].startswith(f"bad arguments for {tool}: ") and says in error["message"], error
            assert (
                "top_k" not in error["message"] and "note_id" not in error["message"] and "$." not in error["message"]
            )


def test_mcp_refuses_a_user_id_the_contract_refuses_at_start(env: dict[str, str]) -> None:
    """Not later, on every call: the agent's configuration is what is wrong."""
    done = subprocess.run(
        [*ENGRAM_CLI, "mcp", "--profile", "memento", "--user", "bad user"],
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--user may contain only ASCII letters, digits and . _ : @ + / = | - (no spaces); you gave 'bad user'" in (
        done.stderr
    ), done.stderr


async def test_streamable_http_serves_each_token_its_own_users_memory(env: dict[str, str]) -> None:
    """`engram tokens create` issues a token per user; the SDK's own HTTP client presents it;
    each sees only its own memory; without a token, or once revoked, the server answers 401."""
    import httpx
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    from engram_ledger.services.adapters.redis_server import free_port

    port = free_port()
    server = subprocess.Popen(
        [*ENGRAM_CLI, "mcp", "--profile", "memento", "--http", str(port)],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        wait_until(lambda: _answers(port), timeout=30)
        code, earlier, _ = cli(env, "tokens", "list")  # the module's other tests may have made some
        assert code == 0
        ids, tokens = {}, {}
        for user in ("carol", "dave"):
            code, made, err = cli(env, "tokens", "create", "--user", user, "--label", f"{user}'s agent")
            assert code == 0, err
            assert made["user_id"] == user and made["role"] == "user" and made["token"].startswith("engram_")
            tokens[user] = made
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {made['token']}"})
            async with (
                http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                stored = await session.call_tool("store_memory", {"content": f"{user} keeps bees"})
                body = json.loads(stored.content[0].text)  # type: ignore[union-attr]
                assert "created" in body, body
                ids[user] = body["created"]["id"]
                recent = await session.call_tool("list_recent_memories", {})
                memories = json.loads(recent.content[0].text)["memories"]  # type: ignore[union-attr]
                assert [m["id"] for m in memories] == [ids[user]], "each token sees only its user's memory"

        code, listed, _ = cli(env, "tokens", "list")
        made_now = [t["id"] for t in listed["tokens"] if t["id"] not in {e["id"] for e in earlier["tokens"]}]
        assert code == 0 and made_now == [tokens["carol"]["id"], tokens["dave"]["id"]]
        assert all("token" not in t for t in listed["tokens"]), "a token is shown once, when made"

        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        accept = {"Accept": "application/json, text/event-stream"}
        # The header that used to be enough names nobody now.
        anyone = httpx.post(url, headers={**accept, "X-Engram-User": "carol"}, json=initialize)
        assert anyone.status_code == 401, anyone.text
        code, revoked, _ = cli(env, "tokens", "revoke", tokens["carol"]["id"])
        assert code == 0 and revoked["revoked"]["id"] == tokens["carol"]["id"]
        bearer = {**accept, "Authorization": f"Bearer {tokens['carol']['token']}"}
        assert httpx.post(url, headers=bearer, json=initialize).status_code == 401
        bearer = {**accept, "Authorization": f"Bearer {tokens['dave']['token']}"}
        assert httpx.post(url, headers=bearer, json=initialize).status_code == 200
        code, out, _ = cli(env, "tokens", "revoke", tokens["carol"]["id"])
        assert code != 0 and "no token has the id" in out["error"]["message"], out
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_tokens_create_refuses_what_names_nobody_or_everybody(env: dict[str, str]) -> None:
    code, out, _ = cli(env, "tokens", "create")
    assert code != 0 and "give --user USER, or --operator" in out["error"]["message"], out
    code, out, _ = cli(env, "tokens", "create", "--user", "bad user")
    assert code != 0 and "--user may contain only ASCII letters" in out["error"]["message"], out
    code, made, err = cli(env, "tokens", "create", "--operator", "--expires-in-days", "1")
    assert code == 0 and made["role"] == "operator" and made["user_id"] is None and made["expires_at"], err


def test_over_tls_a_gateway_with_the_shared_secret_names_the_user(env: dict[str, str], tmp_path: Path) -> None:
    """Beyond loopback: HTTPS from the CLI's --tls-cert/--tls-key; a gateway that authenticates
    people itself presents the secret it was started with and names the user in the header."""
    import httpx

    from engram_ledger.services.adapters.redis_server import free_port
    from tests.integration.test_secure_redis import write_certificates

    ca, certificate, key = write_certificates(tmp_path)
    secret = tmp_path / "gateway.secret"
    secret.write_text("s" * 48 + "\n")
    port = free_port()
    server = subprocess.Popen(
        [
            *(*ENGRAM_CLI, "mcp", "--profile", "memento", "--http", str(port)),
            *("--tls-cert", str(certificate), "--tls-key", str(key), "--gateway-secret-file", str(secret)),
        ],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: _answers(port), timeout=30)
        url = f"https://127.0.0.1:{port}/mcp"
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
        accept = {"Accept": "application/json, text/event-stream", "X-Engram-User": "erin"}
        with httpx.Client(verify=ssl.create_default_context(cafile=str(ca)), timeout=30) as https:
            assert https.post(url, headers=accept, json=initialize).status_code == 401
            wrong = https.post(url, headers={**accept, "Authorization": "Bearer " + "s" * 47}, json=initialize)
            assert wrong.status_code == 401
            started = https.post(url, headers={**accept, "Authorization": "Bearer " + "s" * 48}, json=initialize)
            assert started.status_code == 200, started.text
            assert '"serverInfo"' in started.text
        # No plain HTTP on the TLS port: the server drops it (as a protocol error, or a reset).
        with pytest.raises((httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError)):
            httpx.post(f"http://127.0.0.1:{port}/mcp", headers=accept, json=initialize, timeout=10)
    finally:
        server.terminate()
        server.wait(timeout=20)


def _answers(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
