"""Writes that race an erasure, forced to land where the race is lost: each would survive the
erasure without the step that looks again after it (a real Redis, the real bus)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts.channels import IndexKeys
from engram_ledger.contracts.events import ACCOUNT, session_stream
from engram_ledger.projections.index import IndexProjection, PointsProjection
from engram_ledger.projections.qdrant_edge import QdrantEdgeIndex
from engram_ledger.projections.timeline import TimelineProjection
from engram_ledger.projections.tracking import StaleProjection
from engram_ledger.services.adapters.crypto import SubjectMatcher
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService, service_settings
from tests.fakes import HashEmbedder
from tests.support import master_key_for_tests, shape


def write_while_deciding(service: RunningService, control: str, write: Any) -> list[bool]:
    """Make ``write`` land in the store while the erasure on ``control`` decides: after it has
    loaded what it will erase, before it appends."""
    store = service.engram.store
    original = store.load
    done: list[bool] = []

    async def load(user_id: str, note_ids: Sequence[str]) -> Any:
        loaded = await original(user_id, note_ids)
        if control in note_ids and not done:
            done.append(True)
            await write()
        return loaded

    store.load = load  # type: ignore[method-assign]
    return done


async def test_a_turn_recorded_while_its_conversation_is_erased_is_erased_with_it(
    service: RunningService, client: EngramClient
) -> None:
    await client.record_message("ada", "chat-1", "hello there")
    assert (await client.forget_session("ada", "chat-1")).status == "confirmation_required"
    async with EngramClient(service.settings.redis_url, timeout=10) as agent:
        raced = write_while_deciding(
            service, session_stream("chat-1"), lambda: agent.record_message("ada", "chat-1", "my PIN is 4411")
        )
        erased = await client.forget_session("ada", "chat-1")
    assert raced and erased.status == "forgotten"
    assert len(erased.forgotten) == 2, "the turn recorded while it decided is erased too"
    left = await client.list_messages("ada", "chat-1", after=erased.token)
    assert left.messages == []


async def test_a_note_saved_while_its_user_is_erased_is_erased_with_it(
    service: RunningService, client: EngramClient
) -> None:
    await client.save("bea", "Bea's first note", advise=False)
    assert (await client.forget_user("bea")).status == "confirmation_required"
    async with EngramClient(service.settings.redis_url, timeout=10) as agent:
        raced = write_while_deciding(service, ACCOUNT, lambda: agent.save("bea", "Bea's PIN is 4411", advise=False))
        erased = await client.forget_user("bea")
    assert raced and erased.status == "forgotten" and len(erased.forgotten) == 2
    left = await client.list_notes("bea", after=erased.token)
    assert left.notes == []
    # a note saved after the erasure is a new one, kept
    kept = await client.save("bea", "a fresh start", advise=False)
    assert [n.id for n in (await client.list_notes("bea", after=kept.token)).notes] == [kept.note_id]


class SlowWrites:
    """A vector index whose upserts wait until told to go: a writer paused mid-batch."""

    def __init__(self, index: Any) -> None:
        self._index = index
        self.writing = asyncio.Event()
        self.go = asyncio.Event()

    async def upsert(self, points: Any) -> None:
        self.writing.set()
        await self.go.wait()
        await self._index.upsert(points)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)


@pytest.mark.parametrize("kind", [IndexProjection, TimelineProjection], ids=["index", "timeline"])
async def test_a_writer_that_lost_the_index_cannot_bring_back_points_a_forget_deleted(
    redis_url: str, tmp_path: Path, kind: type[PointsProjection]
) -> None:
    """The live index, and its timeline (a projection of its own, every version of every note)."""
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    index = QdrantEdgeIndex(tmp_path / "shard")
    try:
        async with EngramClient(redis_url, operator=True) as client, aioredis.Redis.from_url(redis_url) as redis:
            store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
            saved = await client.save("cy", "Cy's alarm code is 8093", advise=False)
            read_before = await store.read_log(0, "0", 100)  # the text, as a writer read it then
            await client.forget("cy", note_ids=[saved.note_id], confirmed=True)
            log = await store.read_log(0, "0", 100)
            embedder = HashEmbedder()
            await index.ensure(embedder.dimension)
            subjects = SubjectMatcher.from_master(master_key_for_tests())
            await redis.set(IndexKeys(0, 0).live, 1)
            slow = SlowWrites(index)
            loser = kind(redis, slow, embedder, 0, 1, store=store, subjects=subjects)  # type: ignore[arg-type]
            winner = kind(redis, index, embedder, 0, 1, store=store, subjects=subjects)
            # given one writer that read the save and is paused before writing its points
            paused = asyncio.create_task(loser.apply(read_before))
            await slow.writing.wait()
            # when another takes over and applies the save and the forget (deleting the points)
            await winner.apply(log)
            assert not [p for p in await index.payloads() if p["note_id"] == saved.note_id]
            # and the first then writes its points, and finds it lost the projection
            slow.go.set()
            with pytest.raises(StaleProjection):
                await paused
            back = [p for p in await index.payloads() if p["note_id"] == saved.note_id]
            assert back, "the late write brought the forgotten note's points back"
            # then the one holding the projection writes the note again, from its own state
            assert await winner.repair() == 1
            assert not [p for p in await index.payloads() if p["note_id"] == saved.note_id]
            assert await redis.scard(winner.keys.recheck) == 0
    finally:
        await index.close()
        await running.stop()


async def test_a_turn_retracted_mid_conversation_leaves_the_context_of_the_turns_after_it(
    service: RunningService, client: EngramClient, redis_url: str, tmp_path: Path
) -> None:
    """Each turn is also indexed with the turns before it (its context point: their words in
    its BM25 text, their vectors in its mean). A turn retracted after the next ones were
    indexed stayed in theirs, findable by its words."""
    first = await client.record_message("dee", "chat", "my locker code is zebra-8093")
    second = await client.record_message("dee", "chat", "noted, anything else?")
    third = await client.record_message("dee", "chat", "no, that is all")
    runtime = service.engram.index
    assert runtime is not None
    await client.search("dee", "locker", include_conversation=True, after=third.token)

    def contexts() -> set[str]:
        return {p["note_id"] for p in points if p.get("context")}

    points = await runtime.index.payloads()
    assert contexts() == {second.note_id, third.note_id}, "both held the first turn in their context"
    # when the first turn is retracted
    retracted = await client.retract_message("dee", first.note_id)
    await client.search("dee", "locker", include_conversation=True, after=retracted.token)
    points = await runtime.index.payloads()
    # then no point holds its words any more: its own are gone, and so are the contexts after it
    assert not [p for p in points if p["note_id"] == first.note_id]
    assert contexts() == set()
    found = await client.search("dee", "zebra-8093 locker code", include_conversation=True, after=retracted.token)
    assert first.note_id not in {h.note_id for h in found.results}
    # and a rebuild from the log reaches the same points
    async with aioredis.Redis.from_url(redis_url) as redis:
        rebuilt = QdrantEdgeIndex(tmp_path / "rebuilt")
        await rebuilt.ensure(runtime.embedder.dimension)
        store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
        projection = IndexProjection(
            redis, rebuilt, runtime.embedder, 0, generation=9, store=store, subjects=runtime.subjects
        )
        await projection.rebuild(store)
        assert shape(await rebuilt.payloads()) == shape(points)
        await rebuilt.close()
