"""Promise 3 for the timeline of every version (what a search of the past ranks): a projection of
its own beside the live index. A rebuild from the log equals the live timeline, bounds included;
replayed events leave it unchanged; it keeps its own checkpoint, so stopping its runner stops
neither the live index nor its searches, and a search of the past given a token waits for the
timeline to apply it; `engram rebuild index` fills both."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts.channels import IndexKeys, TimelineKeys, parse_token
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.projections.index import live_index_generation
from engram_ledger.projections.index_runtime import IndexRuntime
from engram_ledger.projections.qdrant_edge import QdrantEdgeIndex
from engram_ledger.projections.timeline import TimelineProjection
from engram_ledger.projections.tracking import read_position
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.observability.health import health
from engram_ledger.services.ops.rebuild import rebuild_index
from tests.builders import mixed_workload
from tests.conftest import RunningService, service_settings
from tests.support import POINT_FIELDS, eventually, master_key_for_tests, replay_the_log

TIMELINE_FIELDS = (*POINT_FIELDS, "from_position", "until_position", "from_at", "until_at", "record", "context")


Shape = list[tuple[str, ...]]


def timeline_shape(payloads: list[dict[str, object]]) -> Shape:
    """Every point of the timeline by what says which version it is and when it held."""
    return sorted(tuple(str(p.get(f)) for f in TIMELINE_FIELDS) for p in payloads)


async def caught_up(client: EngramClient, token: str) -> None:
    """The live index and the timeline have both applied ``token``."""
    await client.search("user-0", "anything", after=token)
    await client.search("user-0", "anything", after=token, as_of=token)


async def _worked(service: RunningService, client: EngramClient, steps: int) -> tuple[IndexRuntime, Shape]:
    """The service's index after a mixed workload, and its timeline's points then."""
    await caught_up(client, await mixed_workload(client, steps=steps))
    runtime = service.engram.index
    assert runtime is not None and runtime.timeline is not None
    return runtime, timeline_shape(await runtime.timeline.payloads())


async def test_a_rebuilt_timeline_equals_the_live_one_bounds_included(
    service: RunningService, client: EngramClient, redis_url: str, tmp_path: Path
) -> None:
    runtime, past = await _worked(service, client, steps=60)
    assert len(past) > await runtime.index.count(), "the timeline keeps the versions before the current ones"
    assert any(p[-2] == "conversation" for p in past) and any(p[-1] == "True" for p in past), "turns, in context"

    redis = aioredis.Redis.from_url(redis_url)
    rebuilt = QdrantEdgeIndex(tmp_path / "rebuilt-timeline")
    await rebuilt.ensure(runtime.embedder.dimension)
    store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
    projection = TimelineProjection(
        redis, rebuilt, runtime.embedder, 0, generation=9, store=store, subjects=runtime.subjects
    )
    assert await projection.rebuild(store) > 60
    # Every version with the same bounds, from the log alone.
    assert timeline_shape(await rebuilt.payloads()) == past
    await rebuilt.close()
    await redis.aclose()


async def test_replayed_events_leave_the_timeline_unchanged(
    service: RunningService, client: EngramClient, redis_url: str
) -> None:
    runtime, past = await _worked(service, client, steps=40)
    assert runtime.timeline is not None
    redis = aioredis.Redis.from_url(redis_url)
    store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
    generation = await live_index_generation(redis, 0)
    projection = TimelineProjection(
        redis, runtime.timeline, runtime.embedder, 0, generation, store=store, subjects=runtime.subjects
    )
    await replay_the_log(redis, store, projection)
    assert timeline_shape(await runtime.timeline.payloads()) == past
    await redis.aclose()


async def _stopped(service: RunningService, name: str) -> None:
    """Cancels the service's runner task ``name`` (``<projection>-<partition>``) and waits for it to end."""
    (task,) = [t for t in asyncio.all_tasks() if t.get_name() == name]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_the_timeline_has_its_own_checkpoint_and_a_search_of_the_past_waits_for_it(redis_url: str) -> None:
    running = await RunningService(service_settings(redis_url, read_wait_seconds=1.0)).start()
    restarted: asyncio.Task[None] | None = None
    try:
        async with EngramClient(redis_url, timeout=10) as client:
            first = await client.save("alice", "I play the viola in a quartet")
            await caught_up(client, first.token)
            await _stopped(running, "timeline-0")

            later = await client.save("alice", "I joined an orchestra that plays Mahler")
            # The live index goes on without the timeline.
            now = await client.search("alice", "orchestra Mahler", after=later.token, min_relevance=0)
            assert now.results[0].note_id == later.note_id
            redis = aioredis.Redis.from_url(redis_url)
            generation = await live_index_generation(redis, 0)
            _, position = parse_token(later.token)
            assert await read_position(redis, IndexKeys(0, generation).checkpoint) >= position
            assert await read_position(redis, TimelineKeys(0, generation).checkpoint) < position
            lags = (await health(redis, 1))["partitions"][0]
            assert lags["index"]["lag_entries"] == 0 and lags["timeline"]["lag_entries"] >= 1
            assert lags["timeline"].keys() == lags["index"].keys(), "the same shape"

            # The index and the read model have the token; the past's index has not.
            with pytest.raises(EngramError) as info:
                await client.search("alice", "orchestra", as_of=later.token, after=later.token, min_relevance=0)
            assert info.value.code is ErrorCode.TIMEOUT

            (runner,) = [r for r in running.engram.runners if r.name == "timeline" and r.partition == 0]
            restarted = asyncio.create_task(runner.run(running.engram.stopping))
            then = await client.search(
                "alice", "orchestra Mahler", as_of=later.token, after=later.token, min_relevance=0
            )
            assert then.results[0].note_id == later.note_id
            await redis.aclose()
    finally:
        if restarted is not None:
            restarted.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await restarted
        await running.stop()


class _Bar:
    def update(self, n: int) -> None:
        pass


@contextlib.contextmanager
def _quiet(what: str, total: int) -> Iterator[_Bar]:
    """A rebuild's progress, shown nowhere."""
    yield _Bar()


async def test_rebuild_index_fills_the_timeline_of_the_new_generation(
    service: RunningService, client: EngramClient, redis_url: str
) -> None:
    runtime, past = await _worked(service, client, steps=30)
    redis = aioredis.Redis.from_url(redis_url)
    rebuilt = await rebuild_index(redis, service.settings, 1, _quiet)
    generation = rebuilt["generation"]
    # Its own checkpoint, at the log's head as the index's; the old generation's state is gone.
    head = await read_position(redis, IndexKeys(0, generation).checkpoint)
    assert await read_position(redis, TimelineKeys(0, generation).checkpoint) == head > (0, 0)
    assert not await redis.exists(TimelineKeys(0, rebuilt["previous"]).checkpoint)
    # The service follows the switch, and its timeline is the rebuilt one.
    await eventually(lambda: runtime.generation == generation, what="the switch to the rebuilt generation")
    assert runtime.timeline is not None
    assert timeline_shape(await runtime.timeline.payloads()) == past
    await redis.aclose()
