"""Forgetting (requirements §1) through the application service over the in-memory store and read
models: the two calls, the deployment switch that makes it one, unknown ids with suggestions,
retries, a pending deletion lapsing when another note is named, erasing a user and a session,
and the scrub every forget owes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from engram_ledger.contracts.commands import (
    MessageDraft,
    RecordMessages,
    RequestForget,
    RequestForgetSession,
    RequestForgetUser,
    SaveNote,
)
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import ACCOUNT, session_stream
from engram_ledger.contracts.model import NoteStatus
from engram_ledger.contracts.queries import ForgetReply
from engram_ledger.services.application.commands import CommandService, command_handlers
from engram_ledger.services.application.forget import PREVIEW_CHARS, ForgetService
from tests.fakes import (
    InMemoryAccess,
    InMemoryEventStore,
    InMemoryHistory,
    InMemoryPendingDeletions,
    ManualClock,
    RecordingScrub,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TTL = timedelta(minutes=5)


@dataclass
class World:
    store: InMemoryEventStore
    history: InMemoryHistory
    pending: InMemoryPendingDeletions
    scrub: RecordingScrub
    access: InMemoryAccess
    clock: ManualClock
    commands: CommandService
    forget: ForgetService
    asked: int = 0

    async def save(self, content: str, user: str = "alice") -> str:
        reply = await self.commands.execute(SaveNote(command_id=f"save-{content}", user_id=user, content=content))
        return reply.note_id  # type: ignore[union-attr]

    async def record(self, session: str, *turns: str, user: str = "alice") -> list[str]:
        command = RecordMessages(
            command_id=f"record-{session}",
            user_id=user,
            session_id=session,
            messages=[MessageDraft(content=t) for t in turns],
        )
        return [n.note_id for n in (await self.commands.execute(command)).notes]  # type: ignore[union-attr]

    async def ask(
        self, *note_ids: str, command_id: str | None = None, user: str = "alice", **kw: object
    ) -> ForgetReply:
        self.asked += 1
        command_id = command_id or f"forget-call-{self.asked}"
        return await self.forget.request(
            RequestForget(command_id=command_id, user_id=user, note_ids=list(note_ids), **kw)  # type: ignore[arg-type]
        )

    async def log_length(self, user: str = "alice") -> int:
        return (await self.store.log_head(self.store.partition_of(user)))[1]


def make_world(confirmation: bool = True) -> World:
    store = InMemoryEventStore()
    history = InMemoryHistory(store)
    pending = InMemoryPendingDeletions(store)
    scrub = RecordingScrub()
    access = InMemoryAccess()
    clock = ManualClock(NOW)
    forget = ForgetService(store, history, pending, None, scrub, clock, TTL, confirmation=confirmation, access=access)
    return World(
        store,
        history,
        pending,
        scrub,
        access,
        clock,
        CommandService(command_handlers(store, clock, forget=forget)),
        forget,
    )


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = make_world()
    yield w
    if "owe" in w.scrub.calls:  # let the scrub that runs after the reply finish
        await asyncio.wait_for(w.scrub.scrubbed.wait(), 2)


async def test_the_first_call_only_asks_and_the_same_id_again_forgets(world: World) -> None:
    # given
    note = await world.save("Lives in San Francisco near the Golden Gate park")
    # when
    first = await world.ask(note)
    # then: pending, with a preview of what would go, until the deadline
    assert first.status == "confirmation_required" and first.forgotten == []
    (asked,) = first.pending
    assert (asked.note_id, asked.request_count, asked.expires_at) == (note, 1, NOW + TTL)
    assert asked.preview == "Lives in San Francisco near the Golden Gate park"
    assert "Please confirm" in first.message and note in first.message
    assert (await world.history.get_note("alice", note)).status is NoteStatus.ACTIVE  # type: ignore[union-attr]
    assert await world.pending.of("alice") == [note]
    # when
    second = await world.ask(note)
    # then
    assert second.status == "forgotten" and second.forgotten == [note] and second.pending == []
    assert second.message.startswith(f"Deleted successfully: {note}.")
    assert second.token is not None and await world.history.wait_for(second.token, 0.1)
    view = await world.history.get_note("alice", note)
    assert view is not None and view.status is NoteStatus.FORGOTTEN and view.content == ""
    assert await world.pending.of("alice") == []
    with pytest.raises(EngramError) as again:
        await world.ask(note)
    assert again.value.code is ErrorCode.MEMORY_NOT_FOUND, "a forgotten note cannot be asked about again"


async def test_a_long_note_is_previewed_not_quoted_whole(world: World) -> None:
    text = "word " * 100
    note = await world.save(text)
    (asked,) = (await world.ask(note)).pending
    assert len(asked.preview) == PREVIEW_CHARS and asked.preview.endswith("…")
    assert text.startswith(asked.preview[:-1])


async def test_with_confirmation_off_one_call_forgets() -> None:
    # given a deployment with ENGRAM_FORGET_CONFIRMATION=off
    world = make_world(confirmation=False)
    note = await world.save("Allergic to peanuts")
    # when
    reply = await world.ask(note)
    # then
    assert reply.status == "forgotten" and reply.forgotten == [note]
    assert (await world.history.get_note("alice", note)).status is NoteStatus.FORGOTTEN  # type: ignore[union-attr]
    await asyncio.wait_for(world.scrub.scrubbed.wait(), 2)


async def test_confirmed_forgets_in_one_call_even_with_confirmation_on(world: World) -> None:
    note = await world.save("Allergic to peanuts")
    reply = await world.ask(note, confirmed=True)
    assert reply.status == "forgotten" and reply.forgotten == [note]


async def test_an_unknown_id_is_not_found_and_suggests_the_closest_ids(world: World) -> None:
    # given
    note = await world.save("Lives in San Francisco")
    other = await world.save("Has a dog named Max")
    typo = note[:7] + ("x" if note[7] != "x" else "y")
    # when
    with pytest.raises(EngramError) as refused:
        await world.ask(typo)
    # then
    assert refused.value.code is ErrorCode.MEMORY_NOT_FOUND
    message = refused.value.message
    assert message.startswith(f"Memory with ID {typo} not found")
    assert f"{note}: 'Lives in San Francisco'" in message and other not in message
    assert await world.log_length() == 2, "nothing was written"


async def test_an_id_like_no_other_suggests_the_most_recent_notes(world: World) -> None:
    saved = []
    for i, text in enumerate(["first", "second", "third", "fourth"]):
        world.clock.now = NOW + timedelta(minutes=i)
        saved.append(await world.save(text))
    with pytest.raises(EngramError) as refused:
        await world.ask("--------")
    message = refused.value.message
    assert refused.value.code is ErrorCode.MEMORY_NOT_FOUND
    suggested = [i for i in saved if i in message]
    assert suggested == saved[1:], "the three most recent"
    assert message.index(saved[3]) < message.index(saved[2]) < message.index(saved[1]), "newest first"


async def test_another_users_note_is_not_found(world: World) -> None:
    note = await world.save("Bob's secret", user="bob")
    with pytest.raises(EngramError) as refused:
        await world.ask(note, user="alice")
    assert refused.value.code is ErrorCode.MEMORY_NOT_FOUND
    assert (await world.history.get_note("bob", note)).status is NoteStatus.ACTIVE  # type: ignore[union-attr]


async def test_a_retry_with_the_same_command_id_replays_the_first_outcome(world: World) -> None:
    # given
    note = await world.save("Lives in San Francisco")
    first = await world.ask(note, command_id="forget-1")
    written = await world.log_length()
    # when
    again = await world.ask(note, command_id="forget-1")
    # then: the same answer, nothing new decided
    assert again.replayed and not first.replayed
    assert (again.status, again.token, again.pending) == (first.status, first.token, first.pending)
    assert await world.log_length() == written
    assert (await world.store.load("alice", [note]))[note].state.forget_requests == 1
    # and a confirmation retried is still the confirmation
    done = await world.ask(note, command_id="forget-2")
    replayed = await world.ask(note, command_id="forget-2")
    assert replayed.replayed and (replayed.status, replayed.forgotten, replayed.token) == (
        "forgotten",
        [note],
        done.token,
    )


async def test_asking_about_another_note_lapses_the_pending_one(world: World) -> None:
    # given
    a = await world.save("Lives in San Francisco")
    b = await world.save("Visited San Francisco last year")
    await world.ask(a)
    # when
    other = await world.ask(b)
    # then
    assert other.status == "confirmation_required" and [p.note_id for p in other.pending] == [b]
    assert f"The earlier request for {a} is withdrawn." in other.message
    assert await world.pending.of("alice") == [b]
    # and naming the first one again asks again instead of forgetting it
    back = await world.ask(a)
    assert back.status == "confirmation_required" and back.pending[0].request_count == 1
    assert (await world.history.get_note("alice", a)).status is NoteStatus.ACTIVE  # type: ignore[union-attr]


async def test_forgetting_one_note_leaves_a_pending_erasure_of_the_user_or_a_session_pending(world: World) -> None:
    # given: an erasure of the user and of a session, each awaiting its confirmation
    note = await world.save("Lives in San Francisco")
    await world.record("s1", "hello")
    await world.forget.request_user(RequestForgetUser(command_id="erase-1", user_id="alice"))
    await world.forget.request_session(RequestForgetSession(command_id="s-1", user_id="alice", session_id="s1"))
    # when: the user asks to forget one note
    asked = await world.ask(note)
    # then: only that note is asked about; neither erasure is withdrawn
    assert [p.note_id for p in asked.pending] == [note]
    assert "withdrawn" not in asked.message
    assert set(await world.pending.of("alice")) == {note, ACCOUNT, session_stream("s1")}
    # and the erasure's second call still erases
    erased = await world.forget.request_user(RequestForgetUser(command_id="erase-2", user_id="alice"))
    assert erased.status == "forgotten"


async def test_a_confirmation_after_the_deadline_asks_again(world: World) -> None:
    note = await world.save("Lives in San Francisco")
    await world.ask(note)
    world.clock.now = NOW + TTL + timedelta(seconds=1)
    late = await world.ask(note)
    assert late.status == "confirmation_required" and late.pending[0].request_count == 1
    assert late.pending[0].expires_at == world.clock.now + TTL


async def test_erasing_a_user_takes_two_calls_and_gives_a_receipt(world: World) -> None:
    # given
    notes = [await world.save("Lives in San Francisco"), await world.save("Has a dog named Max")]
    said = await world.record("s1", "hello", "how are you?")
    bobs = await world.save("Bob's own note", user="bob")
    await world.access.touch("alice", notes, NOW)
    command = RequestForgetUser(command_id="erase-1", user_id="alice")
    # when
    asked = await world.forget.request_user(command)
    # then: nothing is erased yet
    assert asked.status == "confirmation_required" and asked.forgotten == []
    (pending,) = asked.pending
    assert (pending.note_id, pending.request_count, pending.expires_at) == (ACCOUNT, 1, NOW + TTL)
    assert "ALL 4 memories" in pending.preview and "Please confirm" in asked.message
    assert len(await world.history.list_notes("alice", None, True)) == 2
    assert world.scrub.calls == []
    # when
    erased = await world.forget.request_user(RequestForgetUser(command_id="erase-2", user_id="alice"))
    # then: the receipt names every note and message, and none of them can be read
    assert erased.status == "forgotten" and erased.erased_at == NOW
    assert erased.forgotten == sorted(notes + said)
    assert "Erased ALL 4 memories" in erased.message
    assert await world.history.list_notes("alice", None, True) == []
    assert [await world.history.get_note("alice", n) for n in notes] == [None, None]
    assert [await world.history.get_message("alice", m) for m in said] == [None, None]
    assert world.access.counts == {}, "the read counts go with the user"
    assert world.scrub.calls[0] == "owe"
    # and another user is untouched
    assert (await world.history.get_note("bob", bobs)).status is NoteStatus.ACTIVE  # type: ignore[union-attr]
    # and a retry gets the same receipt
    again = await world.forget.request_user(RequestForgetUser(command_id="erase-2", user_id="alice"))
    assert again.replayed and (again.forgotten, again.erased_at, again.token) == (
        erased.forgotten,
        erased.erased_at,
        erased.token,
    )


async def test_erasing_a_session_takes_two_calls_and_leaves_other_sessions(world: World) -> None:
    # given
    first = await world.record("s1", "I moved to Austin", "nice!")
    second = await world.record("s2", "My dog is called Max")
    note = await world.save("Lives in Austin")
    # when
    asked = await world.forget.request_session(RequestForgetSession(command_id="s-1", user_id="alice", session_id="s1"))
    # then
    assert asked.status == "confirmation_required" and asked.pending[0].note_id == session_stream("s1")
    assert "all 2 messages of conversation s1" in asked.pending[0].preview
    assert await world.history.get_message("alice", first[0]) is not None
    # when
    erased = await world.forget.request_session(
        RequestForgetSession(command_id="s-2", user_id="alice", session_id="s1")
    )
    # then
    assert erased.status == "forgotten" and erased.forgotten == sorted(first) and erased.erased_at == NOW
    assert [await world.history.get_message("alice", m) for m in first] == [None, None]
    assert (await world.history.get_message("alice", second[0])).content == "My dog is called Max"  # type: ignore[union-attr]
    assert (await world.history.get_note("alice", note)).status is NoteStatus.ACTIVE  # type: ignore[union-attr]
    assert "owe" in world.scrub.calls


async def test_erasing_an_unknown_session_is_not_found(world: World) -> None:
    await world.record("s1", "hello")
    with pytest.raises(EngramError) as refused:
        await world.forget.request_session(RequestForgetSession(command_id="s", user_id="alice", session_id="nope"))
    assert refused.value.code is ErrorCode.MEMORY_NOT_FOUND


async def test_forgetting_owes_a_scrub_and_scrubs_once_the_history_has_the_tombstone() -> None:
    # given a history that lags behind the log
    world = make_world()
    world.history.following = False
    note = await world.save("Lives in San Francisco")
    await world.access.touch("alice", [note], NOW)
    # when: only asked, nothing is owed
    await world.ask(note)
    assert world.scrub.calls == []
    # when: forgotten
    reply = await world.ask(note)
    # then: the debt is recorded before the reply, the scrub itself waits for the read model
    assert reply.status == "forgotten" and world.scrub.calls == ["owe"]
    assert (world.access.counts, world.access.times) == ({}, {})
    await asyncio.sleep(0.05)  # time for a scrub that must not come
    assert world.scrub.calls == ["owe"], "no scrub while the read model still holds the plaintext"
    await world.history.catch_up()
    await asyncio.wait_for(world.scrub.scrubbed.wait(), 2)
    assert world.scrub.calls == ["owe", "wait", "scrub"]


async def test_a_query_and_ids_together_or_neither_are_refused(world: World) -> None:
    note = await world.save("Lives in San Francisco")
    with pytest.raises(EngramError) as both:
        await world.forget.request(RequestForget(command_id="q", user_id="alice", query="x", note_ids=[note]))
    with pytest.raises(EngramError) as neither:
        await world.forget.request(RequestForget(command_id="n", user_id="alice"))
    assert both.value.code is neither.value.code is ErrorCode.INVALID_PARAMETER
    with pytest.raises(EngramError) as no_search:
        await world.forget.request(RequestForget(command_id="s", user_id="alice", query="San Francisco"))
    assert no_search.value.code is ErrorCode.UNAVAILABLE, "without an index, forget by id"


async def test_counts_in_the_replies_agree_in_number(world: World) -> None:
    await world.save("Lives in San Francisco")
    await world.record("s1", "hello")
    asked_user = await world.forget.request_user(RequestForgetUser(command_id="erase-1", user_id="alice"))
    assert "ALL 2 memories (notes" in asked_user.pending[0].preview
    asked_session = await world.forget.request_session(
        RequestForgetSession(command_id="s-1", user_id="alice", session_id="s1")
    )
    assert "all 1 message of conversation s1" in asked_session.pending[0].preview
    await world.save("Bob's only note", user="bob")
    asked_bob = await world.forget.request_user(RequestForgetUser(command_id="erase-b", user_id="bob"))
    assert "ALL 1 memory (notes" in asked_bob.pending[0].preview


def test_forget_candidates_are_close_matches_or_keyword_only_hits() -> None:
    from engram_ledger.services.application.forget import close_enough

    # the best, one close to it, one far below it, one under the floor, one the keywords alone found
    assert close_enough([0.62, 0.50, 0.30, 0.15, 0.0]) == [True, True, False, False, True]
    assert close_enough([0.12, 0.05]) == [False, False], "nothing matched"
    assert close_enough([]) == []


async def test_a_forget_retried_with_a_newer_token_replays(world: World) -> None:
    note = await world.save("Lives in San Francisco")
    first = await world.ask(note, command_id="f-1", after="0:1-0")
    again = await world.ask(note, command_id="f-1", after="0:9-0")
    assert again.replayed and [p.note_id for p in again.pending] == [p.note_id for p in first.pending]
