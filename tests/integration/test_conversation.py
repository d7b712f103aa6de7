"""Conversation memory across sessions, through the real bus (real Redis, Qdrant Edge, MiniLM):
importing transcripts, searching every past conversation, the turns' context, time windows,
and erasing a conversation the provable way."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts.commands import MessageDraft
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import MAX_BATCH_MESSAGES
from engram_ledger.contracts.queries import NotesWritten
from engram_ledger.projections.forget_saga import member
from engram_ledger.services.agents.tools import ToolDispatcher
from engram_ledger.services.application.relevance import DEFAULT_FLOOR
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService
from tests.support import holding, until_none

# One service for the module (tests/conftest.py, ``shared_service``): each test is a user of its own.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def service(shared_service: RunningService) -> RunningService:
    return shared_service


@pytest.fixture
def client(shared_client: EngramClient) -> EngramClient:
    return shared_client


MAY = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
JUNE = datetime(2023, 6, 20, 9, 0, tzinfo=UTC)

HIKING = [
    ("Ann", "Guess what, I finally went hiking last weekend!"),
    ("Bob", "Oh nice, where did you go?"),
    ("Ann", "Mount Tamalpais, the view from the summit was unreal."),
    ("Bob", "I have been meaning to go there for years."),
]
COOKING = [
    ("Bob", "I started a sourdough starter and named it Clint Yeastwood."),
    ("Ann", "Ha! Has it risen yet?"),
    ("Bob", "Yes, it doubled in size and smells amazing."),
]
CHATTER = [
    ("Ann", "How was your week?"),
    ("Bob", "Busy, lots of meetings at work."),
    ("Ann", "Same here, I need a holiday."),
    ("Bob", "Let's catch up again soon."),
]


def turns(lines: list[tuple[str, str]], at: datetime) -> list[MessageDraft]:
    return [
        MessageDraft(content=text, speaker=speaker, sent_at=at + timedelta(minutes=i))
        for i, (speaker, text) in enumerate(lines)
    ]


async def import_sessions(client: EngramClient, user: str) -> tuple[dict[str, list[str]], str]:
    """Three past conversations; returns the message ids per session and the last token."""
    ids: dict[str, list[str]] = {}
    token = ""
    for session, lines, at in (("hike", HIKING, MAY), ("bread", COOKING, JUNE), ("week", CHATTER, JUNE)):
        written = await client.record_messages(user, session, turns(lines, at))
        ids[session], token = [n.note_id for n in written.notes], written.token
    return ids, token


async def test_a_transcript_imports_in_order_with_ids_speakers_and_times(client: EngramClient, user: str) -> None:
    written = await client.record_messages(user, "hike", turns(HIKING, MAY), command_id="import-1")
    assert isinstance(written, NotesWritten) and len(written.notes) == len(HIKING)
    ids = [n.note_id for n in written.notes]
    assert len(set(ids)) == len(ids) and all(n.version == 1 for n in written.notes)
    again = await client.record_messages(user, "hike", turns(HIKING, MAY), command_id="import-1")
    assert again.replayed and [n.note_id for n in again.notes] == ids, "a retried import is the same import"
    hits = await client.search(user, "Mount Tamalpais summit", include_conversation=True, after=written.token)
    found = {h.note_id: h for h in hits.results}
    summit = found[ids[2]]
    assert summit.found_in == "conversation" and summit.content == HIKING[2][1]
    assert summit.message is not None
    assert (summit.message.session_id, summit.message.speaker) == ("hike", "Ann")
    assert summit.message.sent_at == MAY + timedelta(minutes=2)


async def test_an_oversized_empty_or_naively_timed_transcript_is_refused_and_nothing_is_recorded(
    client: EngramClient,
    user: str,
) -> None:
    too_many = [MessageDraft(content=f"turn {i}") for i in range(MAX_BATCH_MESSAGES + 1)]
    naive = [MessageDraft(content="turn 7", sent_at=datetime(2023, 5, 8, 13, 56))]  # no zone: ambiguous
    for messages in (too_many, [], naive):
        with pytest.raises(EngramError) as refused:
            await client.record_messages(user, "s1", messages)
        assert refused.value.code is ErrorCode.INVALID_PARAMETER
    ok = await client.record_messages(user, "s1", [MessageDraft(content="the stream keeps flowing")])
    hits = await client.search(user, "turn 7", include_conversation=True, after=ok.token)
    assert all(h.content != "turn 7" for h in hits.results)


async def test_a_search_without_a_session_finds_every_past_conversation(client: EngramClient, user: str) -> None:
    ids, token = await import_sessions(client, user)
    hike = await client.search(user, "Where did Ann go hiking?", include_conversation=True, top_k=3, after=token)
    assert hike.results[0].message is not None and hike.results[0].message.session_id == "hike"
    bread = await client.search(user, "What did Bob name his sourdough starter?", include_conversation=True)
    assert bread.results[0].note_id == ids["bread"][0]
    only = await client.search(user, "sourdough starter", include_conversation=True, session_id="hike", min_relevance=0)
    assert {h.message.session_id for h in only.results if h.message} == {"hike"}
    notes_only = await client.search(user, "sourdough starter")
    assert notes_only.results == [], "without include_conversation a search reads notes only"


async def test_another_users_conversations_are_never_found(client: EngramClient, user: str) -> None:
    await import_sessions(client, user)
    written = await client.record_messages("bob", "x", [MessageDraft(content="nothing about bread here")])
    # The floor off: bob's one turn is the whole ranking, and none of alice's is in it.
    hits = await client.search(
        "bob", "sourdough starter Clint Yeastwood", include_conversation=True, after=written.token, min_relevance=0
    )
    assert [h.note_id for h in hits.results] == [written.notes[0].note_id]


async def test_a_turn_is_found_through_the_turns_before_it(client: EngramClient, user: str) -> None:
    """ "Yes, it doubled in size" names nothing; the turns before it name the starter. Without
    the context points the reply is not among the first results."""
    ids, token = await import_sessions(client, user)
    hits = await client.search(
        user, "How is Clint Yeastwood doing?", include_conversation=True, top_k=3, after=token, min_relevance=0
    )
    assert ids["bread"][2] in [h.note_id for h in hits.results]


async def test_the_speaker_is_part_of_what_a_turn_is_found_by(client: EngramClient, user: str) -> None:
    lines = [("Priya", "I adopted a rescue greyhound."), ("Jonas", "I adopted a rescue greyhound too!")]
    written = await client.record_messages(user, "dogs", turns(lines, MAY))
    hits = await client.search(user, "Jonas greyhound", include_conversation=True, after=written.token)
    assert hits.results[0].note_id == written.notes[1].note_id


async def test_a_time_window_keeps_only_what_was_said_within_it(client: EngramClient, user: str) -> None:
    ids, token = await import_sessions(client, user)
    june = await client.search(
        user,
        "what happened?",
        include_conversation=True,
        top_k=20,
        since=JUNE,
        until=JUNE + timedelta(days=1),
        after=token,
        min_relevance=0,  # a vague query: what the window holds, however weak the match
    )
    found = {h.note_id for h in june.results}
    assert found and found <= set(ids["bread"]) | set(ids["week"])
    may = await client.search(
        user, "what happened?", include_conversation=True, top_k=20, until=MAY + timedelta(days=1), min_relevance=0
    )
    assert {h.note_id for h in may.results} == set(ids["hike"])
    saved = await client.save(user, "I ran a marathon", occurred_at=MAY, advise=False)
    dated = await client.search(user, "marathon", since=MAY, until=MAY, after=saved.token)
    assert [h.note_id for h in dated.results] == [saved.note_id], "a note's occurred_at is its time"


async def test_forgetting_a_session_asks_then_erases_it_provably_and_keeps_the_others(
    service: RunningService,
    client: EngramClient,
    user: str,
) -> None:
    ids, _ = await import_sessions(client, user)
    asked = await client.forget_session(user, "bread")
    assert asked.status == "confirmation_required" and "3 messages" in asked.message
    still = await client.search(user, "sourdough", include_conversation=True, after=asked.token)
    assert ids["bread"][0] in [h.note_id for h in still.results], "nothing erased before the second call"
    done = await client.forget_session(user, "bread")
    assert done.status == "forgotten" and sorted(done.forgotten) == sorted(ids["bread"])
    gone = await client.search(user, "sourdough starter bread", include_conversation=True, after=done.token)
    assert not set(ids["bread"]) & {h.note_id for h in gone.results}
    kept = await client.search(user, "Mount Tamalpais", include_conversation=True)
    assert kept.results[0].note_id == ids["hike"][2]
    needles = [b"Clint Yeastwood", b"doubled in size"]
    redis = aioredis.Redis.from_url(service.settings.redis_url)
    try:
        # The request streams are trimmed just after the reply.
        await until_none(lambda: holding(redis, needles), what="plaintext left in Redis")
    finally:
        await redis.aclose()
    with pytest.raises(EngramError) as again:
        await client.forget_session(user, "bread", command_id="never-seen")
    assert again.value.code is ErrorCode.MEMORY_NOT_FOUND, "an erased (or unknown) conversation is not found"
    with pytest.raises(EngramError) as odd:
        await client.forget_session(user, "s{0} {count}")
    assert odd.value.code is ErrorCode.MEMORY_NOT_FOUND
    weird = await client.record_messages(user, "s{0} {count}", [MessageDraft(content="braces in a session id")])
    asked_odd = await client.forget_session(user, "s{0} {count}")
    assert asked_odd.status == "confirmation_required" and "s{0} {count}" in asked_odd.message
    erased = await client.forget_session(user, "s{0} {count}")
    assert erased.forgotten == [weird.notes[0].note_id]
    async with aioredis.Redis.from_url(service.settings.redis_url) as probe:

        async def deadlines() -> list[bytes]:
            members = await probe.zrange("engram:{0}:forget:deadlines", 0, -1)
            return [m for m in members if m.startswith(member(user, "").encode())]

        # The saga drops the session's deadline with its receipt.
        await until_none(deadlines, what="the user's deadlines")


async def test_the_engram_search_tool_reaches_past_conversations_and_time_windows(
    client: EngramClient, user: str
) -> None:
    ids, token = await import_sessions(client, user)
    tools = ToolDispatcher(client, user, "engram")
    await client.search(user, "sync", include_conversation=True, after=token)
    found = await tools.call("search", {"query": "Clint Yeastwood sourdough", "include_conversations": True})
    assert found["results"][0]["note_id"] == ids["bread"][0]
    assert found["results"][0]["message"]["speaker"] == "Bob"
    notes_only = await tools.call("search", {"query": "Clint Yeastwood sourdough"})
    assert notes_only["results"] == []
    may = await tools.call(
        "search",
        {
            "query": "what happened?",
            "include_conversations": True,
            "until": "2023-05-09T00:00:00",
            "top_k": 20,
            "min_relevance": 0,
        },
    )
    assert {r["note_id"] for r in may["results"]} == set(ids["hike"])
    bad = await tools.call("search", {"query": "x", "since": "last tuesday"})
    assert bad["error"]["code"] == "INVALID_PARAMETER"


async def test_a_time_the_question_names_brings_what_was_said_then_first(client: EngramClient, user: str) -> None:
    """Two trips told alike in two conversations a month apart: the question's month decides
    which one it asks about; without a month, the closer words win."""
    may = await client.record_messages(
        user, "may", turns([("Tess", "We went hiking up Mount Tamalpais with the kids, what a view!")], MAY)
    )
    june = await client.record_messages(
        user, "june", turns([("Tess", "We went hiking again, a long walk along the coast this time.")], JUNE)
    )
    asked = {"include_conversation": True, "after": june.token, "min_relevance": 0}
    plain = await client.search(user, "Where did Tess go hiking with the kids up the mountain?", **asked)
    assert plain.results[0].note_id == may.notes[0].note_id
    in_june = await client.search(user, "Where did Tess go hiking with the kids up the mountain in June 2023?", **asked)
    assert in_june.results[0].note_id == june.notes[0].note_id
    in_may = await client.search(user, "Where did Tess go hiking in May 2023?", **asked)
    assert in_may.results[0].note_id == may.notes[0].note_id


async def test_a_question_about_a_time_and_nothing_else_is_answered_by_what_happened_then(
    client: EngramClient,
    user: str,
) -> None:
    written = await client.record_messages(
        user, "june", turns([("Ida", "Finally finished repainting the garden shed, it took all weekend.")], JUNE)
    )
    await client.record_messages(user, "may", turns([("Ida", "Booked the dentist for next month.")], MAY))
    # Nothing in the turn is like the words of the question: only its time answers it.
    then = await client.search(user, "What did I do in June 2023?", include_conversation=True, after=written.token)
    assert [h.note_id for h in then.results] == [written.notes[0].note_id]
    assert then.results[0].relevance < DEFAULT_FLOOR, "kept for its time, not for its relevance"
