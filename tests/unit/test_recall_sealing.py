"""A recall's query, pure parts: which runs of words could name a subject, when the text is kept
at all, and how a subscriber opens it (with the key drawn from the recall's own and those of the
notes it names) or passes over one that does not open."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest
from cryptography.exceptions import InvalidTag

from engram_ledger.contracts.events import MemoryRecalled
from engram_ledger.services.adapters.crypto import MasterKey, NoteCipher, recall_key
from engram_ledger.services.bus.deliveries import ContentState, UnopenableEvent, data_keys_needed, reveal
from engram_ledger.services.domain.recalls import SUBJECT_PHRASES_MAX, recorded, subject_phrases

AT = datetime(2026, 1, 1, tzinfo=UTC)
MASTER = MasterKey(bytes(range(32)))


def test_a_subject_is_named_by_its_words_in_order_case_spacing_and_punctuation_aside() -> None:
    phrases = set(subject_phrases("Where does  Alec's boss, Dr. Smith, work now?") or [])
    assert {"alec", "dr. smith", "dr smith", "alec s boss", "alec's boss", "where does alec's boss,"} <= phrases
    assert "smith dr" not in phrases and "Alec" not in phrases
    assert subject_phrases(" ".join(f"w{n}" for n in range(SUBJECT_PHRASES_MAX // 4))) is None, "too long to look up"


def test_a_recall_keeps_its_query_only_when_it_showed_something_and_its_named_notes_are_known() -> None:
    def query(shown: list[tuple[str, int]], named: list[str] | None, asked: str | None = "where is Alec") -> object:
        (event,) = recorded("alice", "recall-1", "search", asked, shown, None, AT, named).events
        assert isinstance(event, MemoryRecalled)
        return event.query, event.named

    assert query([("Ab3dE9xZ", 1)], ["Qq81LmN0", "Ab3dE9xZ"]) == ("where is Alec", ["Qq81LmN0"])
    assert query([], []) == ("", []), "showed nothing: asked, not kept"
    assert query([("Ab3dE9xZ", 1)], None) == ("", []), "the notes it names unknown: not kept"
    assert query([], [], None) == (None, []), "a block built without a query"


def sealed_recall(named: list[str]) -> tuple[MemoryRecalled, dict[str, bytes]]:
    """A recall as the log holds it, and the wrapped data keys of it and every note it names."""
    keys = {n: MASTER.new_data_key() for n in ["recall-1", "Ab3dE9xZ", *named]}
    event = MemoryRecalled(
        event_id="e-1", note_id="recall-1", user_id="alice", version=1, command_id="recall-1", at=AT,
        kind="search", notes=["Ab3dE9xZ"], versions=[1], query="where does Alec work", named=named,
    )  # fmt: skip
    key = recall_key(keys["recall-1"], [keys[n] for n in ["Ab3dE9xZ", *named]])
    sealed = NoteCipher(key).seal_event(event)
    assert isinstance(sealed, MemoryRecalled)
    return sealed, {n: MASTER.wrap(k, f"alice/{n}") for n, k in keys.items()}


def test_a_subscriber_opens_a_recall_with_the_key_drawn_from_it_and_the_notes_it_names() -> None:
    event, wrapped = sealed_recall(["Qq81LmN0"])
    assert data_keys_needed(event) == ["recall-1", "Ab3dE9xZ", "Qq81LmN0"]
    shown, state = reveal(event, MASTER, wrapped["recall-1"], wrapped)
    assert state is ContentState.OPEN and isinstance(shown, MemoryRecalled) and shown.query == "where does Alec work"
    # Its own key alone does not open it.
    with pytest.raises(InvalidTag):
        NoteCipher(MASTER.unwrap(wrapped["recall-1"], "alice/recall-1")).open_event(event)
    # A note it names by subject forgotten (its key gone): the query is gone.
    gone, state = reveal(event, MASTER, wrapped["recall-1"], {**wrapped, "Qq81LmN0": None})  # type: ignore[dict-item]
    assert state is ContentState.ERASED and isinstance(gone, MemoryRecalled) and gone.query is None


def test_an_altered_recall_does_not_open() -> None:
    event, wrapped = sealed_recall([])
    altered = msgspec.structs.replace(event, event_id="e-2")
    with pytest.raises(UnopenableEvent) as refused:
        reveal(altered, MASTER, wrapped["recall-1"], wrapped)
    assert "e-2" in refused.value.message and "altered" in refused.value.message


def test_a_recall_whose_query_was_not_kept_carries_no_content() -> None:
    event = MemoryRecalled(
        event_id="e-1", note_id="recall-1", user_id="alice", version=1, command_id="recall-1", at=AT,
        kind="search", query="",
    )  # fmt: skip
    assert data_keys_needed(event) == []
    assert reveal(event, None, None) == (event, ContentState.NONE)
