"""RevertNote: given a note's events, when reverted, then a new version with what an earlier
version held (or a typed refusal)."""

from __future__ import annotations

import pytest

from engram_ledger.contracts.commands import RevertNote
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import AnyEvent, NoteForgotten, NoteReverted, NoteSuperseded, NoteUpdated
from engram_ledger.contracts.model import NoteStatus
from engram_ledger.services.domain.appends import content_digest, key_claim
from engram_ledger.services.domain.decider import decide, note_ids_for
from engram_ledger.services.domain.note import fold
from tests.builders import NOW, USER, saved


def updated(version: int, **fields: object) -> NoteUpdated:
    return NoteUpdated(
        event_id=f"u{version}",
        note_id="AAAAAAAA",
        user_id=USER,
        version=version,
        command_id=f"u{version}",
        at=NOW,
        **fields,
    )  # type: ignore[arg-type]


def superseded(version: int, by: str = "BBBBBBBB") -> NoteSuperseded:
    return NoteSuperseded(
        event_id=f"s{version}",
        note_id="AAAAAAAA",
        user_id=USER,
        version=version,
        command_id="s",
        at=NOW,
        superseded_by=by,
    )


def when(given: list[AnyEvent], to_version: int, expected: int | None = None):  # type: ignore[no-untyped-def]
    command = RevertNote(
        command_id="r", user_id=USER, note_id="AAAAAAAA", to_version=to_version, expected_version=expected
    )
    ids = note_ids_for(command)
    return decide(command, {"AAAAAAAA": fold(given)}, ids, NOW)


def refused(given: list[AnyEvent], to_version: int, expected: int | None = None) -> EngramError:
    with pytest.raises(EngramError) as info:
        when(given, to_version, expected)
    return info.value


HISTORY: list[AnyEvent] = [
    saved(content="Alec is my boss", subject="Alec"),
    updated(2, content="Alec is my manager at TechCorp", importance=0.9),
    updated(3, category="work", subject="Alec Smith"),
]


def test_a_revert_appends_a_new_version_with_what_the_old_one_held() -> None:
    (append,) = when(HISTORY, to_version=1)
    (event,) = append.events
    assert isinstance(event, NoteReverted)
    assert (event.version, event.to_version, append.expected_version) == (4, 1, 3)
    assert (event.content, event.category, event.subject, event.importance) == (
        "Alec is my boss",
        "person",
        "Alec",
        0.5,
    )
    assert not event.reactivated
    # The content it holds again is claimed, the one it leaves given back: duplicates still caught.
    assert append.claims == [content_digest("Alec is my boss")]
    assert append.releases == [content_digest("Alec is my manager at TechCorp")]
    state = fold([*HISTORY, event])
    assert (state.version, state.content, state.category, state.status) == (
        4,
        "Alec is my boss",
        "person",
        NoteStatus.ACTIVE,
    )
    # The history keeps every version: a later revert can go back to what version 3 held.
    (again,) = when([*HISTORY, event], to_version=3)
    assert again.events[0].content == "Alec is my manager at TechCorp" and again.events[0].category == "work"


def test_reverting_to_the_current_version_changes_nothing() -> None:
    (append,) = when(HISTORY, to_version=3)
    assert append.events == [] and append.expected_version == 3


def test_reverting_to_what_it_already_holds_changes_nothing() -> None:
    (append,) = when([*HISTORY, updated(4, category="person", subject="Alec")], to_version=3)
    assert append.events != []
    (same,) = when([saved(), updated(2, importance=0.5)], to_version=1)
    assert same.events == [] and same.expected_version == 2


def test_undoing_a_supersede_brings_the_note_back_to_the_active_set() -> None:
    given: list[AnyEvent] = [saved(), superseded(2)]
    (append,) = when(given, to_version=1)
    (event,) = append.events
    assert isinstance(event, NoteReverted) and event.reactivated and event.replaced_by == "BBBBBBBB"
    # Its content was given back by the supersede: active again, it holds it again.
    assert append.claims == [content_digest("Alec is my boss")] and append.releases == []
    state = fold([*given, event])
    assert state.status is NoteStatus.ACTIVE and state.superseded_by is None


def test_a_keyed_note_reactivated_claims_its_key_again() -> None:
    given: list[AnyEvent] = [saved(key="theme", value='{"dark": true}'), superseded(2)]
    (append,) = when(given, to_version=1)
    assert append.claims == [key_claim("person", "theme")]
    assert append.events[0].value == '{"dark": true}'


@pytest.mark.parametrize(
    ("given", "to_version", "expected", "code", "says"),
    [
        ([saved(), superseded(2), superseded(3)], 2, None, ErrorCode.INVALID_PARAMETER, "superseded at version 2"),
        (HISTORY, 7, None, ErrorCode.INVALID_PARAMETER, "has versions 1 to 3: version 7 is not one"),
        (HISTORY, 1, 2, ErrorCode.VERSION_CONFLICT, "is at version 3, not the expected 2"),
        ([], 1, None, ErrorCode.MEMORY_NOT_FOUND, "Memory with ID AAAAAAAA not found"),
    ],
    ids=["a supersede", "unknown version", "stale expected version", "no such note"],
)
def test_revert_refusals(
    given: list[AnyEvent], to_version: int, expected: int | None, code: ErrorCode, says: str
) -> None:
    error = refused(given, to_version, expected)
    assert error.code is code and says in error.message


def test_a_forgotten_note_cannot_be_reverted_and_the_refusal_says_why() -> None:
    forgotten = NoteForgotten(
        event_id="f", note_id="AAAAAAAA", user_id=USER, version=4, command_id="f", at=NOW, request_count=2
    )
    error = refused([*HISTORY, forgotten], to_version=1)
    assert error.code is ErrorCode.INVALID_PARAMETER
    assert "was forgotten" in error.message and "went with its key" in error.message
    # Nothing of its versions is left in its state to revert to.
    assert fold([*HISTORY, forgotten]).past == ()
