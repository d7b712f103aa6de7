"""A conversation as an agent framework keeps it (the OpenAI Agents SDK's Session stands on
this): turns with the caller's own item kept whole, listed in order, the last one retracted by
an event, the whole session erased provably. Real bus, real Redis, Qdrant Edge."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts.channels import IndexKeys
from engram_ledger.contracts.commands import MessageDraft
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.projections.history import HistoryProjection, live_generation
from engram_ledger.projections.index import live_index_generation
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService
from tests.support import dump, leaked, master_key_for_tests

CALL = {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'}


async def test_turns_are_listed_in_order_with_their_items_whole(client: EngramClient) -> None:
    first = await client.record_messages(
        "alice",
        "s1",
        [
            MessageDraft(role="user", content="what is the weather in Oslo?", item={"role": "user", "content": "x"}),
            MessageDraft(role="tool", content="weather Oslo", item=CALL),
        ],
    )
    second = await client.record_messages("alice", "s1", [MessageDraft(role="assistant", content="It is sunny.")])
    other = await client.record_message("alice", "s2", "another conversation")
    listed = await client.list_messages("alice", "s1", after=second.token)
    assert [m.content for m in listed.messages] == ["what is the weather in Oslo?", "weather Oslo", "It is sunny."]
    assert listed.messages[1].item == CALL and listed.messages[2].item is None
    assert listed.total == 3
    latest = await client.list_messages("alice", "s1", limit=2, after=second.token)
    assert [m.id for m in latest.messages] == [first.notes[1].note_id, second.notes[0].note_id]
    assert (await client.list_messages("alice", "s2", after=other.token)).total == 1
    assert (await client.list_messages("bob", "s1", after=other.token)).messages == []


async def test_a_retracted_turn_leaves_the_listing_and_searches(client: EngramClient) -> None:
    recorded = await client.record_messages(
        "alice",
        "s1",
        [MessageDraft(content="my locker code is in the blue notebook"), MessageDraft(content="second thought")],
    )
    last = recorded.notes[1].note_id
    retracted = await client.retract_message("alice", last)
    assert retracted.note_id == last and retracted.version == 2
    listed = await client.list_messages("alice", "s1", after=retracted.token)
    assert [m.id for m in listed.messages] == [recorded.notes[0].note_id]
    hits = await client.search("alice", "second thought", include_conversation=True, after=retracted.token)
    assert last not in [h.note_id for h in hits.results]
    with pytest.raises(EngramError) as again:
        await client.retract_message("alice", last)
    assert again.value.code is ErrorCode.MEMORY_NOT_FOUND
    with pytest.raises(EngramError) as a_note:
        saved = await client.save("alice", "a note, not a message")
        await client.retract_message("alice", saved.note_id)
    assert a_note.value.code is ErrorCode.MEMORY_NOT_FOUND


async def test_an_erased_session_lists_nothing_and_its_items_are_unreadable(
    client: EngramClient, service: RunningService
) -> None:
    item = {"role": "user", "content": "my passport number is QX-778812"}
    recorded = await client.record_messages(
        "alice", "s9", [MessageDraft(content="my passport number is QX-778812", item=item)]
    )
    await client.retract_message("alice", recorded.notes[0].note_id)
    await client.record_message("alice", "s9", "second turn", item={"role": "user", "content": "QX-778812 again"})
    erased = await client.forget_session("alice", "s9", confirmed=True)
    assert erased.status == "forgotten" and len(erased.forgotten) == 2
    assert (await client.list_messages("alice", "s9", after=erased.token)).messages == []
    assert await leaked(service.settings.redis_url, b"QX-778812") == []


async def test_an_erased_user_leaves_no_conversation_or_key_listing(client: EngramClient) -> None:
    await client.record_message("carol", "s1", "hello there", item={"role": "user", "content": "hello there"})
    await client.put("carol", "prefs", "k", {"v": 1})
    erased = await client.forget_user("carol", confirmed=True)
    assert (await client.list_messages("carol", "s1", after=erased.token)).messages == []
    assert await client.get_by_key("carol", "prefs", "k", after=erased.token) is None
    assert (await client.list_categories("carol", after=erased.token)).categories == []


async def test_a_retracted_turn_is_no_context_for_the_turns_after_it(client: EngramClient, redis_url: str) -> None:
    first = await client.record_message("alice", "s1", "good morning")
    said = await client.record_message("alice", "s1", "my card number is 4111 2222 3333 4444")
    await client.retract_message("alice", said.note_id)
    after = await client.record_message("alice", "s1", "hello again")
    hits = await client.search("alice", "card number 4111", include_conversation=True, top_k=5, after=after.token)
    assert said.note_id not in [h.note_id for h in hits.results]
    # The turns a next turn is read after (its context point's text) no longer hold it.
    redis = aioredis.Redis.from_url(redis_url)
    try:
        keys = IndexKeys(0, await live_index_generation(redis, 0))
        tail = json.loads(await redis.get(keys.session("alice", "s1")))
    finally:
        await redis.aclose()
    assert tail == [first.note_id, after.note_id]


async def test_a_conversation_cleared_and_spoken_in_again_rebuilds_to_the_same_read_model(
    client: EngramClient, redis_url: str
) -> None:
    """A rebuild applies the log in large batches, so an erasure and the writes after it land in
    one batch: those writes must survive it, as they did live."""
    await client.record_messages("alice", "s1", [MessageDraft(content="first"), MessageDraft(content="second")])
    await client.forget_session("alice", "s1", confirmed=True)
    again = await client.record_message("alice", "s1", "after the clear", item={"n": 1})
    await client.put("bob", "prefs", "k", {"v": 1})
    await client.forget_user("bob", confirmed=True)
    last = await client.put("bob", "prefs", "k", {"v": 2})
    listed = await client.list_messages("alice", "s1", after=last.token)
    assert [m.id for m in listed.messages] == [again.note_id]
    assert (await client.get_by_key("bob", "prefs", "k", after=last.token)).value == {"v": 2}  # type: ignore[union-attr]
    redis = aioredis.Redis.from_url(redis_url)
    try:
        store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
        await HistoryProjection(redis, 0, 77, master_key_for_tests()).rebuild(store)
        assert await dump(redis, 0, 77) == await dump(redis, 0, await live_generation(redis, 0))
    finally:
        await redis.aclose()
