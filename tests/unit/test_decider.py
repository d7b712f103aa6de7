"""Given events / when command / then events (or a refusal), for every command."""

from __future__ import annotations

import msgspec
import pytest

from engram_ledger.contracts.commands import NoteDraft, SaveNote, SaveNotes, SupersedeNote, UpdateNote
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import AnyEvent, NoteSaved, NoteSuperseded, NoteUpdated
from engram_ledger.contracts.model import NoteKind, NoteStatus
from engram_ledger.services.domain.appends import StreamAppend
from engram_ledger.services.domain.decider import IdCollision, decide, note_ids_for
from engram_ledger.services.domain.ids import new_note_id
from engram_ledger.services.domain.note import ABSENT, NoteState, fold
from tests.builders import NOW, USER, saved


def when(command, given: dict[str, list[AnyEvent]] | None = None, attempt: int = 0) -> list[StreamAppend]:  # type: ignore[no-untyped-def]
    given = given or {}
    ids = note_ids_for(command, attempt)
    states = {i: fold(given.get(i, [])) for i in ids}
    return decide(command, states, ids, NOW)


def refused(command, given: dict[str, list[AnyEvent]] | None = None) -> EngramError:  # type: ignore[no-untyped-def]
    with pytest.raises(EngramError) as info:
        when(command, given)
    return info.value


# SaveNote ---------------------------------------------------------------------------------------


def test_save_note_emits_note_saved_at_version_one() -> None:
    (append,) = when(
        SaveNote(command_id="c1", user_id=USER, content="Alec is my boss", category="person", subject="Alec")
    )
    assert append.expected_version == 0
    (event,) = append.events
    assert isinstance(event, NoteSaved)
    assert (event.version, event.content, event.category, event.subject, event.at) == (
        1,
        "Alec is my boss",
        "person",
        "Alec",
        NOW,
    )
    assert event.note_id == append.note_id and len(event.note_id) == 8 and event.note_id.isalnum()
    assert event.command_id == "c1" and event.user_id == USER and event.event_id


def test_same_command_decides_the_same_note_id() -> None:
    command = SaveNote(command_id="c1", user_id=USER, content="x")
    assert when(command)[0].note_id == when(command)[0].note_id
    other_user = SaveNote(command_id="c1", user_id="bob", content="x")
    assert when(other_user)[0].note_id != when(command)[0].note_id


def test_save_onto_a_taken_id_asks_for_another_attempt() -> None:
    command = SaveNote(command_id="c1", user_id=USER, content="x")
    taken = new_note_id(USER, "c1", 0, 0)
    with pytest.raises(IdCollision):
        when(command, {taken: [saved(taken)]})
    assert when(command, {taken: [saved(taken)]}, attempt=1)[0].note_id != taken


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"content": "a\x00b"}, "content contains a control character (U+0000) at position 1"),
        ({"content": " \n\t"}, "content must not be blank"),
        ({"content": "x", "subject": "  "}, "subject must not be blank"),
        ({"content": "bad \ud800 surrogate"}, "unpaired surrogate"),
        ({"content": "x", "kind": NoteKind.PROCEDURE, "trigger": "on Friday"}, "trigger' and 'action"),
        ({"content": "x", "narrative": "long story"}, "belong to episodes"),
        ({"content": "x", "trigger": "t", "action": "a"}, "belong to procedures"),
        ({"content": "x", "expected_version": 3}, "only be 0"),
    ],
)
def test_save_note_refusals(fields: dict[str, object], message: str) -> None:
    error = refused(SaveNote(command_id="c1", user_id=USER, **fields))  # type: ignore[arg-type]
    assert error.code is ErrorCode.INVALID_PARAMETER
    assert message in error.message


def test_save_episode_and_procedure() -> None:
    (episode,) = when(
        SaveNote(
            command_id="e",
            user_id=USER,
            content="Trip",
            kind=NoteKind.EPISODE,
            summary="s",
            narrative="n",
            occurred_at=NOW,
        )
    )[0].events
    assert isinstance(episode, NoteSaved) and episode.narrative == "n" and episode.occurred_at == NOW
    (procedure,) = when(
        SaveNote(
            command_id="p",
            user_id=USER,
            content="Fridays",
            kind=NoteKind.PROCEDURE,
            trigger="a task is created",
            action="set the due date to Friday",
        )
    )[0].events
    assert isinstance(procedure, NoteSaved) and procedure.trigger == "a task is created"


