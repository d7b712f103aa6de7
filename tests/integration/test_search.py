"""Semantic memory through the real bus: hybrid search, isolation, supersede, read-your-writes,
chunking, and the index projection's rebuild and redelivery."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.bus.client import EngramClient, ReadYourWrites
from tests.conftest import RunningService

# One service for the module (tests/conftest.py, ``shared_service``): each test is a user of its own.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def service(shared_service: RunningService) -> RunningService:
    return shared_service


@pytest.fixture
def client(shared_client: EngramClient) -> EngramClient:
    return shared_client


FACTS = [
    ("person", "Alec is my boss at TechCorp"),
    ("person", "My sister Sarah lives in Los Angeles"),
    ("preference", "I prefer tasks to have due dates on Fridays"),
    ("preference", "I like my coffee black, no sugar"),
    ("context", "I work on the Platform team, mostly in Python"),
    ("context", "My dog Max needs a walk at 7am every day"),
    ("project", "Project Zephyrine uses PostgreSQL 16 and Kafka"),
    ("health", "I am allergic to peanuts"),
]


async def remember(client: EngramClient, user: str) -> tuple[dict[str, str], str]:
    ids, token = {}, ""
    for category, text in FACTS:
        written = await client.save(user, text, category=category)
        ids[text], token = written.note_id, written.token
    return ids, token


async def top(client: EngramClient, user: str, query: str, **kwargs) -> list[str]:  # type: ignore[no-untyped-def]
    return [hit.content for hit in (await client.search(user, query, **kwargs)).results]


async def test_hybrid_search_finds_by_meaning_and_by_rare_keyword(client: EngramClient, user: str) -> None:
    _, token = await remember(client, user)
    meaning = await client.search(user, "who is my manager at work?", after=token)
    assert meaning.results[0].note.content == "Alec is my boss at TechCorp"
    assert 0 < meaning.results[0].similarity <= 1 and meaning.results[0].score > 0
    assert (await top(client, user, "what food must I avoid"))[0] == "I am allergic to peanuts"
    assert (await top(client, user, "Zephyrine"))[0] == "Project Zephyrine uses PostgreSQL 16 and Kafka"
    # Each hit says the parts the fusion weighed: the rare word's note scores on keywords, a
    # note found by meaning alone on the cosine only.
    rare = (await client.search(user, "Zephyrine", after=token)).results
    assert rare[0].keyword > 0 and all(h.keyword == 0 for h in rare[1:]), [(h.content, h.keyword) for h in rare]
    assert meaning.results[0].keyword == 0, "no word of the question is in 'Alec is my boss at TechCorp'"
    assert await top(client, user, "pets", top_k=1) == ["My dog Max needs a walk at 7am every day"]
    everything = await client.search(user, "anything at all", top_k=20, min_relevance=0)
    assert len(everything.results) == len(FACTS)
    only = await top(client, user, "what do I like", category="preference", min_relevance=0)
    assert set(only) == {"I prefer tasks to have due dates on Fridays", "I like my coffee black, no sugar"}


async def test_search_never_returns_another_users_note_even_with_identical_text(
    client: EngramClient, user: str
) -> None:
    alice_ids, _ = await remember(client, user)
    bob = await client.save("bob", "Alec is my boss at TechCorp")
    for who, expected in ((user, alice_ids["Alec is my boss at TechCorp"]), ("bob", bob.note_id)):
        reply = await client.search(who, "Alec is my boss at TechCorp", top_k=20, after=bob.token)
        assert {hit.note.user_id for hit in reply.results} == {who}
        assert reply.results[0].note.id == expected
    assert (await client.search("mallory", "Alec boss", top_k=20)).results == []


async def test_no_score_or_rank_of_a_user_depends_on_another_users_notes(client: EngramClient) -> None:
    """BM25's statistics are the user's own: dave's hits (ids, order, every score and the
    relevance) are identical before frank writes notes sharing dave's rare words, while frank's
    notes are there, and after frank is erased."""
    for text in (
        "My cat Zyzzyva sleeps on the piano",
        "Zyzzyva was adopted from the Lisbon shelter",
        "The piano tuner comes on Thursdays",
        "Thursday is also bin day",
    ):
        token = (await client.save("dave", text, advise=False)).token
    queries = ["zyzzyva", "piano thursdays", "who is Zyzzyva the cat?"]

    async def daves() -> list[list[tuple[str, float, float, float, float]]]:
        replies = [await client.search("dave", q, after=token, min_relevance=0.0) for q in queries]
        return [[(h.note_id, h.score, h.similarity, h.keyword, h.relevance) for h in r.results] for r in replies]

    alone = await daves()
    assert all(alone) and any(h[3] > 0 for hits in alone for h in hits)
    for n in range(30):
        token = (await client.save("frank", f"zyzzyva piano note {n} on thursdays", advise=False)).token
    assert await daves() == alone
    erased = await client.forget_user("frank", confirmed=True)
    assert erased.status == "forgotten"
    assert erased.token is not None
    token = erased.token
    assert await daves() == alone


async def test_superseded_notes_leave_default_results_at_once_and_show_on_request(
    client: EngramClient, user: str
) -> None:
    seattle = await client.save(user, "User lives in Seattle")
    austin = await client.save(user, "User moved to Austin last month")
    superseded = await client.supersede(user, seattle.note_id, austin.note_id)
    default = await client.search(user, "where does the user live", after=superseded.token)
    assert [hit.note_id for hit in default.results] == [austin.note_id]
    everything = await client.search(user, "where does the user live", include_superseded=True, min_relevance=0)
    assert {hit.note_id for hit in everything.results} == {seattle.note_id, austin.note_id}
    assert next(h for h in everything.results if h.note_id == seattle.note_id).note.status.value == "superseded"


async def test_updates_are_searched_by_their_new_text(client: EngramClient, user: str) -> None:
    note = await client.save(user, "Sarah works on the Platform team")
    moved = await client.update(user, note.note_id, content="Sarah moved to the Design team as its lead")
    hits = (await client.search(user, "design lead", after=moved.token)).results
    assert hits[0].note.id == note.note_id and hits[0].note.version == 2
    assert hits[0].note.content == "Sarah moved to the Design team as its lead"


async def test_long_notes_are_chunked_and_answered_as_one_note(client: EngramClient, user: str) -> None:
    filler = " ".join(f"On day {i} of the trip we walked around the old town and ate local food." for i in range(60))
    story = filler + " On the last evening we finally saw the aurora borealis over the frozen lake."
    long_note = await client.save(user, story, kind="episode", summary="A long winter trip")  # type: ignore[arg-type]
    await client.save(user, "I like hiking in the summer")
    hits = (
        await client.search(user, "northern lights", top_k=5, after=(await client.save(user, "x y z")).token)
    ).results
    assert hits[0].note.id == long_note.note_id
    assert [h.note_id for h in hits].count(long_note.note_id) == 1


async def test_a_saved_note_is_found_with_its_token_under_concurrent_load(client: EngramClient) -> None:
    async def writer(user: str) -> None:
        session = ReadYourWrites(client, user)
        for i in range(6):
            written = await session.save(f"{user} remembers the secret codeword kumquat{i}{user}")
            hits = (await session.search(f"kumquat{i}{user}", top_k=1)).results
            assert [h.note_id for h in hits] == [written.note_id]

    await asyncio.gather(*[writer(f"user{u}") for u in range(6)])


async def test_bad_search_input_is_invalid_parameter(client: EngramClient, user: str) -> None:
    for kwargs in ({"top_k": 0}, {"top_k": 21}):
        with pytest.raises(EngramError) as info:
            await client.search(user, "x", **kwargs)  # type: ignore[arg-type]
        assert info.value.code is ErrorCode.INVALID_PARAMETER
    with pytest.raises(EngramError) as blank:
        await client.search(user, "   ")
    assert blank.value.code is ErrorCode.INVALID_PARAMETER


async def test_a_changed_model_is_detected_at_start(redis_url: str, user: str) -> None:
    from engram_ledger.contracts.channels import model_key
    from engram_ledger.projections.index_runtime import ModelMismatch
    from tests.conftest import service_settings

    redis = aioredis.Redis.from_url(redis_url)
    await redis.set(model_key(0), '{"model": "some/other-model", "dimension": 768}')
    running = await RunningService(service_settings(redis_url)).start()
    try:
        assert running.engram.index is not None
        with pytest.raises(ModelMismatch, match="engram rebuild index"):
            await running.engram.index.sync()
        async with EngramClient(redis_url) as c:
            with pytest.raises(EngramError) as info:
                await c.search(user, "anything")
            assert info.value.code is ErrorCode.EMBEDDING_ERROR and "some/other-model" in info.value.message
    finally:
        await running.stop()
        await redis.aclose()


async def test_conversation_search_stays_in_its_session_and_merges_with_memory(client: EngramClient, user: str) -> None:
    note = await client.save(user, "My flight home is usually on Sunday evening")
    said = await client.record_message(user, "chat-1", "Remind me: my flight tonight leaves at 9pm from gate B12")
    await client.record_message(user, "chat-2", "In another chat, my flight leaves at 6am")
    await client.record_message("bob", "chat-1", "Bob's flight leaves at noon")
    last = await client.record_message(user, "chat-1", "I also need to buy sunscreen", role="assistant")

    merged = await client.search(
        user, "when does my flight leave?", include_conversation=True, session_id="chat-1", after=last.token
    )
    by_source = {}
    for hit in merged.results:
        by_source.setdefault(hit.found_in, hit)  # the best of each source
    assert by_source["conversation"].note_id == said.note_id and by_source["memory"].note_id == note.note_id
    assert by_source["conversation"].message is not None and by_source["conversation"].message.session_id == "chat-1"
    contents = {hit.content for hit in merged.results}
    assert "In another chat, my flight leaves at 6am" not in contents and "Bob's flight leaves at noon" not in contents

    plain = await client.search(user, "when does my flight leave?")
    assert {hit.found_in for hit in plain.results} == {"memory"}
    assert [n.id for n in (await client.list_notes(user)).notes] == [note.note_id]
    with pytest.raises(EngramError) as info:
        await client.update(user, said.note_id, content="rewriting a message")
    assert info.value.code is ErrorCode.MEMORY_NOT_FOUND
    # Without a session: every conversation of hers (long-term memory), never Bob's.
    everywhere = await client.search(
        user, "when does my flight leave?", include_conversation=True, top_k=10, min_relevance=0
    )
    contents = {hit.content for hit in everywhere.results}
    assert "In another chat, my flight leaves at 6am" in contents and said.note_id in {
        h.note_id for h in everywhere.results
    }
    assert "Bob's flight leaves at noon" not in contents


async def test_the_qdrant_server_adapter_serves_the_same_search(redis_url: str, user: str) -> None:
    from tests.conftest import service_settings

    # qdrant-client's local mode stands in for a Qdrant server here (ENGRAM_QDRANT_URL).
    running = await RunningService(service_settings(redis_url, qdrant_url=":memory:")).start()
    try:
        async with EngramClient(redis_url) as c:
            _, token = await remember(c, user)
            await c.save("bob", "Alec is my boss at TechCorp")
            hits = (await c.search(user, "who is my manager at work?", after=token)).results
            assert hits[0].content == "Alec is my boss at TechCorp" and {h.note.user_id for h in hits if h.note} == {
                user
            }
            seattle = await c.save(user, "User lives in Seattle")
            austin = await c.save(user, "User moved to Austin last month")
            assert [s.note_id for s in austin.similar] == [seattle.note_id]
    finally:
        await running.stop()


async def test_reads_are_counted_beside_the_log_and_blended_ranking_is_opt_in(
    service: RunningService, client: EngramClient, user: str
) -> None:
    old = await client.save(user, "I keep my passport in the blue drawer", importance=0.1, advise=False)
    new = await client.save(user, "The spare house key is in the blue vase", importance=1.0, advise=False)
    plain = await client.search(user, "where do I keep my passport?", after=new.token)
    assert [h.note_id for h in plain.results][:1] == [old.note_id]
    blended = await client.search(user, "where is it in the blue one?", ranking="blended")
    assert blended.results[0].note_id == new.note_id, "importance lifts a note when asked to blend"
    log = await _log_length(service.settings.redis_url)
    for _ in range(3):
        await client.search(user, "passport")
    note = await client.get_note(user, old.note_id)
    assert note.access_count >= 3 and note.last_accessed_at is not None
    assert await _log_length(service.settings.redis_url) == log, "reads append nothing to the event log"


async def _log_length(url: str) -> int:
    async with aioredis.Redis.from_url(url) as redis:
        return int(await redis.xlen("engram:{0}:log"))


async def test_a_note_is_indexed_with_its_subject_and_again_when_renamed(
    service: RunningService,
    client: EngramClient,
    user: str,
) -> None:
    from engram_ledger.services.application.terms import sparse_query
    from engram_ledger.services.application.vector_index import SPARSE, NearestQuery

    written = await client.save(user, "Loves omakase and always orders the uni", subject="Priya", advise=False)
    other = await client.save(user, "Prefers window seats on long flights", advise=False)
    runtime = service.engram.index
    assert runtime is not None

    async def by_keyword(word: str) -> list[str]:
        await client.search(user, "sync", after=last)
        ask = NearestQuery(user_id=user, using=SPARSE, sparse=sparse_query(word), match={}, limit=10)
        return [h.payload["note_id"] for h in await runtime.index.nearest(ask)]

    last = other.token
    assert await by_keyword("Priya") == [written.note_id], "the subject is part of what BM25 indexes"
    last = (await client.update(user, written.note_id, subject="Jonas")).token
    assert await by_keyword("Jonas") == [written.note_id], "a new subject alone re-indexes the note"
    assert await by_keyword("Priya") == []
    assert await by_keyword("omakase") == [written.note_id], "with its content read back from the log"
