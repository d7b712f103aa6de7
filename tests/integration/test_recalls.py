"""The recall audit through the real bus: where a deployment audits a user's recalls, each
search and memory block served records what it showed (``MemoryRecalled``), with the channel
and session that asked and the query sealed; forgetting a note it showed, or the user, leaves
the query unreadable, provably (its key is derived from theirs)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.events import MemoryRecalled
from engram_ledger.contracts.model import Origin, RecallView
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.bus.deliveries import ContentState, Delivery
from engram_ledger.services.cli import render
from tests.conftest import RunningService, service_settings
from tests.support import eventually, leaked, master_key_for_tests


@pytest.fixture
async def audited(redis_url: str) -> AsyncIterator[tuple[RunningService, EngramClient]]:
    running = await RunningService(service_settings(redis_url, recall_audit="alice")).start()
    async with EngramClient(redis_url, timeout=10, operator=True) as client:
        yield running, client
    await running.stop()


async def recalled(client: EngramClient, user: str, count: int, **filters: object) -> list[RecallView]:
    """The user's recalls once ``count`` are in the read model (it follows the log)."""

    async def found() -> list[RecallView] | None:
        recalls = (await client.recalls(user, **filters)).recalls  # type: ignore[arg-type]
        return recalls if len(recalls) >= count else None

    return await eventually(found, what=f"{count} recalls of {user} in the read model")  # type: ignore[no-any-return]


async def test_a_search_and_a_memory_block_record_what_they_showed(
    audited: tuple[RunningService, EngramClient],
) -> None:
    _, client = audited
    boss = await client.save("alice", "Alec is my boss at TechCorp", category="work")
    cat = await client.save("alice", "I have a cat named Miso", category="home")
    tui = Origin(channel="tui", session_id="s-1")
    hits = await client.search("alice", "who is my boss?", origin=tui, after=cat.token)
    assert hits.results[0].note_id == boss.note_id
    block = await client.context("alice", query="pets", origin=Origin(channel="whatsapp", session_id="s-2"))
    # Bob's are not audited here.
    await client.save("bob", "Bob likes jazz")
    await client.search("bob", "music")

    search, context = sorted(await recalled(client, "alice", 2), key=lambda r: r.kind, reverse=True)
    assert (search.kind, search.query, search.channel, search.session_id) == ("search", "who is my boss?", "tui", "s-1")
    assert search.notes == [h.note_id for h in hits.results] and search.versions == [1] * len(hits.results)
    assert (context.kind, context.query, context.channel) == ("context", "pets", "whatsapp")
    assert context.notes == block.note_ids
    assert [r.recall_id for r in await recalled(client, "alice", 1, session_id="s-1")] == [search.recall_id]
    assert (await client.recalls("bob")).recalls == []
    assert search.asked and context.asked
    # A block built without a query: no query, and it says it had none (not that it is gone).
    await client.context("alice")
    plain = (await recalled(client, "alice", 3))[0]
    assert (plain.kind, plain.query, plain.asked) == ("context", None, False)


async def test_a_recall_s_query_goes_with_a_note_it_showed_and_all_of_it_with_the_user(
    audited: tuple[RunningService, EngramClient],
) -> None:
    service, client = audited
    secret = await client.save("alice", "my locker code is heron-7719")
    other = await client.save("alice", "I like tea")
    await client.search("alice", "what is my locker code at the gym", min_relevance=0, after=other.token)
    await client.search("alice", "what do I drink", min_relevance=0, top_k=1)
    both, tea_only = sorted(await recalled(client, "alice", 2), key=lambda r: len(r.notes), reverse=True)
    assert secret.note_id in both.notes and both.query == "what is my locker code at the gym"
    assert tea_only.notes == [other.note_id]

    gone = await client.forget("alice", note_ids=[secret.note_id], confirmed=True)
    after = {r.recall_id: r for r in (await client.recalls("alice", after=gone.token)).recalls}
    # The recall that showed the forgotten note can no longer say what was asked; the other can.
    assert after[both.recall_id].query is None and after[both.recall_id].notes == both.notes
    assert after[both.recall_id].asked
    assert after[tea_only.recall_id].query == "what do I drink"

    asked = await client.forget_user("alice")
    erased = await client.forget_user("alice")
    assert asked.status == "confirmation_required" and erased.status == "forgotten"
    assert (await client.recalls("alice", after=erased.token)).recalls == []
    assert await leaked(service.settings.redis_url, b"what do I drink") == []
    assert await leaked(service.settings.redis_url, b"locker code") == []


async def test_finding_what_to_forget_is_no_recall_and_erasing_a_session_erases_its_recalls(
    audited: tuple[RunningService, EngramClient],
) -> None:
    _, client = audited
    note = await client.save("alice", "my diagnosis is private")
    await client.forget("alice", query="diagnosis")  # candidates only: never a recall
    await client.record_message("alice", "s-7", "hello there")
    await client.search("alice", "diagnosis", origin=Origin(channel="tui", session_id="s-7"), after=note.token)
    await client.search("alice", "diagnosis", origin=Origin(channel="tui", session_id="s-8"))
    found = await recalled(client, "alice", 2)
    assert sorted(r.session_id or "" for r in found) == ["s-7", "s-8"]
    await client.forget_session("alice", "s-7")
    erased = await client.forget_session("alice", "s-7")
    assert erased.status == "forgotten"
    left = (await client.recalls("alice", after=erased.token)).recalls
    assert [r.session_id for r in left] == ["s-8"]


