"""The query responders' application service over the in-memory history: each query's reply,
user isolation (another user's note is not found, exactly like a missing one), waiting for a
caller's token, read counts, and typed refusals of malformed bytes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from engram_ledger.contracts.commands import RequestForget, SaveNote, SupersedeNote, UpdateNote
from engram_ledger.contracts.errors import EngramError, ErrorCode, ErrorReply
from engram_ledger.contracts.limits import MAX_MESSAGE_BYTES
from engram_ledger.contracts.model import NoteStatus
from engram_ledger.contracts.queries import (
    GetHistory,
    GetNote,
    HistoryReply,
    ListNotes,
    ListRecent,
    NoteReply,
    NotesReply,
    QueryReply,
    SearchNotes,
)
from engram_ledger.services.application.commands import CommandService, command_handlers
from engram_ledger.services.application.forget import ForgetService
from engram_ledger.services.application.queries import QueryService, query_handlers
from tests.fakes import InMemoryAccess, InMemoryEventStore, InMemoryHistory, InMemoryPendingDeletions, RecordingScrub

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
_replies = msgspec.json.Decoder(QueryReply)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now

    def tick(self) -> datetime:
        self.now += timedelta(minutes=1)
        return self.now


@dataclass
class World:
    store: InMemoryEventStore
    history: InMemoryHistory
    access: InMemoryAccess
    clock: Clock
    commands: CommandService
    forget: ForgetService
    queries: QueryService

    async def save(self, content: str, user: str = "alice", category: str = "context") -> str:
        self.clock.tick()
        command = SaveNote(command_id=f"save-{user}-{content}", user_id=user, content=content, category=category)
        return (await self.commands.execute(command)).note_id  # type: ignore[union-attr]

    async def reply(self, body: bytes) -> QueryReply:
        """Through the bus entry point: bytes in, bytes out."""
        return _replies.decode(await self.queries.handle(body))


def make_world(read_wait_seconds: float = 1.0) -> World:
    store = InMemoryEventStore()
    history = InMemoryHistory(store)
    access = InMemoryAccess()
    clock = Clock()
    forget = ForgetService(
        store, history, InMemoryPendingDeletions(store), None, RecordingScrub(), clock, timedelta(minutes=5)
    )
    commands = CommandService(command_handlers(store, clock, forget=forget))
    queries = QueryService(query_handlers(history, read_wait_seconds, access=access))
    return World(store, history, access, clock, commands, forget, queries)


@pytest.fixture
def world() -> World:
    return make_world()


async def test_get_note_returns_its_current_view(world: World) -> None:
    # given
    note = await world.save("Works at TechCorp")
    await world.commands.execute(UpdateNote(command_id="u", user_id="alice", note_id=note, content="Works at Initech"))
    # when
    reply = await world.queries.ask(GetNote(user_id="alice", note_id=note))
    # then
    assert isinstance(reply, NoteReply)
    assert (reply.note.id, reply.note.content, reply.note.version, reply.note.status) == (
        note,
        "Works at Initech",
        2,
        NoteStatus.ACTIVE,
    )


async def test_a_read_note_is_counted_and_shows_the_count_it_leaves(world: World) -> None:
    note = await world.save("Works at TechCorp")
    first = await world.queries.ask(GetNote(user_id="alice", note_id=note))
    second = await world.queries.ask(GetNote(user_id="alice", note_id=note))
    assert isinstance(first, NoteReply) and isinstance(second, NoteReply)
    assert first.note.access_count == 1 and first.note.last_accessed_at is not None
    assert second.note.access_count == 2 and second.note.last_accessed_at >= first.note.last_accessed_at


async def test_get_history_lists_every_version_oldest_first(world: World) -> None:
    # given
    note = await world.save("Works at TechCorp")
    await world.commands.execute(UpdateNote(command_id="u", user_id="alice", note_id=note, content="Works at Initech"))
    newer = await world.save("Works at Globex")
    await world.commands.execute(SupersedeNote(command_id="s", user_id="alice", note_id=note, superseded_by=newer))
    # when
    reply = await world.queries.ask(GetHistory(user_id="alice", note_id=note))
    # then
    assert isinstance(reply, HistoryReply) and (reply.note_id, reply.status) == (note, "superseded")
    assert [(v.version, v.change, v.content) for v in reply.versions] == [
        (1, "saved", "Works at TechCorp"),
        (2, "updated", "Works at Initech"),
        (3, "superseded", "Works at Initech"),
    ]
    assert reply.versions[-1].superseded_by == newer
    replacement = await world.queries.ask(GetNote(user_id="alice", note_id=newer))
    assert replacement.note.supersedes == [note]  # type: ignore[union-attr]


async def test_list_notes_is_ordered_by_category_then_age_and_filters(world: World) -> None:
    # given: saved in an order that is neither the categories' nor reversed
    late_person = await world.save("Alec is my boss", category="person")
    early_project = await world.save("Engram ships in May", category="project")
    later_person = await world.save("Sam is my sister", category="person")
    old = await world.save("Lives in Seattle", category="context")
    new = await world.save("Lives in Austin", category="context")
    await world.commands.execute(SupersedeNote(command_id="s", user_id="alice", note_id=old, superseded_by=new))
    # when
    listed = await world.queries.ask(ListNotes(user_id="alice"))
    everything = await world.queries.ask(ListNotes(user_id="alice", include_superseded=True))
    people = await world.queries.ask(ListNotes(user_id="alice", category="person"))
    # then
    assert isinstance(listed, NotesReply) and isinstance(everything, NotesReply) and isinstance(people, NotesReply)
    assert [n.id for n in listed.notes] == [new, late_person, later_person, early_project]
    assert listed.total == 4
    assert [n.id for n in everything.notes] == [old, new, late_person, later_person, early_project]
    assert [n.id for n in people.notes] == [late_person, later_person]


async def test_list_recent_is_newest_first_with_the_total(world: World) -> None:
    # given
    notes = [await world.save(f"fact number {i}") for i in range(5)]
    await world.commands.execute(
        SupersedeNote(command_id="s", user_id="alice", note_id=notes[4], superseded_by=notes[0])
    )
    await world.forget.request(RequestForget(command_id="f", user_id="alice", note_ids=[notes[3]], confirmed=True))
    # when
    reply = await world.queries.ask(ListRecent(user_id="alice", limit=2))
    # then: only active notes, newest first
    assert isinstance(reply, NotesReply)
    assert [n.id for n in reply.notes] == [notes[2], notes[1]] and reply.total == 3


async def test_another_users_note_is_not_found_exactly_like_a_missing_one(world: World) -> None:
    # given
    note = await world.save("Alice's diary")
    missing = "ZZZZZZZZ" if note != "ZZZZZZZZ" else "YYYYYYYY"
    for query in (GetNote, GetHistory):
        # when
        theirs = await world.reply(msgspec.json.encode(query(user_id="bob", note_id=note)))
        nobodys = await world.reply(msgspec.json.encode(query(user_id="alice", note_id=missing)))
        # then
        assert isinstance(theirs, ErrorReply) and theirs.code is ErrorCode.MEMORY_NOT_FOUND
        assert isinstance(nobodys, ErrorReply)
        assert theirs.message == nobodys.message.replace(missing, note)
    bobs = await world.queries.ask(ListNotes(user_id="bob", include_superseded=True))
    assert bobs == NotesReply(notes=[], total=0)
    assert world.access.counts == {}, "a refused read counts nothing"


async def test_a_read_with_a_token_waits_until_the_read_model_has_it() -> None:
    # given a read model behind the log
    world = make_world(read_wait_seconds=2.0)
    world.history.following = False
    saved = await world.commands.execute(SaveNote(command_id="c", user_id="alice", content="Works at TechCorp"))
    with pytest.raises(EngramError) as not_yet:
        await world.queries.ask(GetNote(user_id="alice", note_id=saved.note_id))  # type: ignore[union-attr]
    assert not_yet.value.code is ErrorCode.MEMORY_NOT_FOUND, "without the token the read does not wait"

    # when the read model catches up while the read waits
    async def later() -> None:
        await asyncio.sleep(0.05)  # so that the read is waiting when it does
        await world.history.catch_up()

    catching_up = asyncio.create_task(later())
    reply = await world.queries.ask(GetNote(user_id="alice", note_id=saved.note_id, after=saved.token))  # type: ignore[union-attr]
    await catching_up
    # then
    assert isinstance(reply, NoteReply) and reply.note.content == "Works at TechCorp"


async def test_a_token_the_read_model_does_not_reach_in_time_is_a_timeout() -> None:
    world = make_world(read_wait_seconds=0.05)
    world.history.following = False
    saved = await world.commands.execute(SaveNote(command_id="c", user_id="alice", content="Works at TechCorp"))
    body = msgspec.json.encode(GetNote(user_id="alice", note_id=saved.note_id, after=saved.token))  # type: ignore[union-attr]
    reply = await world.reply(body)
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.TIMEOUT
    assert saved.token in reply.message


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"{oops", id="not JSON"),
        pytest.param(b'{"type": "get_note", "user_id": "alice"}', id="a field missing"),
        pytest.param(b'{"type": "drop_table", "user_id": "alice"}', id="unknown type"),
        pytest.param(b'{"type": "get_note", "user_id": "alice", "note_id": "short"}', id="a bad note id"),
        pytest.param(b'{"type": "list_recent", "user_id": "alice", "limit": 0}', id="out of range"),
        pytest.param(b'{"type": "save_note", "command_id": "c", "user_id": "a", "content": "x"}', id="a command"),
        pytest.param(b" " * (MAX_MESSAGE_BYTES + 1), id="oversized"),
    ],
)
async def test_malformed_query_bytes_get_a_typed_error_reply(world: World, body: bytes) -> None:
    reply = await world.reply(body)
    assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.INVALID_PARAMETER and reply.message


async def test_a_search_where_search_is_off_is_unavailable(world: World) -> None:
    with pytest.raises(EngramError) as refused:
        await world.queries.ask(SearchNotes(user_id="alice", query="boss"))
    assert refused.value.code is ErrorCode.UNAVAILABLE


async def test_without_search_a_search_is_unavailable_after_its_filter_is_checked(world: World) -> None:
    # given a deployment without the index (this world has no search service)
    asked = b'{"type": "search_notes", "user_id": "alice", "query": "jazz"}'
    bad_filter = b'{"type": "search_notes", "user_id": "alice", "query": "jazz", "where": {"a": {"$nope": 1}}}'
    # when / then
    off = await world.reply(asked)
    assert isinstance(off, ErrorReply) and off.code == "UNAVAILABLE" and "search is off" in off.message
    refused = await world.reply(bad_filter)
    assert isinstance(refused, ErrorReply) and refused.code == "INVALID_PARAMETER"
