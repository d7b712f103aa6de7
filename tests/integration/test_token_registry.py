"""The MCP server's tokens in Redis: an expired token is removed by the next command that
manages tokens (create, list, revoke), not kept in ``engram:tokens`` for good."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.services.agents.tokens import TokenRegistry, digest


async def test_expired_tokens_leave_the_registry_when_tokens_are_next_managed(redis_url: str) -> None:
    async with aioredis.Redis.from_url(redis_url) as redis:
        registry = TokenRegistry(redis)
        long_ago = datetime.now(UTC) - timedelta(days=2)
        old, _ = await registry.create(user_id="alice", expires_in=timedelta(days=1), now=long_ago)
        assert await redis.hexists(channels.TOKENS_KEY, digest(old))  # as stored, until managed
        kept, kept_record = await registry.create(user_id="bob", expires_in=timedelta(days=1))
        forever, _ = await registry.create(user_id="carol")
        assert not await redis.hexists(channels.TOKENS_KEY, digest(old)), "removed by the next create"
        assert [r.user_id for r in await registry.records()] == ["bob", "carol"]
        soon, _ = await registry.create(user_id="dave", expires_in=timedelta(seconds=1))
        later = datetime.now(UTC) + timedelta(seconds=5)
        assert [r.user_id for r in await registry.records(now=later)] == ["bob", "carol"]
        assert not await redis.hexists(channels.TOKENS_KEY, digest(soon))
        assert await registry.find(kept) == kept_record and await registry.find(forever) is not None
        assert await redis.hlen(channels.TOKENS_KEY) == 2