async def user_log(redis_url: str, user: str) -> list[dict[str, Any]]:
    """The user's events in the log (their partition's, in log order), as JSON objects."""
    async with aioredis.Redis.from_url(redis_url) as redis:
        log = channels.event_log(channels.partition_of(user, int(await redis.get(channels.PARTITIONS_KEY))))
        events = [msgspec.json.decode(fields[b"e"]) for _, fields in await redis.xrange(log)]
    return [e for e in events if e["user_id"] == user]


async def alter(redis_url: str, event: dict[str, Any]) -> str:
    """A copy of ``event`` appended to the log under another event id: its sealed fields are bound
    to the id they were sealed with, so it no longer opens. A recall's copy (its version already
    applied) leaves the projections as they were. The copy's id."""
    user = event["user_id"]
    altered = {**event, "event_id": f"altered-{event['event_id']}"}
    async with aioredis.Redis.from_url(redis_url) as redis:
        log = channels.event_log(channels.partition_of(user, int(await redis.get(channels.PARTITIONS_KEY))))
        await redis.xadd(log, {"e": msgspec.json.encode(altered), "u": user})
    return str(altered["event_id"])


async def test_a_search_that_showed_nothing_keeps_no_query_text(audited: tuple[RunningService, EngramClient]) -> None:
    service, client = audited
    alec = await client.save("alice", "Alec works at TechCorp", category="work", subject="Alec")
    asked = "where does Alec work now"
    # The floor at its highest: nothing is relevant enough to show.
    assert (await client.search("alice", asked, min_relevance=1.0, after=alec.token)).results == []
    (recall,) = await recalled(client, "alice", 1)
    # What was asked is recorded (asked, when, by whom, that it showed nothing); its text is not.
    assert (recall.kind, recall.notes, recall.asked, recall.query) == ("search", [], True, None)
    assert "(query not kept: it showed nothing)" in render.recalls(await client.recalls("alice")).plain
    gone = await client.forget("alice", note_ids=[alec.note_id], confirmed=True)
    (after,) = (await client.recalls("alice", after=gone.token)).recalls
    assert after.query is None and after.asked
    for needle in (asked, "does Alec work", "Alec work"):
        assert await leaked(service.settings.redis_url, needle.encode()) == [], needle


async def test_a_query_goes_with_a_note_whose_subject_it_names_though_it_did_not_show_it(
    audited: tuple[RunningService, EngramClient],
) -> None:
    service, client = audited
    alec = await client.save("alice", "Alec works at TechCorp", category="work", subject="Alec")
    tea = await client.save("alice", "I drink green tea every morning", category="home")
    asked = "does Alec's team drink tea too?"
    hits = await client.search("alice", asked, category="home", min_relevance=0, after=tea.token)
    assert [h.note_id for h in hits.results] == [tea.note_id]
    (recall,) = await recalled(client, "alice", 1)
    assert (recall.query, recall.notes) == (asked, [tea.note_id])

    gone = await client.forget("alice", note_ids=[alec.note_id], confirmed=True)
    (after,) = (await client.recalls("alice", after=gone.token)).recalls
    # Forgetting Alec's note takes the query that named Alec with it, though only tea was shown.
    assert (after.query, after.notes, after.asked) == (None, [tea.note_id], True)
    assert await leaked(service.settings.redis_url, b"team drink tea") == []


async def test_a_subscriber_with_the_key_reads_recalls_and_passes_over_an_event_that_does_not_open(
    audited: tuple[RunningService, EngramClient],
) -> None:
    service, client = audited
    alec = await client.save("alice", "Alec works at TechCorp", category="work", subject="Alec")
    tea = await client.save("alice", "I drink green tea every morning", category="home")
    await client.search("alice", "where does Alec work now", min_relevance=0, after=tea.token)
    await client.search("alice", "what does Alec drink", category="home", min_relevance=0)
    made = {r.recall_id for r in await recalled(client, "alice", 2)}
    first = next(e for e in await user_log(service.settings.redis_url, "alice") if e["type"] == "memory_recalled")
    altered = await alter(service.settings.redis_url, first)
    later = await client.save("alice", "Alec moved to Lisbon", subject="Alec")

    async def read(group: str) -> list[Delivery]:
        seen = []
        async with client.events(group, from_start=True, users=["alice"], key=master_key_for_tests()) as events:
            async for delivery in events:
                seen.append(delivery)
                await delivery.ack()
                if delivery.event.note_id == later.note_id:
                    return seen
        return seen

    seen = await asyncio.wait_for(read("audit"), 30)
    recalls = {d.event.note_id: d for d in seen if isinstance(d.event, MemoryRecalled)}
    assert set(recalls) == made
    assert all(d.content is ContentState.OPEN for d in recalls.values())
    asked = {d.event.query for d in recalls.values() if isinstance(d.event, MemoryRecalled)}
    assert asked == {"where does Alec work now", "what does Alec drink"}
    # The altered copy was passed over (and acked), and what came after it delivered.
    assert altered not in {d.event.event_id for d in seen} and seen[-1].event.note_id == later.note_id
    async with aioredis.Redis.from_url(service.settings.redis_url) as redis:
        log = channels.event_log(channels.partition_of("alice", service.settings.partitions))
        assert (await redis.xpending(log, "audit"))["pending"] == 0

    # Once Alec's note is forgotten, both queries are gone for a subscriber too: one showed it,
    # the other named its subject.
    await client.forget("alice", note_ids=[alec.note_id], confirmed=True)
    again = {d.event.note_id: d for d in await asyncio.wait_for(read("later"), 30) if d.event.note_id in recalls}
    assert set(again) == made
    assert all(d.content is ContentState.ERASED and d.event.query is None for d in again.values())


def test_an_export_with_recalls_can_be_imported() -> None:
    from engram_ledger.services.domain.recalls import new_recall_id
    from engram_ledger.services.ops.portable import _is_stream_id

    assert _is_stream_id(new_recall_id())