# SaveNotes --------------------------------------------------------------------------------------


def test_save_notes_emits_one_note_per_draft_with_distinct_ids() -> None:
    command = SaveNotes(
        command_id="b1",
        user_id=USER,
        notes=[NoteDraft(content="Likes black coffee"), NoteDraft(content="Has a dog named Max")],
    )
    appends = when(command)
    assert [a.events[0].content for a in appends] == ["Likes black coffee", "Has a dog named Max"]  # type: ignore[union-attr]
    assert len({a.note_id for a in appends}) == 2
    assert all(a.expected_version == 0 for a in appends)


def test_save_notes_refuses_the_whole_batch_if_one_draft_is_bad() -> None:
    command = SaveNotes(command_id="b1", user_id=USER, notes=[NoteDraft(content="fine"), NoteDraft(content="bad\x07")])
    assert refused(command).code is ErrorCode.INVALID_PARAMETER


# UpdateNote -------------------------------------------------------------------------------------


def test_update_emits_only_the_changed_fields_at_the_next_version() -> None:
    (append,) = when(
        UpdateNote(command_id="u1", user_id=USER, note_id="AAAAAAAA", content="Alec was my boss", subject="Alec"),
        {"AAAAAAAA": [saved()]},
    )
    assert append.expected_version == 1
    (event,) = append.events
    assert isinstance(event, NoteUpdated)
    assert (event.version, event.content, event.subject, event.category) == (2, "Alec was my boss", None, None)


def test_update_with_the_current_values_appends_nothing() -> None:
    (append,) = when(
        UpdateNote(command_id="u1", user_id=USER, note_id="AAAAAAAA", content="Alec is my boss"),
        {"AAAAAAAA": [saved()]},
    )
    assert append.events == [] and append.expected_version == 1


def test_update_refusals() -> None:
    given = {"AAAAAAAA": [saved()]}
    missing = refused(UpdateNote(command_id="u", user_id=USER, note_id="BBBBBBBB", content="x"), given)
    assert missing.code is ErrorCode.MEMORY_NOT_FOUND and "Memory with ID BBBBBBBB not found" in missing.message
    empty = refused(UpdateNote(command_id="u", user_id=USER, note_id="AAAAAAAA"), given)
    assert empty.code is ErrorCode.INVALID_PARAMETER and "needs at least one of" in empty.message
    stale = refused(
        UpdateNote(command_id="u", user_id=USER, note_id="AAAAAAAA", content="x", expected_version=0), given
    )
    assert stale.code is ErrorCode.VERSION_CONFLICT and "version 1" in stale.message
    superseded = given | {
        "AAAAAAAA": [
            saved(),
            NoteSuperseded(
                event_id="e",
                note_id="AAAAAAAA",
                user_id=USER,
                version=2,
                command_id="s",
                at=NOW,
                superseded_by="CCCCCCCC",
            ),
        ]
    }
    error = refused(UpdateNote(command_id="u", user_id=USER, note_id="AAAAAAAA", content="x"), superseded)
    assert error.code is ErrorCode.INVALID_PARAMETER and "CCCCCCCC" in error.message


def test_update_with_the_right_expected_version_is_accepted() -> None:
    (append,) = when(
        UpdateNote(command_id="u", user_id=USER, note_id="AAAAAAAA", content="new", expected_version=1),
        {"AAAAAAAA": [saved()]},
    )
    assert append.events[0].version == 2


# SupersedeNote ----------------------------------------------------------------------------------


def test_supersede_marks_the_old_note_and_checks_the_new_one() -> None:
    given = {"AAAAAAAA": [saved()], "BBBBBBBB": [saved("BBBBBBBB", "Alec left TechCorp")]}
    old, new = when(SupersedeNote(command_id="s", user_id=USER, note_id="AAAAAAAA", superseded_by="BBBBBBBB"), given)
    assert isinstance(old.events[0], NoteSuperseded) and old.events[0].superseded_by == "BBBBBBBB"
    assert old.events[0].version == 2 and old.expected_version == 1
    assert new.note_id == "BBBBBBBB" and new.events == [] and new.expected_version == 1


