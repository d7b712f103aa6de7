"""Promise 3 for the vector index: a rebuild from the log equals the live index (same notes,
chunks, versions and filter fields), and replayed events leave one point per note chunk. The
timeline of every version has its own: tests/integration/test_timeline_projection.py."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from engram_ledger.contracts.commands import MessageDraft
from engram_ledger.projections.index import IndexProjection, live_index_generation
from engram_ledger.projections.qdrant_edge import QdrantEdgeIndex
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.application.vector_index import DENSE, NearestQuery
from engram_ledger.services.bus.client import EngramClient
from tests.builders import mixed_workload
from tests.conftest import RunningService
from tests.support import POINT_FIELDS, master_key_for_tests, replay_the_log, shape


async def caught_up(client: EngramClient, token: str) -> None:
    await client.search("user-0", "anything", after=token)


async def test_index_rebuild_equals_live(
    service: RunningService, client: EngramClient, redis_url: str, tmp_path: Path
) -> None:
    token = await mixed_workload(client, steps=60)
    long_note = await client.save("user-1", " ".join(f"sentence {i} of a long diary entry." for i in range(150)))
    await caught_up(client, long_note.token)
    runtime = service.engram.index
    assert runtime is not None
    live = await runtime.index.payloads()
    assert any(p["chunk"] > 0 for p in live), "the long note is chunked"
    assert any(p["status"] == "superseded" for p in live)

    redis = aioredis.Redis.from_url(redis_url)
    rebuilt_index = QdrantEdgeIndex(tmp_path / "rebuilt")
    await rebuilt_index.ensure(runtime.embedder.dimension)
    store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
    projection = IndexProjection(
        redis, rebuilt_index, runtime.embedder, 0, generation=9, store=store, subjects=runtime.subjects
    )
    read = await projection.rebuild(store)
    assert read > 60
    assert shape(await rebuilt_index.payloads()) == shape(live)
    await rebuilt_index.close()
    await redis.aclose()
    assert token


async def test_replayed_events_leave_one_point_per_chunk(
    service: RunningService, client: EngramClient, redis_url: str
) -> None:
    token = await mixed_workload(client, steps=40)
    await caught_up(client, token)
    runtime = service.engram.index
    assert runtime is not None
    before = shape(await runtime.index.payloads())
    redis = aioredis.Redis.from_url(redis_url)
    store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
    generation = await live_index_generation(redis, 0)
    projection = IndexProjection(
        redis, runtime.index, runtime.embedder, 0, generation, store=store, subjects=runtime.subjects
    )
    await replay_the_log(redis, store, projection)
    assert shape(await runtime.index.payloads()) == before
    assert len(before) == len({(p[0], p[1], p[2]) for p in before})
    await redis.aclose()


async def test_a_rebuild_gives_every_turn_the_same_context_as_live(
    service: RunningService, client: EngramClient, redis_url: str, tmp_path: Path
) -> None:
    """A turn's context (the turns before it) spans commands: a rebuild must find the same."""
    lines = ["I finally went hiking", "Where did you go?", "Mount Tamalpais", "The summit view was unreal"]
    first = await client.record_messages("alice", "hike", [MessageDraft(content=t, speaker="Ann") for t in lines[:2]])
    await client.record_message("alice", "hike", lines[2], speaker="Bob")
    await client.record_messages("alice", "hike", [MessageDraft(content=lines[3], speaker="Ann")])
    last = await client.record_messages("alice", "other", [MessageDraft(content="Unrelated small talk")])
    await caught_up(client, last.token)
    runtime = service.engram.index
    assert runtime is not None
    fields = (*POINT_FIELDS, "session_id", "time", "context", "record")
    live = sorted(tuple(p.get(f) for f in fields) for p in await runtime.index.payloads())
    assert sum(1 for p in live if p[-2]) == 3, "every turn after the first has a context point"
    redis = aioredis.Redis.from_url(redis_url)
    store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
    rebuilt = QdrantEdgeIndex(tmp_path / "rebuilt")
    await rebuilt.ensure(runtime.embedder.dimension)
    rebuilding = IndexProjection(
        redis, rebuilt, runtime.embedder, 0, generation=9, store=store, subjects=runtime.subjects
    )
    await rebuilding.rebuild(store)
    assert sorted(tuple(p.get(f) for f in fields) for p in await rebuilt.payloads()) == live
    (vector,) = await runtime.embedder.embed(["what was the view from the summit like?"])
    ask = NearestQuery(user_id="alice", using=DENSE, dense=vector, match={"record": "conversation"}, limit=20)
    assert [(h.point_id, round(h.score, 4)) for h in await rebuilt.nearest(ask)] == [
        (h.point_id, round(h.score, 4)) for h in await runtime.index.nearest(ask)
    ], "the same vectors, context points included"
    await rebuilt.close()
    await redis.aclose()
    assert first.notes
