"""More callers at once than a client has connections wait for one, not fail: 200 HTTP clients at
once against one `engram http` are more than redis-py's 100 connections."""

from __future__ import annotations

import asyncio

from engram_ledger.services.adapters.redis_conn import open_redis


async def test_callers_past_the_pools_connections_wait_for_one(redis_url: str) -> None:
    redis = open_redis(redis_url, max_connections=2)
    try:
        # Each BLPOP holds its connection until it times out: six at once need three rounds.
        answers = await asyncio.gather(*(redis.blpop([f"engram-test:empty:{i}"], timeout=0.2) for i in range(6)))
        assert answers == [None] * 6
    finally:
        await redis.aclose()
