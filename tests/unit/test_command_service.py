"""The command handler's application service over the in-memory event store: replays, retries
after a lost race, id collisions, no-op updates."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from engram_ledger.contracts.commands import NoteDraft, PutNote, SaveNote, SaveNotes, SupersedeNote, UpdateNote
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.application.commands import CommandService, command_handlers
from engram_ledger.services.domain.decider import decide
from engram_ledger.services.domain.ids import new_note_id
from engram_ledger.services.domain.note import ABSENT
from tests.fakes import InMemoryEventStore

NOW = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.fixture
def store() -> InMemoryEventStore:
    return InMemoryEventStore()


@pytest.fixture
def service(store: InMemoryEventStore) -> CommandService:
    return CommandService(command_handlers(store, clock=lambda: NOW))


async def test_a_replayed_command_gets_its_first_outcome(service: CommandService) -> None:
    command = SaveNote(command_id="c1", user_id="u", content="hello")
    first = await service.execute(command)
    again = await service.execute(command)
    assert (again.note_id, again.version, again.token, again.replayed) == (first.note_id, 1, first.token, True)  # type: ignore[union-attr]


async def test_a_different_request_under_a_used_command_id_is_refused(
    service: CommandService, store: InMemoryEventStore
) -> None:
    await service.execute(SaveNote(command_id="c1", user_id="u", content="hello"))
    with pytest.raises(EngramError) as info:
        await service.execute(SaveNote(command_id="c1", user_id="u", content="hello", importance=0.9))
    assert info.value.code is ErrorCode.IDEMPOTENCY_CONFLICT
    assert (await store.log_head(0))[1] == 1


async def test_an_outcome_stored_before_requests_were_digested_still_answers_a_retry(
    service: CommandService, store: InMemoryEventStore
) -> None:
    command = SaveNote(command_id="c1", user_id="u", content="hello")
    first = await service.execute(command)
    outcome = await store.outcome("u", "c1")
    assert outcome is not None and outcome.detail.request, "the digest is kept with the outcome"
    # as an earlier release stored it: no digest
    store._outcomes[("u", "c1")] = msgspec.structs.replace(
        outcome, detail=msgspec.structs.replace(outcome.detail, request="")
    )
    again = await service.execute(command)
    assert again.replayed and again.note_id == first.note_id  # type: ignore[union-attr]


async def test_losing_a_race_decides_again_on_the_new_state(service: CommandService, store: InMemoryEventStore) -> None:
    saved = await service.execute(SaveNote(command_id="c1", user_id="u", content="v1"))
    real_load = store.load
    raced = False

    async def load_then_someone_writes(user_id, note_ids):  # type: ignore[no-untyped-def]
        nonlocal raced
        loaded = await real_load(user_id, note_ids)
        if not raced:
            raced = True
            await service.execute(UpdateNote(command_id="other", user_id="u", note_id=saved.note_id, content="theirs"))  # type: ignore[union-attr]
        return loaded

    store.load = load_then_someone_writes  # type: ignore[method-assign]
    mine = await service.execute(UpdateNote(command_id="mine", user_id="u", note_id=saved.note_id, content="mine"))  # type: ignore[union-attr]
    assert mine.version == 3  # decided again after the conflict, on top of "theirs"


async def test_losing_a_race_with_an_explicit_expected_version_is_a_conflict(
    service: CommandService, store: InMemoryEventStore
) -> None:
    saved = await service.execute(SaveNote(command_id="c1", user_id="u", content="v1"))
    await service.execute(UpdateNote(command_id="other", user_id="u", note_id=saved.note_id, content="theirs"))  # type: ignore[union-attr]
    with pytest.raises(EngramError) as info:
        await service.execute(
            UpdateNote(command_id="mine", user_id="u", note_id=saved.note_id, content="mine", expected_version=1)
        )  # type: ignore[union-attr]
    assert info.value.code is ErrorCode.VERSION_CONFLICT


async def test_a_derived_id_taken_by_another_note_moves_to_the_next_attempt(
    service: CommandService, store: InMemoryEventStore
) -> None:
    # Plant a note at the id the next command would derive first.
    taken = new_note_id("u", "c2", 0, 0)
    planted = SaveNote(command_id="plant", user_id="u", content="planted")
    appends = decide(planted, {taken: (await store.load("u", [taken]))[taken].state}, [taken], NOW)
    await store.append("u", "plant", appends)
    reply = await service.execute(SaveNote(command_id="c2", user_id="u", content="mine"))
    assert reply.note_id == new_note_id("u", "c2", 0, 1)  # type: ignore[union-attr]


async def test_a_save_appends_without_reading_first_and_still_steps_over_a_taken_id(
    service: CommandService, store: InMemoryEventStore
) -> None:
    real_load, loads = store.load, []

    async def counted(user_id, note_ids):  # type: ignore[no-untyped-def]
        loads.append(list(note_ids))
        return await real_load(user_id, note_ids)

    store.load = counted  # type: ignore[method-assign]
    first = await service.execute(SaveNote(command_id="c1", user_id="u", content="one"))
    await service.execute(SaveNotes(command_id="c2", user_id="u", notes=[NoteDraft(content="two")]))
    assert loads == [], "a new note's id names nothing yet: nothing to read"
    # The next command's first derived id is already a note: the append refuses the presumption,
    # the second attempt reads the note, and the save moves on to the next derived id.
    taken = new_note_id("u", "c3", 0, 0)
    planted = decide(SaveNote(command_id="plant", user_id="u", content="planted"), {taken: ABSENT}, [taken], NOW)
    await store.append("u", "plant", planted)
    reply = await service.execute(SaveNote(command_id="c3", user_id="u", content="three"))
    assert reply.note_id == new_note_id("u", "c3", 0, 1) and reply.version == 1  # type: ignore[union-attr]
    assert loads == [[taken], [reply.note_id]]  # type: ignore[union-attr]
    again = await service.execute(SaveNote(command_id="c1", user_id="u", content="one"))
    assert again.replayed and again.note_id == first.note_id, "a retry still gets its first outcome"  # type: ignore[union-attr]


async def test_an_update_that_changes_nothing_appends_nothing(
    service: CommandService, store: InMemoryEventStore
) -> None:
    saved = await service.execute(SaveNote(command_id="c1", user_id="u", content="same"))
    reply = await service.execute(UpdateNote(command_id="c2", user_id="u", note_id=saved.note_id, content="same"))  # type: ignore[union-attr]
    assert (reply.version, reply.token) == (1, saved.token)  # type: ignore[union-attr]
    assert (await store.log_head(0))[1] == 1


async def test_handle_maps_refusals_to_error_replies(service: CommandService) -> None:
    body = b'{"type": "update_note", "command_id": "c", "user_id": "u", "note_id": "AAAAAAAA", "content": "x"}'
    reply = msgspec.json.decode(await service.handle(body))
    assert reply == {
        "type": "error",
        "schema_version": 1,
        "code": "MEMORY_NOT_FOUND",
        "message": "Memory with ID AAAAAAAA not found",
        "retry_after_ms": None,
    }


async def test_an_exact_duplicate_of_an_active_note_makes_no_new_note(
    service: CommandService, store: InMemoryEventStore
) -> None:
    first = await service.execute(SaveNote(command_id="c1", user_id="u", content="Likes black coffee"))
    again = await service.execute(SaveNote(command_id="c2", user_id="u", content="  likes   BLACK coffee "))
    assert again.note_id == first.note_id and again.duplicate and not first.duplicate  # type: ignore[union-attr]
    assert (await store.log_head(0))[1] == 1
    other_user = await service.execute(SaveNote(command_id="c3", user_id="v", content="Likes black coffee"))
    assert not other_user.duplicate  # type: ignore[union-attr]


async def test_a_batch_maps_every_draft_to_a_note_and_replays_the_same(
    service: CommandService, store: InMemoryEventStore
) -> None:
    from engram_ledger.contracts.commands import NoteDraft, SaveNotes

    existing = await service.execute(SaveNote(command_id="c0", user_id="u", content="Has a dog named Max"))
    batch = SaveNotes(
        command_id="b1",
        user_id="u",
        notes=[
            NoteDraft(content="Likes black coffee"),
            NoteDraft(content="has a dog named max"),  # an existing note
            NoteDraft(content="Allergic to peanuts"),
            NoteDraft(content="LIKES BLACK COFFEE"),  # the first draft again
        ],
    )
    reply = await service.execute(batch)
    assert [n.duplicate for n in reply.notes] == [False, True, False, True]  # type: ignore[union-attr]
    assert reply.notes[1].note_id == existing.note_id  # type: ignore[union-attr]
    assert reply.notes[3].note_id == reply.notes[0].note_id  # type: ignore[union-attr]
    assert (await store.log_head(0))[1] == 3
    assert (await service.execute(batch)).notes == reply.notes  # type: ignore[union-attr]
    only_duplicates = await service.execute(
        SaveNotes(command_id="b2", user_id="u", notes=[NoteDraft(content="Allergic to peanuts")])
    )
    assert only_duplicates.notes[0].duplicate and (await store.log_head(0))[1] == 3  # type: ignore[union-attr]


async def test_content_is_released_by_an_update_or_a_supersede(service: CommandService) -> None:
    from engram_ledger.contracts.commands import SupersedeNote

    a = await service.execute(SaveNote(command_id="a", user_id="u", content="Lives in Seattle"))
    b = await service.execute(SaveNote(command_id="b", user_id="u", content="Lives in Austin"))
    with pytest.raises(EngramError) as info:
        await service.execute(UpdateNote(command_id="u1", user_id="u", note_id=a.note_id, content="lives in austin"))  # type: ignore[union-attr]
    assert info.value.code is ErrorCode.INVALID_PARAMETER and b.note_id in info.value.message  # type: ignore[union-attr]
    await service.execute(SupersedeNote(command_id="s", user_id="u", note_id=a.note_id, superseded_by=b.note_id))  # type: ignore[union-attr]
    again = await service.execute(SaveNote(command_id="c", user_id="u", content="Lives in Seattle"))
    assert not again.duplicate and again.note_id != a.note_id  # type: ignore[union-attr]
    await service.execute(UpdateNote(command_id="u2", user_id="u", note_id=b.note_id, content="Lives in Denver"))  # type: ignore[union-attr]
    assert not (await service.execute(SaveNote(command_id="d", user_id="u", content="Lives in Austin"))).duplicate  # type: ignore[union-attr]


async def test_a_retry_spelling_out_a_default_or_carrying_a_newer_token_is_the_same_request(
    service: CommandService,
) -> None:
    first = await service.execute(SaveNote(command_id="c1", user_id="u", content="hello"))
    again = await service.execute(SaveNote(command_id="c1", user_id="u", content="hello", importance=0.5))
    assert again.replayed and again.note_id == first.note_id  # type: ignore[union-attr]


async def test_a_put_that_finds_its_key_just_given_back_makes_a_new_note(
    service: CommandService, store: InMemoryEventStore
) -> None:
    held = await service.execute(PutNote(command_id="p1", user_id="u", category="c", key="k", value={"v": 1}))
    other = await service.execute(SaveNote(command_id="s1", user_id="u", content="another"))
    # Between the put's read of the key's holder and its read of that note, the note is
    # superseded (its append gives the key back): the put reads the holder again.
    real_holder = store.content_holder
    stale = True

    async def holder_read_just_before_the_supersede(user_id, digest):  # type: ignore[no-untyped-def]
        nonlocal stale
        if stale:
            stale = False
            await service.execute(
                SupersedeNote(command_id="x", user_id="u", note_id=held.note_id, superseded_by=other.note_id)  # type: ignore[union-attr]
            )
            return held.note_id  # type: ignore[union-attr]
        return await real_holder(user_id, digest)

    store.content_holder = holder_read_just_before_the_supersede  # type: ignore[method-assign]
    again = await service.execute(PutNote(command_id="p2", user_id="u", category="c", key="k", value={"v": 2}))
    assert again.note_id != held.note_id and again.version == 1  # type: ignore[union-attr]


async def test_a_first_attempt_looks_up_no_outcome_and_a_retry_still_gets_its_first_reply(
    service: CommandService, store: InMemoryEventStore
) -> None:
    # The append refuses a used command id by itself: no lookup before deciding.
    lookups = 0
    real_outcome = store.outcome

    async def counting(user_id: str, command_id: str):  # type: ignore[no-untyped-def]
        nonlocal lookups
        lookups += 1
        return await real_outcome(user_id, command_id)

    store.outcome = counting  # type: ignore[method-assign]
    saved = await service.execute(SaveNote(command_id="c1", user_id="u", content="v1"))
    update = UpdateNote(command_id="c2", user_id="u", note_id=saved.note_id, content="v2")  # type: ignore[union-attr]
    first = await service.execute(update)
    assert lookups == 0 and first.version == 2
    # A retry finds its own values there (nothing to write): the first reply, not the note as it is.
    again = await service.execute(update)
    assert (again.version, again.token, again.replayed) == (2, first.token, True)  # type: ignore[union-attr]
    # A retry after the note moved on decides to write, and the append answers with the first outcome.
    await service.execute(UpdateNote(command_id="c3", user_id="u", note_id=saved.note_id, content="v3"))  # type: ignore[union-attr]
    length = (await store.log_head(0))[1]
    late = await service.execute(update)
    assert (late.version, late.token, late.replayed) == (2, first.token, True)  # type: ignore[union-attr]
    assert (await store.log_head(0))[1] == length, "a retry writes nothing"
    with pytest.raises(EngramError) as info:
        await service.execute(msgspec.structs.replace(update, content="v4"))
    assert info.value.code is ErrorCode.IDEMPOTENCY_CONFLICT
