"""Promise 3: the history projection applies each event once in effect, and a rebuild from the
log equals the live projection."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from engram_ledger.contracts.channels import HistoryKeys
from engram_ledger.projections.history import HistoryProjection, live_generation
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.bus.client import EngramClient
from tests.builders import mixed_workload
from tests.support import dump, master_key_for_tests


async def test_rebuild_from_the_log_equals_the_live_projection(client: EngramClient, redis_url: str) -> None:
    token = await mixed_workload(client)
    await client.list_notes("user-0", after=token)  # the live projection has caught up
    redis = aioredis.Redis.from_url(redis_url)
    store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
    live = await live_generation(redis, 0)
    rebuilt = HistoryProjection(redis, 0, 99, master_key_for_tests())
    read = await rebuilt.rebuild(store)
    assert read == (await store.log_head(0))[1] > 100
    live_state = await dump(redis, 0, live)
    rebuilt_state = await dump(redis, 0, 99)
    assert len(live_state) > 50
    assert rebuilt_state == live_state
    await redis.aclose()


async def test_redelivered_and_replayed_events_change_nothing(client: EngramClient, redis_url: str) -> None:
    await mixed_workload(client, steps=40)
    redis = aioredis.Redis.from_url(redis_url)
    store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
    projection = HistoryProjection(redis, 0, 50, master_key_for_tests())
    await projection.rebuild(store)
    before = await dump(redis, 0, 50)
    everything = await store.read_log(0, "0", 10_000)
    # The same batch again: skipped by the checkpoint.
    await projection.apply(everything, live=False)
    # Every event again as if the checkpoint were lost: skipped by the note versions.
    await redis.delete(projection.keys.checkpoint)
    await projection.apply(everything, live=False)
    # Out of order: the newest first, then everything older.
    await redis.delete(projection.keys.checkpoint)
    await projection.apply(list(reversed(everything)), live=False)
    after = await dump(redis, 0, 50)
    after[b"checkpoint"] = before[b"checkpoint"]
    assert after == before
    await redis.aclose()


async def test_rebuild_while_serving_switches_without_losing_writes(client: EngramClient, redis_url: str) -> None:
    from engram_ledger.services.cli import main

    await mixed_workload(client, steps=30)
    redis = aioredis.Redis.from_url(redis_url)
    before = await live_generation(redis, 0)
    first = await client.save("writer", "written before the rebuild")
    # The service's reader now knows the old generation; it must not keep reading it after the swap.
    assert (await client.get_note("writer", first.note_id, after=first.token)).id == first.note_id

    async def keep_writing() -> list[str]:
        ids = []
        for i in range(40):
            ids.append((await client.save("writer", f"written during rebuild {i}")).note_id)
        return ids

    writes = asyncio.create_task(keep_writing())
    import os

    os.environ["ENGRAM_REDIS_URL"] = redis_url
    try:
        assert await asyncio.to_thread(main, ["rebuild", "history", "--json"]) == 0
    finally:
        del os.environ["ENGRAM_REDIS_URL"]
    ids = await writes
    last = await client.save("writer", "after the rebuild")
    listing = await client.list_notes("writer", after=last.token)
    assert [n.id for n in listing.notes] == [first.note_id, *ids, last.note_id]
    # Point reads too (they check the live generation inside the read itself).
    assert (await client.get_note("writer", first.note_id, after=last.token)).content == "written before the rebuild"
    hits = await client.search("writer", "written before the rebuild", after=last.token)
    assert first.note_id in [h.note_id for h in hits.results]
    after = await live_generation(redis, 0)
    assert after != before
    assert [k async for k in redis.scan_iter(match=f"{HistoryKeys(0, before).prefix}*")] == []
    await redis.aclose()
