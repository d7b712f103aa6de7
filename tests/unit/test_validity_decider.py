"""World time: when what a note says held in the world (``valid_from``/``valid_until``), apart
from when it was recorded. Given events / when a command / then events."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engram_ledger.contracts.commands import NoteDraft, RevertNote, SaveNote, SupersedeNote, UpdateNote
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import AnyEvent, NoteSaved, NoteSuperseded, NoteUpdated
from engram_ledger.services.domain.decider import decide, note_ids_for
from engram_ledger.services.domain.note import fold
from tests.builders import NOW, USER, saved

Y2020 = datetime(2020, 1, 1, tzinfo=UTC)
Y2022 = datetime(2022, 6, 1, tzinfo=UTC)
Y2023 = datetime(2023, 3, 1, tzinfo=UTC)


def when(command, given: dict[str, list[AnyEvent]]):  # type: ignore[no-untyped-def]
    ids = note_ids_for(command)
    return decide(command, {i: fold(given.get(i, [])) for i in ids}, ids, NOW)


def test_a_save_says_when_its_content_held() -> None:
    command = SaveNote(command_id="c", user_id=USER, content="Tess works at Acme", valid_from=Y2020, valid_until=Y2022)
    (append,) = when(command, {})
    (event,) = append.events
    assert isinstance(event, NoteSaved) and (event.valid_from, event.valid_until) == (Y2020, Y2022)
    state = fold([event])
    assert (state.valid_from, state.valid_until, state.saved_at) == (Y2020, Y2022, NOW)


def test_an_end_before_the_beginning_is_refused_in_words() -> None:
    with pytest.raises(EngramError) as info:
        when(SaveNote(command_id="c", user_id=USER, content="x", valid_from=Y2022, valid_until=Y2020), {})
    assert info.value.code is ErrorCode.INVALID_PARAMETER and "must be after valid_from" in info.value.message
    with pytest.raises(EngramError):
        when(
            UpdateNote(command_id="u", user_id=USER, note_id="AAAAAAAA", valid_until=Y2020),
            {"AAAAAAAA": [saved(valid_from=Y2022)]},
        )


def test_an_update_can_change_only_when_it_held() -> None:
    (append,) = when(
        UpdateNote(command_id="u", user_id=USER, note_id="AAAAAAAA", valid_until=Y2023), {"AAAAAAAA": [saved()]}
    )
    (event,) = append.events
    assert isinstance(event, NoteUpdated) and event.valid_until == Y2023 and event.content is None


def test_a_supersede_ends_the_old_note_where_the_new_one_begins() -> None:
    old = saved("AAAAAAAA", "Tess works at Acme", valid_from=Y2020)
    new = saved("BBBBBBBB", "Tess works at Initech", valid_from=Y2022)
    command = SupersedeNote(command_id="s", user_id=USER, note_id="AAAAAAAA", superseded_by="BBBBBBBB")
    first, _ = when(command, {"AAAAAAAA": [old], "BBBBBBBB": [new]})
    (event,) = first.events
    assert isinstance(event, NoteSuperseded) and event.valid_until == Y2022
    # Without a beginning, the new note begins when it was saved.
    undated = saved("BBBBBBBB", "Tess works at Initech")
    first, _ = when(command, {"AAAAAAAA": [old], "BBBBBBBB": [undated]})
    assert first.events[0].valid_until == NOW
    # Unless told otherwise, or the old note had ended before.
    kept = SupersedeNote(
        command_id="s", user_id=USER, note_id="AAAAAAAA", superseded_by="BBBBBBBB", close_validity=False
    )
    assert when(kept, {"AAAAAAAA": [old], "BBBBBBBB": [new]})[0].events[0].valid_until is None
    ended = saved("AAAAAAAA", "Tess works at Acme", valid_until=Y2020)
    assert when(command, {"AAAAAAAA": [ended], "BBBBBBBB": [new]})[0].events[0].valid_until is None


def test_undoing_a_supersede_gives_back_the_validity_it_closed() -> None:
    old = saved("AAAAAAAA", "Tess works at Acme", valid_from=Y2020)
    closed = NoteSuperseded(
        event_id="s",
        note_id="AAAAAAAA",
        user_id=USER,
        version=2,
        command_id="s",
        at=NOW,
        superseded_by="BBBBBBBB",
        valid_until=Y2022,
    )
    assert fold([old, closed]).valid_until == Y2022
    (append,) = when(
        RevertNote(command_id="r", user_id=USER, note_id="AAAAAAAA", to_version=1), {"AAAAAAAA": [old, closed]}
    )
    assert append.events[0].valid_until is None and append.events[0].valid_from == Y2020


def test_a_batch_save_carries_each_draft_s_validity() -> None:
    from engram_ledger.contracts.commands import SaveNotes

    command = SaveNotes(
        command_id="b", user_id=USER, notes=[NoteDraft(content="a", valid_until=Y2022), NoteDraft(content="b")]
    )
    appends = when(command, {})
    assert [a.events[0].valid_until for a in appends] == [Y2022, None]
