"""What the HTTP API's tests share: ``engram http``'s app (the API under /v1 and MCP at /mcp) under
uvicorn on a free port, in front of a real service on the real Redis, tokens in the real registry."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import redis.asyncio as aioredis
import uvicorn

from engram_ledger.services.adapters.redis_server import free_port
from engram_ledger.services.agents.tokens import EngramTokenVerifier, TokenRegistry
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.http.app import api_app
from engram_ledger.services.http.auth import Shares


@dataclass
class Api:
    base: str
    http: httpx.AsyncClient
    registry: TokenRegistry
    shares: Shares

    async def token(self, user: str | None) -> str:
        """A new token for ``user`` (None: the operator role)."""
        token, _ = await self.registry.create(user_id=user)
        return token

    async def as_user(self, user: str) -> httpx.AsyncClient:
        """A client of the API whose requests carry a new token of ``user``."""
        return self.client(await self.token(user))

    def client(self, token: str | None, **headers: str) -> httpx.AsyncClient:
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.AsyncClient(base_url=self.base, headers=headers, timeout=30)


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` under uvicorn on a free port until the block ends; its base URL."""
    web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    running = asyncio.create_task(web.serve())
    while not web.started:
        assert not running.done(), "uvicorn did not start"
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{web.config.port}"
    finally:
        web.should_exit = True
        await running


@contextlib.asynccontextmanager
async def api_in_front_of(
    redis_url: str, shares: Shares | None = None, check_seconds: float = 5.0
) -> AsyncIterator[Api]:
    """The API in front of the service running on ``redis_url``, with an agent's client (the
    commands' stream, not the operators')."""
    shares = shares or Shares()
    async with EngramClient(redis_url, timeout=20) as client, aioredis.Redis.from_url(redis_url) as redis:
        registry = TokenRegistry(redis)
        app = api_app(client, EngramTokenVerifier(registry), shares=shares, check_seconds=check_seconds)
        async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=30) as http:
            yield Api(base, http, registry, shares)


def sse_events(lines: list[str]) -> list[dict[str, str]]:
    """Server-sent events from the lines read so far: each event's fields, in order."""
    found: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in lines:
        if not line:
            if current:
                found.append(current)
            current = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            current[name] = value.removeprefix(" ")
    return found
