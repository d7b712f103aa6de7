"""Rebuilding a projection from the log (`engram rebuild history|index`): a fresh generation is
filled from position zero, then made live; queries use the old one until the switch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.crypto import SubjectMatcher, load_master_key
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.adapters.keyring import attach_for_operator
from engram_ledger.services.adapters.redis_conn import unlink_prefix
from engram_ledger.services.config import Settings

# (what, how many events) -> a callback told how many were applied, and a closer
Progress = Callable[[str, int], Any]


def event_store(redis: Redis, settings: Settings, partitions: int) -> RedisEventStore:
    return RedisEventStore(redis, partitions, settings.idempotency_ttl_seconds, load_master_key(settings.data_dir))


async def rebuild_history(redis: Redis, settings: Settings, partitions: int, progress: Progress) -> dict[str, Any]:
    from engram_ledger.contracts.channels import HistoryKeys
    from engram_ledger.projections.history import HistoryProjection, live_generation

    store = event_store(redis, settings, partitions)
    master = load_master_key(settings.data_dir)
    await attach_for_operator(redis, master)  # a keyring without generation 1 finds its root there
    total = 0
    generations = {}
    for p in range(partitions):
        _, length = await store.log_head(p)
        previous = await live_generation(redis, p)
        generation = int(await redis.incr(HistoryKeys(p, 0).generations))
        projection = HistoryProjection(redis, p, generation, master)
        with progress(f"history partition {p}", length) as bar:
            total += await projection.rebuild(store, progress=bar.update)
        if not await projection.make_live(previous):
            raise EngramError(ErrorCode.STORAGE_ERROR, f"another rebuild of partition {p} finished first")
        generations[str(p)] = generation
    return {"projection": "history", "events": total, "generations": generations}


async def rebuild_index(redis: Redis, settings: Settings, partitions: int, progress: Progress) -> dict[str, Any]:
    """Embed the whole log into a fresh generation (a new shard directory or collection, and its
    timeline's), then switch every partition to it; a running `engram serve` follows within a
    second."""
    from engram_ledger.contracts.channels import GENERATIONS_KEY, IndexKeys, TimelineKeys
    from engram_ledger.projections.index import IndexProjection, live_index_generation
    from engram_ledger.projections.index_runtime import record_model, switch_generation
    from engram_ledger.projections.timeline import TimelineProjection
    from engram_ledger.projections.tracking import TrackedProjection, rebuild_together
    from engram_ledger.services.bootstrap import build_index_runtime

    settings = Settings(**{**settings.__dict__, "partitions": partitions})
    master = load_master_key(settings.data_dir)
    await attach_for_operator(redis, master)
    store = RedisEventStore(redis, partitions, settings.idempotency_ttl_seconds, master)
    previous = await live_index_generation(redis, 0)
    generation = max(int(await redis.incr(GENERATIONS_KEY)), previous + 1)
    runtime = build_index_runtime(redis, settings, SubjectMatcher.from_master(master))
    await record_model(redis, generation, runtime.embedder)
    index = runtime.open_index(generation)
    await index.ensure(runtime.embedder.dimension)
    timeline = runtime.open_timeline(generation) if runtime.open_timeline is not None else None
    if timeline is not None:
        await timeline.ensure(runtime.embedder.dimension)
    total = sum([(await store.log_head(p))[1] for p in range(partitions)])
    read, embedder, subjects = 0, runtime.embedder, runtime.subjects
    try:
        with progress("index", total) as bar:
            for p in range(partitions):
                # The timeline reads each batch after the index: its texts are in the embedder's cache.
                projections: list[TrackedProjection[Any]] = [
                    IndexProjection(redis, index, embedder, p, generation, store=store, subjects=subjects)
                ]
                if timeline is not None:
                    projections.append(
                        TimelineProjection(redis, timeline, embedder, p, generation, store=store, subjects=subjects)
                    )
                read += await rebuild_together(projections, store, bar.update, IndexProjection.rebuild_batch)
    finally:
        await index.close()
        if timeline is not None:
            await timeline.close()
    await switch_generation(redis, partitions, generation)
    for p in range(partitions):
        await unlink_prefix(redis, IndexKeys(p, previous).prefix)
        await unlink_prefix(redis, TimelineKeys(p, previous).prefix)
    return {"projection": "index", "events": read, "generation": generation, "previous": previous}
