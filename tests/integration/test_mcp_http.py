"""The MCP server over streamable HTTP, in this process (uvicorn on a free port, real HTTP, the
SDK's bearer authentication against tokens in the real Redis), where what it keeps per user can
be counted and who may call it is tried from every side."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
import uvicorn

from engram_ledger.contracts import channels
from engram_ledger.services.adapters.redis_server import free_port
from engram_ledger.services.agents.mcp_server import MAX_DISPATCHERS, USER_HEADER, Dispatchers, build_server, http_app
from engram_ledger.services.agents.mcp_sessions import SessionLimits, _sessions_of
from engram_ledger.services.agents.tokens import EngramTokenVerifier, GatewayVerifier, TokenRegistry
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService, service_settings
from tests.support import eventually, serving_task

pytestmark = pytest.mark.integration

PROTOCOL = "2025-06-18"


class McpHttp:
    """One MCP session over HTTP with one bearer token (or none); each call may name a user in
    the header (None: no header)."""

    def __init__(self, http: httpx.AsyncClient, url: str, token: str | None) -> None:
        self.http, self.url = http, url
        self.headers = {"Accept": "application/json, text/event-stream"}
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"
        self.ids = 0

    async def post(self, user: str | None, method: str, params: dict[str, Any] | None = None) -> httpx.Response:
        self.ids += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
        if not method.startswith("notifications/"):
            message["id"] = self.ids
        named = {USER_HEADER: user} if user is not None else {}
        return await self.http.post(self.url, headers={**self.headers, **named}, json=message)

    async def start(self, user: str | None) -> None:
        started = await self.post(user, "initialize", INITIALIZE)
        assert started.status_code == 200, started.text
        self.headers |= {"mcp-session-id": started.headers["mcp-session-id"], "mcp-protocol-version": PROTOCOL}
        assert (await self.post(user, "notifications/initialized")).status_code == 202

    async def call(self, user: str | None, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        answered = await self.post(user, "tools/call", {"name": tool, "arguments": arguments})
        assert answered.status_code == 200, answered.text
        data = next(line[5:] for line in answered.text.splitlines() if line.startswith("data:"))
        result: dict[str, Any] = json.loads(json.loads(data)["result"]["content"][0]["text"])
        return result


INITIALIZE = {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
GATEWAY_SECRET = "g" * 40
SESSIONS_PER_TOKEN = 4


class Front:
    """An MCP server over HTTP on a free port, checking tokens in the real Redis, and its parts."""

    def __init__(
        self,
        url: str,
        http: httpx.AsyncClient,
        registry: TokenRegistry,
        dispatchers: Dispatchers,
        limits: SessionLimits,
        server: Any,
    ) -> None:
        self.url, self.http, self.registry, self.dispatchers = url, http, registry, dispatchers
        self.limits, self.server = limits, server

    def session(self, token: str | None) -> McpHttp:
        return McpHttp(self.http, self.url, token)

    def open_sessions(self) -> set[str]:
        """The sessions the SDK's session manager holds open, whoever holds them."""
        return set(_sessions_of(self.server)._server_instances)


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` under uvicorn on a free port, until the block ends; its MCP endpoint's URL."""
    web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    running = await serving_task(web)
    try:
        yield f"http://127.0.0.1:{web.config.port}/mcp"
    finally:
        web.should_exit = True
        await running


@pytest.fixture
async def front(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Front]:
    idle = getattr(request, "param", 300.0)  # seconds a session may go without a request
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    try:
        async with EngramClient(redis_url) as client, aioredis.Redis.from_url(redis_url) as redis:
            registry = TokenRegistry(redis)
            verifier = EngramTokenVerifier(registry, GatewayVerifier(GATEWAY_SECRET))
            dispatchers = Dispatchers(client, "engram")
            server = build_server(client, "engram", None, dispatchers=dispatchers)
            limits = SessionLimits(verifier, per_token=SESSIONS_PER_TOKEN, check_seconds=0.2)
            app = http_app(server, verifier, session_idle_seconds=idle, limits=limits)
            async with serving(app) as url:
                stop = asyncio.Event()
                checking = asyncio.create_task(limits.run(stop))
                try:
                    async with httpx.AsyncClient(timeout=30) as http:
                        yield Front(url, http, registry, dispatchers, limits, server)
                finally:
                    stop.set()
                    await checking
    finally:
        await running.stop()


@pytest.fixture
async def served(front: Front) -> tuple[McpHttp, Dispatchers]:
    """A session under an operator's token, which names the user per request."""
    token, _ = await front.registry.create(user_id=None, label="test operator")
    session = front.session(token)
    await session.start("alice")
    return session, front.dispatchers


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


async def test_without_a_valid_token_every_request_is_401_and_no_tool_runs(front: Front) -> None:
    """The header alone named the user: any process reaching the port acted as anyone. Now a
    request without a token, with a made-up one, with a revoked or an expired one, is refused
    by the SDK's bearer check before the session sees it, whatever header it sends."""
    token, _ = await front.registry.create(user_id="alice")
    revoked, revoked_record = await front.registry.create(user_id="alice")
    assert await front.registry.revoke(revoked_record.id) == revoked_record
    expired, _ = await front.registry.create(
        user_id="alice", expires_in=timedelta(seconds=1), now=datetime.now(UTC) - timedelta(seconds=10)
    )
    save = {"name": "save", "arguments": {"content": "the door code is 4312"}}
    for presented in (None, "engram_not-a-token", token + "x", revoked, expired, GATEWAY_SECRET[:-1], "alice"):
        anyone = front.session(presented)
        for method, params in (("initialize", INITIALIZE), ("tools/list", {}), ("tools/call", save)):
            refused = await anyone.post("alice", method, params)
            assert refused.status_code == 401, (presented, method, refused.text)
            assert refused.headers["www-authenticate"].startswith("Bearer "), refused.headers
    # Nothing of the refused saves reached the bus.
    owner = front.session(token)
    await owner.start(None)
    assert (await owner.call(None, "list", {}))["notes"] == []


async def test_a_users_token_acts_as_that_user_only(front: Front) -> None:
    alice_token, _ = await front.registry.create(user_id="alice")
    bob_token, _ = await front.registry.create(user_id="bob")
    alice, bob = front.session(alice_token), front.session(bob_token)
    await alice.start(None)
    await bob.start("bob")  # a header naming the token's own user is allowed
    saved = await alice.call(None, "save", {"content": "Alec is my boss"})
    assert "token" in saved, saved
    assert [n["id"] for n in (await alice.call(None, "list", {}))["notes"]] == [saved["note_id"]]
    assert (await bob.call(None, "list", {}))["notes"] == [], "bob's token reads bob's memory"
    # Naming another user with a user's token is refused before any tool runs.
    stolen = await bob.post("alice", "tools/call", {"name": "list", "arguments": {}})
    assert stolen.status_code == 403, stolen.text
    assert "acts as user 'bob' only" in stolen.text
    # A session belongs to the token that opened it: another token cannot ride on it.
    riding = McpHttp(front.http, front.url, bob_token)
    riding.headers |= {k: v for k, v in alice.headers.items() if k.startswith("mcp-")}
    hijack = await riding.post(None, "tools/call", {"name": "list", "arguments": {}})
    assert hijack.status_code in (403, 404), hijack.text
    assert saved["note_id"] not in hijack.text


async def test_tokens_are_kept_as_hashes_and_revoked_from_the_next_request(front: Front, redis_url: str) -> None:
    token, record = await front.registry.create(user_id="carol", label="carol's laptop")
    session = front.session(token)
    await session.start(None)
    assert "error" not in await session.call(None, "list", {})
    async with aioredis.Redis.from_url(redis_url) as redis:
        stored = await redis.hgetall(channels.TOKENS_KEY)
    assert token.encode() not in b"".join([*stored.keys(), *stored.values()])
    assert [r.id for r in await front.registry.records()] == [record.id]
    await front.registry.revoke(record.id)
    refused = await session.post(None, "tools/call", {"name": "list", "arguments": {}})
    assert refused.status_code == 401, refused.text


async def test_a_gateways_secret_names_the_user_in_the_header(front: Front) -> None:
    """Only a server started with the gateway's secret takes the header's word, and only with
    that secret; the header must name a user the contracts accept."""
    gateway = front.session(GATEWAY_SECRET)
    await gateway.start("dave")
    saved = await gateway.call("dave", "save", {"content": "dave keeps bees"})
    assert "token" in saved, saved
    assert [n["id"] for n in (await gateway.call("dave", "list", {}))["notes"]] == [saved["note_id"]]
    assert (await gateway.call("erin", "list", {}))["notes"] == []
    unnamed = await gateway.call(None, "list", {})
    assert unnamed["error"]["code"] == "INVALID_PARAMETER" and USER_HEADER in unnamed["error"]["message"]
    bad = await gateway.post("bad user", "tools/call", {"name": "list", "arguments": {}})
    assert bad.status_code == 400 and "X-Engram-User may contain only" in bad.text, bad.text
    # A gateway that adds its header beside one the caller sent must not act as the caller's.
    message = {"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {"name": "list", "arguments": {}}}
    two = httpx.Headers({**gateway.headers})
    two.update({USER_HEADER: "dave"})
    headers = [*two.multi_items(), (USER_HEADER, "erin")]
    doubled = await front.http.post(front.url, headers=headers, json=message)
    assert doubled.status_code == 400 and "name one user" in doubled.text, doubled.text


@pytest.mark.parametrize("front", [1.0], indirect=True)
async def test_a_session_left_idle_is_closed_after_the_idle_time(front: Front) -> None:
    """An open session holds the server's memory: one that sends nothing for
    ENGRAM_MCP_SESSION_IDLE_SECONDS (here 1 s) is closed, and its id answers 404."""
    token, _ = await front.registry.create(user_id="idle-ida")
    busy, idle = front.session(token), front.session(token)
    await busy.start(None)
    await idle.start(None)
    quiet = idle.headers["mcp-session-id"]

    async def idle_one_closed() -> bool:
        # One keeps asking (each request renews its session), the other says nothing.
        assert (await busy.post(None, "tools/list")).status_code == 200
        return quiet not in front.open_sessions()

    await eventually(idle_one_closed, interval=0.1, what="the idle session closed")
    assert (await idle.post(None, "tools/list")).status_code == 404
    assert (await busy.post(None, "tools/list")).status_code == 200


async def test_one_token_cannot_take_every_session_of_the_server(front: Front) -> None:
    """A token opening sessions in a loop reached the SDK's limit for the whole server, and
    every other user was refused. Each token now holds a bounded number."""
    greedy, _ = await front.registry.create(user_id="greedy-gus")
    polite, _ = await front.registry.create(user_id="polite-pat")
    held = [front.session(greedy) for _ in range(SESSIONS_PER_TOKEN)]
    for session in held:
        await session.start(None)
    refused = await front.session(greedy).post(None, "initialize", INITIALIZE)
    assert refused.status_code == 429, refused.text
    assert "this token already holds 4 open sessions, its limit" in refused.json()["error"]["message"]
    # another user's token is not refused, nor the gateway speaking for two users
    await front.session(polite).start(None)
    for user in ("dave", "erin"):
        await front.session(GATEWAY_SECRET).start(user)
    # and once the greedy token ends a session, it may open one again
    assert (await front.http.delete(front.url, headers=held[0].headers)).status_code == 200
    await front.session(greedy).start(None)


CONCURRENT = 1_000


async def test_a_token_opening_a_thousand_sessions_at_once_gets_its_limit_and_429s(front: Front) -> None:
    """The limit was checked before a session was recorded: 150 concurrent initialize calls
    with one token opened 136 sessions, and 1,000 made the token check run out of Redis
    connections (HTTP 500). Now a place is taken before the SDK sees the request, and the token
    checks wait their turn: exactly the limit is opened, every other call is refused 429."""
    token, record = await front.registry.create(user_id="rushing-rob")
    limits = httpx.Limits(max_connections=CONCURRENT, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        calls = [McpHttp(http, front.url, token).post(None, "initialize", INITIALIZE) for _ in range(CONCURRENT)]
        answers = await asyncio.gather(*calls)
    statuses = Counter(a.status_code for a in answers)
    assert set(statuses) <= {200, 429}, {a.status_code: a.text for a in answers if a.status_code not in (200, 429)}
    assert statuses[200] == SESSIONS_PER_TOKEN, statuses
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.headers["retry-after"] == "5"
    assert "its limit" in refused.json()["error"]["message"]
    opened = {a.headers["mcp-session-id"] for a in answers if a.status_code == 200}
    assert front.open_sessions() == opened
    assert front.limits.held_by(f"token/{record.id}") == SESSIONS_PER_TOKEN
    # The refused calls gave their places back: ending one session lets the token open one again.
    one = front.session(token)
    one.headers |= {"mcp-session-id": opened.pop(), "mcp-protocol-version": PROTOCOL}
    assert (await front.http.delete(front.url, headers=one.headers)).status_code == 200
    await front.session(token).start(None)


async def test_a_token_that_cannot_be_checked_is_answered_503_not_500(redis_url: str) -> None:
    """A token check that cannot reach Redis was an unhandled error: HTTP 500. It is a 503 with
    Retry-After, in plain words: the token may be good, the caller tries again later."""
    nowhere = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    async with aioredis.Redis.from_url(nowhere) as redis:
        verifier = EngramTokenVerifier(TokenRegistry(redis))
        # No tool is called: the client is never connected.
        app = http_app(build_server(EngramClient(redis_url), "engram", None), verifier)
        async with serving(app) as url, httpx.AsyncClient(timeout=30) as http:
            answered = await McpHttp(http, url, "engram_" + "x" * 43).post(None, "initialize", INITIALIZE)
    assert answered.status_code == 503, answered.text
    assert answered.headers["retry-after"] == "5"
    assert "could not be checked" in answered.json()["error"]["message"]


async def test_a_revoked_tokens_open_sessions_and_event_streams_are_ended(front: Front) -> None:
    token, record = await front.registry.create(user_id="revoked-rita")
    session = front.session(token)
    await session.start(None)
    async with front.http.stream("GET", front.url, headers=session.headers) as events:
        assert events.status_code == 200  # the session's event stream, open
        await front.registry.revoke(record.id)
        # then the stream is closed by the server, and the session is gone
        async with asyncio.timeout(10):
            async for _ in events.aiter_bytes():
                pass
    again = await front.session(token).post(None, "initialize", INITIALIZE)
    assert again.status_code == 401
    assert front.limits.held_by(f"token/{record.id}") == 0
