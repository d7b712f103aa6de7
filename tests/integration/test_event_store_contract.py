"""One contract, every adapter of the EventStore port: the Redis one and the in-memory fake."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import SaveNote, SupersedeNote, UpdateNote
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.application.ports import Appended, Conflict, EventStore
from engram_ledger.services.domain.appends import StreamAppend
from engram_ledger.services.domain.decider import decide, note_ids_for
from tests.fakes import InMemoryEventStore
from tests.support import master_key_for_tests

NOW = datetime(2026, 5, 1, tzinfo=UTC)


@pytest.fixture(params=["redis", "memory"])
async def store(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[EventStore]:
    if request.param == "memory":
        yield InMemoryEventStore(partitions=3)
        return
    redis = aioredis.Redis.from_url(redis_url)
    yield RedisEventStore(redis, partitions=3, idempotency_ttl_seconds=3600, master=master_key_for_tests())
    await redis.aclose()


async def decided(store: EventStore, command) -> list[StreamAppend]:  # type: ignore[no-untyped-def]
    ids = note_ids_for(command)
    loaded = await store.load(command.user_id, ids)
    return decide(command, {i: n.state for i, n in loaded.items()}, ids, NOW)


async def save(store: EventStore, user: str, command_id: str, content: str) -> str:
    command = SaveNote(command_id=command_id, user_id=user, content=content)
    result = await store.append(user, command_id, await decided(store, command))
    assert isinstance(result, Appended)
    return result.outcome.notes[0][0]


async def test_append_then_load_folds_the_state_and_names_the_position(store: EventStore) -> None:
    note_id = await save(store, "alice", "c1", "first")
    update = UpdateNote(command_id="c2", user_id="alice", note_id=note_id, content="second")
    result = await store.append("alice", "c2", await decided(store, update))
    assert isinstance(result, Appended) and result.outcome.notes == [(note_id, 2)]
    loaded = await store.load("alice", [note_id, "ZZZZZZZZ"])
    assert loaded[note_id].state.version == 2 and loaded[note_id].state.content == "second"
    assert loaded[note_id].position == result.outcome.position
    assert not loaded["ZZZZZZZZ"].state.exists and loaded["ZZZZZZZZ"].position is None


async def test_a_seen_command_id_returns_the_first_outcome_and_writes_nothing(store: EventStore) -> None:
    command = SaveNote(command_id="c1", user_id="alice", content="once")
    appends = await decided(store, command)
    first = await store.append("alice", "c1", appends)
    again = await store.append("alice", "c1", appends)
    assert isinstance(first, Appended) and isinstance(again, Appended)
    assert again.outcome == first.outcome and again.replayed and not first.replayed
    assert (await store.log_head(store.partition_of("alice")))[1] == 1
    assert await store.outcome("alice", "c1") == first.outcome
    assert await store.outcome("bob", "c1") is None


async def test_a_stale_expected_version_writes_nothing_at_all(store: EventStore) -> None:
    old = await save(store, "alice", "c1", "old")
    new = await save(store, "alice", "c2", "new")
    supersede = await decided(store, SupersedeNote(command_id="c3", user_id="alice", note_id=old, superseded_by=new))
    # The replacement changes between decision and append: the whole supersede is refused.
    await store.append(
        "alice", "c4", await decided(store, UpdateNote(command_id="c4", user_id="alice", note_id=new, content="x"))
    )
    result = await store.append("alice", "c3", supersede)
    assert result == Conflict(note_id=new, actual_version=2)
    assert (await store.load("alice", [old]))[old].state.version == 1
    assert await store.outcome("alice", "c3") is None


async def test_the_log_is_partitioned_by_user_and_read_in_order(store: EventStore) -> None:
    users = [f"user-{i}" for i in range(12)]
    for i, user in enumerate(users):
        await save(store, user, f"c{i}", f"note of {user}")
    partitions = {store.partition_of(u) for u in users}
    assert len(partitions) > 1
    total = 0
    for p in range(store.partitions):
        entries = await store.read_log(p, "0", 100)
        assert all(store.partition_of(e.event.user_id) == p for e in entries)
        positions = [e.position for e in entries]
        assert positions == sorted(positions, key=lambda x: tuple(map(int, x.split("-"))))
        if entries:
            assert (await store.read_log(p, entries[0].position, 100)) == entries[1:]
            assert (await store.log_head(p)) == (entries[-1].position, len(entries))
        total += len(entries)
    assert total == len(users)


async def test_content_claims_are_exclusive_per_user_and_released(store: EventStore) -> None:
    from engram_ledger.services.application.ports import ContentTaken
    from engram_ledger.services.domain.appends import content_digest

    holder = await save(store, "alice", "c1", "Likes black coffee")
    other = SaveNote(command_id="c2", user_id="alice", content="likes black COFFEE")
    result = await store.append("alice", "c2", await decided(store, other))
    assert isinstance(result, ContentTaken) and result.holder == holder
    assert await store.outcome("alice", "c2") is None and (await store.log_head(store.partition_of("alice")))[1] == 1
    assert await store.content_holder("alice", content_digest("Likes black coffee")) == holder
    assert await store.content_holder("bob", content_digest("Likes black coffee")) is None
    await save(store, "bob", "c3", "Likes black coffee")
    update = UpdateNote(command_id="c4", user_id="alice", note_id=holder, content="Likes green tea")
    assert isinstance(await store.append("alice", "c4", await decided(store, update)), Appended)
    assert await store.content_holder("alice", content_digest("Likes black coffee")) is None
    assert await store.content_holder("alice", content_digest("likes green tea")) == holder


async def test_an_append_seals_with_the_loaded_key_only_while_it_is_the_stored_one(redis_url: str) -> None:
    """The Redis store seals an update with the data key its load read (no second read): the
    append script refuses it if the wrapped key changed or went since (a conflict, decided
    again), so a key kept from a load never seals anything for a forgotten note."""
    redis = aioredis.Redis.from_url(redis_url)
    store = RedisEventStore(redis, partitions=3, idempotency_ttl_seconds=3600, master=master_key_for_tests())
    try:
        note_id = await save(store, "carol", "c1", "first")
        key = channels.data_key(store.partition_of("carol"), "carol", note_id)
        update = UpdateNote(command_id="c2", user_id="carol", note_id=note_id, content="second")
        appends = await decided(store, update)
        wrapped = await redis.get(key)
        await redis.set(key, b"rewrapped since the load")
        assert await store.append("carol", "c2", appends) == Conflict(note_id=note_id, actual_version=-1)
        await redis.delete(key)  # forgotten since the load
        assert await store.append("carol", "c2", appends) == Conflict(note_id=note_id, actual_version=-1)
        assert (await store.log_head(store.partition_of("carol")))[1] == 1, "nothing was written"
        await redis.set(key, wrapped)
        result = await store.append("carol", "c2", await decided(store, update))
        assert isinstance(result, Appended) and result.outcome.notes == [(note_id, 2)]
        assert (await store.load("carol", [note_id]))[note_id].state.content == "second"
    finally:
        await redis.aclose()
