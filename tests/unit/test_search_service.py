"""The search service without Redis or the model: a real Qdrant Edge shard in a temporary
directory, fed by the real index projection's plan (``tests/fakes.InMemoryIndexRuntime``), a
word-hashing stand-in for MiniLM, and the in-memory history. Ranking, user isolation, time
windows, superseded and forgotten notes, conversations, and waiting for a token."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engram_ledger.contracts.commands import (
    MessageDraft,
    RecordMessages,
    RequestForget,
    SaveNote,
    SupersedeNote,
    UpdateNote,
)
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.model import NoteStatus
from engram_ledger.contracts.queries import SearchNotes, SearchReply
from engram_ledger.projections.qdrant_edge import QdrantEdgeIndex
from engram_ledger.services.application.commands import CommandService, command_handlers
from engram_ledger.services.application.forget import ForgetService
from engram_ledger.services.application.relevance import DEFAULT_FLOOR
from engram_ledger.services.application.search import SearchService
from engram_ledger.services.application.terms import sparse_query
from engram_ledger.services.application.vector_index import CONVERSATION, MEMORY, SPARSE, NearestQuery
from tests.fakes import (
    HashEmbedder,
    InMemoryEventStore,
    InMemoryHistory,
    InMemoryIndexRuntime,
    InMemoryPendingDeletions,
    ManualClock,
    RecordingScrub,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@dataclass
class World:
    store: InMemoryEventStore
    history: InMemoryHistory
    runtime: InMemoryIndexRuntime
    clock: ManualClock
    commands: CommandService
    forget: ForgetService
    search: SearchService
    saves: int = 0

    async def save(self, content: str, user: str = "alice", **fields: object) -> str:
        self.saves += 1
        command = SaveNote(command_id=f"save-{self.saves}", user_id=user, content=content, **fields)  # type: ignore[arg-type]
        return (await self.commands.execute(command)).note_id  # type: ignore[union-attr]

    async def find(self, text: str, user: str = "alice", **fields: object) -> SearchReply:
        await self.runtime.catch_up()
        return await self.search.search(SearchNotes(user_id=user, query=text, **fields))  # type: ignore[arg-type]


def ids(reply: SearchReply) -> list[str]:
    return [h.note_id for h in reply.results]


def make_world(index: QdrantEdgeIndex, read_wait_seconds: float = 1.0) -> World:
    store = InMemoryEventStore()
    history = InMemoryHistory(store)
    runtime = InMemoryIndexRuntime(store, index, HashEmbedder())
    clock = ManualClock(NOW)
    search = SearchService(runtime, history, read_wait_seconds, clock=clock)
    forget = ForgetService(
        store, history, InMemoryPendingDeletions(store), search, RecordingScrub(), clock, timedelta(minutes=5)
    )
    return World(
        store, history, runtime, clock, CommandService(command_handlers(store, clock, forget=forget)), forget, search
    )


@pytest.fixture
async def index(tmp_path: Path) -> AsyncIterator[QdrantEdgeIndex]:
    shard = QdrantEdgeIndex(tmp_path / "shard")
    await shard.ensure(HashEmbedder.dimension)
    yield shard
    await shard.close()


@pytest.fixture
def world(index: QdrantEdgeIndex) -> World:
    return make_world(index)


async def test_the_note_that_matches_ranks_first(world: World) -> None:
    # given
    boss = await world.save("Alec is my boss at TechCorp")
    coffee = await world.save("Likes black coffee in the morning")
    await world.save("Has a dog named Max")
    # when
    about_the_boss = await world.find("who is my boss?")
    about_coffee = await world.find("what coffee do I like")
    # then
    assert ids(about_the_boss)[0] == boss and ids(about_coffee)[0] == coffee
    best = about_the_boss.results[0]
    assert (best.content, best.found_in, best.note.id) == ("Alec is my boss at TechCorp", MEMORY, boss)  # type: ignore[union-attr]
    assert best.score > max((h.score for h in about_the_boss.results[1:]), default=0.0)


async def test_top_k_bounds_the_results(world: World) -> None:
    for i in range(6):
        await world.save(f"coffee fact number {i}")
    assert len((await world.find("coffee", top_k=3)).results) == 3


async def test_a_search_never_returns_another_users_notes(world: World) -> None:
    # given the same text for two users
    alices = await world.save("Alec is my boss")
    bobs = await world.save("Alec is my boss", user="bob")
    # when
    for_alice = await world.find("boss")
    for_bob = await world.find("boss", user="bob")
    for_carol = await world.find("boss", user="carol")
    # then
    assert ids(for_alice) == [alices] and ids(for_bob) == [bobs] and for_carol.results == []
    assert {h.note.user_id for h in for_alice.results} == {"alice"}  # type: ignore[union-attr]


async def test_a_subject_filter_matches_case_and_spacing_aside_and_the_index_holds_no_subject(
    world: World, index: QdrantEdgeIndex
) -> None:
    # given notes about two people, the same name for another user, and a note renamed
    sarah = await world.save("Works on the Platform team", subject="Sarah Lindqvist")
    await world.save("Works on the Design team", subject="Marco")
    await world.save("Works on the Platform team", user="bob", subject="Sarah Lindqvist")
    renamed = await world.save("Works on the Data team", subject="Marco")
    await world.commands.execute(
        UpdateNote(command_id="u", user_id="alice", note_id=renamed, subject="sarah lindqvist")
    )
    # when / then
    assert set(ids(await world.find("team", subject="SARAH  lindqvist"))) == {sarah, renamed}
    assert ids(await world.find("team", subject="Sarah")) == [], "a whole subject, not a word of it"
    assert ids(await world.find("team", user="bob", subject="Marco")) == []
    # and the name is still a keyword (BM25 keeps hashed term ids, not the text), also of a
    # note whose content changed since (its subject read back from the store)
    await world.commands.execute(UpdateNote(command_id="c", user_id="alice", note_id=sarah, content="Leads Platform"))
    await world.runtime.catch_up()
    ask = NearestQuery(user_id="alice", using=SPARSE, sparse=sparse_query("Lindqvist"), match={}, limit=10)
    assert {h.payload["note_id"] for h in await index.nearest(ask)} == {sarah, renamed}
    payloads = await index.payloads()
    assert payloads and not [p for p in payloads if "lindqvist" in str(p).casefold() or "marco" in str(p).casefold()]


async def test_an_index_state_written_with_a_plaintext_subject_is_hashed_when_next_touched(
    world: World, index: QdrantEdgeIndex
) -> None:
    # given a note's index state as versions before hashed subjects wrote it
    note = await world.save("Works on the Platform team", subject="Sarah")
    await world.runtime.catch_up()
    (key,) = [k for k, v in world.runtime.redis.values.items() if b'"subject_key"' in v]
    state = json.loads(world.runtime.redis.values[key])
    del state["subject_key"]
    world.runtime.redis.values[key] = json.dumps(state | {"subject": "Sarah"}).encode()
    # when the note changes
    await world.commands.execute(UpdateNote(command_id="u", user_id="alice", note_id=note, importance=0.9))
    # then the state keeps only the hash, and the filter matches
    assert ids(await world.find("team", subject="sarah")) == [note]
    assert b"Sarah" not in world.runtime.redis.values[key]


async def test_since_and_until_bound_when_a_note_happened(world: World) -> None:
    # given notes saved an hour apart, and one saved last but about something long ago
    times = [NOW + timedelta(hours=h) for h in range(3)]
    saved = []
    for at, text in zip(times, ["coffee at breakfast", "coffee at lunch", "coffee at dinner"], strict=True):
        world.clock.now = at
        saved.append(await world.save(text))
    world.clock.now = NOW + timedelta(hours=5)
    long_ago = await world.save("coffee on a trip", occurred_at=NOW - timedelta(days=30))
    # when / then
    assert set(ids(await world.find("coffee", min_relevance=0, since=times[1]))) == {saved[1], saved[2]}
    assert set(ids(await world.find("coffee", min_relevance=0, until=times[1]))) == {saved[0], saved[1], long_ago}
    assert ids(await world.find("coffee", min_relevance=0, since=times[1], until=times[1])) == [saved[1]]
    last_month = await world.find(
        "coffee", min_relevance=0, since=NOW - timedelta(days=31), until=NOW - timedelta(days=29)
    )
    assert ids(last_month) == [long_ago]


async def test_superseded_and_forgotten_notes_leave_the_results_at_once(world: World) -> None:
    # given notes the index has
    seattle = await world.save("Lives in Seattle")
    austin = await world.save("Lives in Austin")
    denver = await world.save("Lives in Denver")
    assert set(ids(await world.find("lives", min_relevance=0))) == {seattle, austin, denver}
    # when one is superseded and one forgotten, before the index has applied either
    await world.commands.execute(SupersedeNote(command_id="s", user_id="alice", note_id=seattle, superseded_by=austin))
    await world.forget.request(RequestForget(command_id="f", user_id="alice", note_ids=[denver], confirmed=True))
    lagging = await world.search.search(SearchNotes(user_id="alice", query="lives"))
    # then the read model already leaves them out
    assert ids(lagging) == [austin]
    # and a forgotten note is no hit even to a search that shows superseded ones
    lagging_all = await world.search.search(SearchNotes(user_id="alice", query="lives", include_superseded=True))
    assert set(ids(lagging_all)) == {seattle, austin}
    # and once the index has them too
    assert ids(await world.find("lives", min_relevance=0)) == [austin]
    with_superseded = await world.find("lives", include_superseded=True, min_relevance=0)
    assert set(ids(with_superseded)) == {seattle, austin}
    statuses = {h.note_id: h.note.status for h in with_superseded.results}  # type: ignore[union-attr]
    assert statuses == {seattle: NoteStatus.SUPERSEDED, austin: NoteStatus.ACTIVE}


async def test_conversations_are_searched_only_when_asked(world: World) -> None:
    # given
    note = await world.save("Prefers cats to dogs")
    command = RecordMessages(
        command_id="r1",
        user_id="alice",
        session_id="s1",
        messages=[MessageDraft(content="We adopted a puppy named Rex", speaker="Alice")],
    )
    (said,) = (await world.commands.execute(command)).notes  # type: ignore[union-attr]
    other = RecordMessages(
        command_id="r2", user_id="alice", session_id="s2", messages=[MessageDraft(content="Rex the puppy is sick")]
    )
    (elsewhere,) = (await world.commands.execute(other)).notes  # type: ignore[union-attr]
    # when
    notes_only = await world.find("puppy Rex")
    with_talk = await world.find("puppy Rex", include_conversation=True)
    one_session = await world.find("puppy Rex", include_conversation=True, session_id="s1")
    # then
    assert CONVERSATION not in {h.found_in for h in notes_only.results}
    assert {said.note_id, elsewhere.note_id} <= set(ids(with_talk))
    hit = next(h for h in with_talk.results if h.note_id == said.note_id)
    assert (hit.found_in, hit.content, hit.message.session_id, hit.message.speaker) == (  # type: ignore[union-attr]
        CONVERSATION,
        "We adopted a puppy named Rex",
        "s1",
        "Alice",
    )
    assert [h.note_id for h in one_session.results if h.found_in == CONVERSATION] == [said.note_id]
    assert note not in ids(with_talk)[:2], "the turns that name the puppy lead"


async def test_a_search_with_a_token_waits_for_the_index(index: QdrantEdgeIndex) -> None:
    # given an index behind the log
    world = make_world(index, read_wait_seconds=2.0)
    saved = await world.commands.execute(SaveNote(command_id="c", user_id="alice", content="Alec is my boss"))
    assert (await world.search.search(SearchNotes(user_id="alice", query="boss"))).results == []

    # when it catches up while the search waits
    async def later() -> None:
        await asyncio.sleep(0.05)  # so that the search is waiting when it does
        await world.runtime.catch_up()

    catching_up = asyncio.create_task(later())
    reply = await world.search.search(SearchNotes(user_id="alice", query="boss", after=saved.token))
    await catching_up
    # then
    assert ids(reply) == [saved.note_id]  # type: ignore[union-attr]


async def test_a_token_the_index_does_not_reach_in_time_is_a_timeout(index: QdrantEdgeIndex) -> None:
    world = make_world(index, read_wait_seconds=0.05)
    saved = await world.commands.execute(SaveNote(command_id="c", user_id="alice", content="Alec is my boss"))
    with pytest.raises(EngramError) as refused:
        await world.search.search(SearchNotes(user_id="alice", query="boss", after=saved.token))
    assert refused.value.code is ErrorCode.TIMEOUT


async def test_forget_by_query_lists_candidates_from_the_search_and_deletes_nothing(world: World) -> None:
    lives = await world.save("Lives in San Francisco near the park")
    await world.save("Likes black coffee")
    await world.runtime.catch_up()
    reply = await world.forget.request(RequestForget(command_id="q", user_id="alice", query="San Francisco"))
    assert reply.status == "candidates" and [c.note_id for c in reply.candidates][:1] == [lives]
    assert reply.forgotten == [] and reply.pending == []
    assert (await world.history.get_note("alice", lives)).status is NoteStatus.ACTIVE  # type: ignore[union-attr]


async def test_each_hit_says_how_relevant_it_is_and_the_floor_leaves_out_what_is_not(world: World) -> None:
    # given
    boss = await world.save("Alec is my boss at TechCorp")
    await world.save("Likes black coffee in the morning")
    await world.save("Has a dog named Max")
    # when
    found = await world.find("who is my boss?")
    ranked = await world.find("who is my boss?", min_relevance=0)
    about_nothing = await world.find("What is the capital of Peru?")
    # then the note that answers is kept, the others fall below the service's floor
    assert [h.note_id for h in found.results] == [boss] and found.results[0].relevance >= DEFAULT_FLOOR
    assert len(ranked.results) == 3 and all(0 <= h.relevance <= 1 for h in ranked.results)
    assert all(h.relevance < DEFAULT_FLOOR for h in ranked.results[1:])
    assert about_nothing.results == []
    # and a floor of the caller's own replaces the service's
    assert (await world.find("who is my boss?", min_relevance=0.99)).results == []


async def test_pages_are_slices_of_one_ranking_above_the_floor(world: World) -> None:
    # More notes than the first slice the read model is read in (40), most of them weak matches.
    for i in range(60):
        await world.save(f"coffee fact number {i}" if i % 3 == 0 else f"tea note {i} about coffee and other things")
    offsets = range(0, 60, 5)
    kept = [h for o in offsets for h in (await world.find("coffee", top_k=5, offset=o)).results]
    ranked = [h for o in offsets for h in (await world.find("coffee", top_k=5, offset=o, min_relevance=0)).results]
    # Each hit has the relevance it has in the whole ranking, and the pages hold, in order, every
    # hit of that ranking at or above the floor: none skipped, none twice.
    above = [h for h in ranked if h.relevance >= DEFAULT_FLOOR]
    assert above and len(above) < len(ranked)
    assert [(h.note_id, h.relevance) for h in kept] == [(h.note_id, h.relevance) for h in above]


class LoadingEmbedder(HashEmbedder):
    """A model still loading: ``start`` waits until ``loaded`` is set."""

    def __init__(self) -> None:
        self.loaded = asyncio.Event()

    @property
    def ready(self) -> bool:  # type: ignore[override]
        return self.loaded.is_set()

    @property
    def loading_seconds(self) -> float:  # type: ignore[override]
        return 0.0 if self.loaded.is_set() else 42.0

    async def start(self) -> None:
        await self.loaded.wait()


async def test_a_search_while_the_model_loads_waits_within_its_callers_wait_then_says_starting(
    index: QdrantEdgeIndex,
) -> None:
    """Ready means ready: past its caller's wait, a search during a start is refused STARTING in
    words (how long the model has loaded), never left to time out; within it, it is answered."""
    import time

    from engram_ledger.services.application.deadline import caller_waits_until

    world = make_world(index)
    embedder = LoadingEmbedder()
    world.runtime.embedder = embedder
    world.search = SearchService(world.runtime, world.history, 1.0, clock=world.clock)
    note = await world.save("Alec is my boss at TechCorp")
    with caller_waits_until(time.time() + 0.8), pytest.raises(EngramError) as refused:
        await world.find("who is my boss?")
    assert refused.value.code is ErrorCode.STARTING and refused.value.retry_after_ms
    assert "loading for 42 s" in refused.value.message
    with caller_waits_until(time.time() + 30):
        answering = asyncio.create_task(world.find("who is my boss?"))
        await asyncio.sleep(0)
        embedder.loaded.set()
        assert ids(await answering)[0] == note


async def test_candidates_no_words_could_lift_to_the_floor_are_not_read(world: World) -> None:
    # More candidates than the first slice the read model is read in (40), none of them an answer:
    # past the first slice, no hit could reach the floor whatever its words (its rank alone keeps
    # it below), so the rest are never read.
    for i in range(120):
        await world.save(f"tea note {i} about coffee and other things")
    read: list[str] = []
    get_many = world.history.get_many

    async def counting(user_id: str, note_ids: list[str], message_ids: list[str] = []) -> object:  # noqa: B006
        read.extend([*note_ids, *message_ids])
        return await get_many(user_id, note_ids, message_ids)

    world.history.get_many = counting  # type: ignore[method-assign,assignment]
    found = await world.find("what is the capital of Peru?", top_k=10)
    assert len(read) == 40
    # and with no floor every page is read until it is full
    read.clear()
    ranked = await world.find("what is the capital of Peru?", top_k=50, min_relevance=0)
    assert len(ranked.results) == 50 and len(read) >= 50
    assert [h.note_id for h in found.results] == [h.note_id for h in ranked.results if h.relevance >= DEFAULT_FLOOR]
