"""A store written before key layout 2 (ids with ':' or '%' named their keys differently) is
refused at start with a way out; one without such ids is simply stamped layout 2."""

from __future__ import annotations

import msgspec
import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.services.bootstrap import ConfigurationError
from tests.builders import saved
from tests.conftest import RunningService, service_settings


async def old_store(redis_url: str, user_id: str) -> None:
    """What a release before layout 2 left: a partition count and a log, no layout stamp."""
    redis = aioredis.Redis.from_url(redis_url)
    try:
        await redis.set(channels.PARTITIONS_KEY, 1)
        event = msgspec.structs.replace(saved("AAAAAAAA", "an old note"), user_id=user_id)
        await redis.xadd(channels.event_log(0), {"e": msgspec.json.encode(event), "u": user_id})
    finally:
        await redis.aclose()


async def test_an_old_store_with_colons_in_its_ids_is_refused_with_the_way_out(redis_url: str) -> None:
    await old_store(redis_url, "tg:12345")
    with pytest.raises(ConfigurationError, match="engram export"):
        await RunningService(service_settings(redis_url, index_enabled=False)).start()


async def test_an_old_store_without_such_ids_is_stamped_and_served(redis_url: str) -> None:
    await old_store(redis_url, "alice")
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    try:
        redis = aioredis.Redis.from_url(redis_url)
        assert int(await redis.get(channels.LAYOUT_KEY)) == channels.LAYOUT
        await redis.aclose()
    finally:
        await running.stop()