def superseded(note_id: str, by: str) -> NoteSuperseded:
    return NoteSuperseded(
        event_id="e", note_id=note_id, user_id=USER, version=2, command_id="s", at=NOW, superseded_by=by
    )


SUPERSEDE_GIVEN = {"AAAAAAAA": [saved()], "BBBBBBBB": [saved("BBBBBBBB")], "CCCCCCCC": [saved("CCCCCCCC")]}


@pytest.mark.parametrize(
    ("fields", "given", "code", "message"),
    [
        (
            {"note_id": "AAAAAAAA", "superseded_by": "AAAAAAAA"},
            {},
            ErrorCode.INVALID_PARAMETER,
            "a memory cannot supersede itself",
        ),
        (
            {"note_id": "AAAAAAAA", "superseded_by": "ZZZZZZZZ"},
            {},
            ErrorCode.MEMORY_NOT_FOUND,
            "Memory with ID ZZZZZZZZ not found",
        ),
        (
            {"note_id": "YYYYYYYY", "superseded_by": "BBBBBBBB"},
            {},
            ErrorCode.MEMORY_NOT_FOUND,
            "Memory with ID YYYYYYYY not found",
        ),
        (
            {"note_id": "AAAAAAAA", "superseded_by": "BBBBBBBB", "expected_version": 5},
            {},
            ErrorCode.VERSION_CONFLICT,
            "Memory AAAAAAAA is at version 1, not the expected 5",
        ),
        (
            {"note_id": "AAAAAAAA", "superseded_by": "BBBBBBBB"},
            {"AAAAAAAA": [saved(), superseded("AAAAAAAA", "BBBBBBBB")]},
            ErrorCode.INVALID_PARAMETER,
            "Memory AAAAAAAA is superseded by BBBBBBBB",
        ),
        (
            {"note_id": "AAAAAAAA", "superseded_by": "BBBBBBBB"},
            {"BBBBBBBB": [saved("BBBBBBBB"), superseded("BBBBBBBB", "CCCCCCCC")]},
            ErrorCode.INVALID_PARAMETER,
            "Memory BBBBBBBB is superseded by CCCCCCCC",
        ),
    ],
    ids=["itself", "unknown replacement", "unknown old note", "stale version", "twice", "superseded replacement"],
)
def test_supersede_refusals(
    fields: dict[str, object], given: dict[str, list[AnyEvent]], code: ErrorCode, message: str
) -> None:
    """Each refusal by its code and by what only it says: the id it names, the versions, the reason."""
    error = refused(SupersedeNote(command_id="s", user_id=USER, **fields), SUPERSEDE_GIVEN | given)  # type: ignore[arg-type]
    assert error.code is code
    assert message in error.message


# The fold ---------------------------------------------------------------------------------------


def test_state_is_a_fold_over_events() -> None:
    state = fold(
        [
            saved(),
            NoteUpdated(
                event_id="e2",
                note_id="AAAAAAAA",
                user_id=USER,
                version=2,
                command_id="u",
                at=NOW,
                content="v2",
                importance=0.9,
            ),
            NoteSuperseded(
                event_id="e3",
                note_id="AAAAAAAA",
                user_id=USER,
                version=3,
                command_id="s",
                at=NOW,
                superseded_by="BBBBBBBB",
            ),
        ]
    )
    # Each version as it was, in order (what a revert gives back).
    assert [(v.version, v.content, v.status) for v in state.past] == [
        (1, "Alec is my boss", NoteStatus.ACTIVE),
        (2, "v2", NoteStatus.ACTIVE),
        (3, "v2", NoteStatus.SUPERSEDED),
    ]
    assert msgspec.structs.replace(state, past=()) == NoteState(
        version=3,
        status=NoteStatus.SUPERSEDED,
        content="v2",
        category="person",
        subject="Alec",
        confidence=1.0,
        importance=0.9,
        superseded_by="BBBBBBBB",
        saved_at=NOW,
    )
    assert fold([]) == ABSENT and not ABSENT.exists
