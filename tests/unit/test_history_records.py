"""How the history read model stores a view (projections/history_records.py): what the user said
sealed under the note's key, the rest readable, and what the projection can still read once
the key is gone."""

from __future__ import annotations

import msgspec
import pytest

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import MessageRecorded, NoteForgotten, NoteSaved
from engram_ledger.contracts.model import NoteStatus, NoteView, Origin
from engram_ledger.projections.history_model import evolve_view, message_view, tombstone, version_entry
from engram_ledger.projections.history_records import (
    MESSAGES,
    NOTES,
    VERSIONS,
    message_label,
    note_label,
    version_label,
)
from engram_ledger.services.adapters.crypto import MasterKey, RecordKey
from tests.builders import NOW, saved

MASTER = MasterKey(bytes(32))
SECRETS = (b"Alec", b"boss", b"Ottoline", b"door-code", b"4417", b"tui-session-9")


def _view() -> tuple[NoteView, NoteSaved]:
    event = saved(
        content="Alec is my boss",
        subject="Ottoline",
        summary="boss",
        key="door-code",
        value='{"pin": "4417"}',
        origin=Origin(channel="tui", session_id="tui-session-9"),
    )
    return evolve_view(None, event), event


def test_a_note_opens_whole_with_its_key_and_shows_only_its_shell_without() -> None:
    view, _ = _view()
    key = RecordKey(MASTER.new_data_key())
    stored = NOTES.encode(view, key, note_label("alice", view.id), keyed="digest")
    assert not any(s in stored for s in SECRETS)
    assert b'"category":"person"' in stored and b'"status":"active"' in stored, "metadata stays readable"
    assert NOTES.open(stored, key, note_label("alice", view.id)) == view
    assert NOTES.open(stored, None, note_label("alice", view.id)) is None, "its key gone, it reads as gone"
    # The projection still gets what a tombstone, a listing member and the key lookup need.
    shell = NOTES.read(stored, None, note_label("alice", view.id))
    assert shell.keyed == "digest" and shell.view.content == "" and shell.view.key is None
    assert (shell.view.category, shell.view.created_at, shell.view.status) == (view.category, NOW, NoteStatus.ACTIVE)
    gone = NoteForgotten(
        event_id="e9", note_id=view.id, user_id="alice", version=2, command_id="c9", at=NOW, request_count=2
    )
    assert tombstone(shell.view, gone) == tombstone(view, gone)


def test_a_note_without_a_data_key_is_stored_as_it_is_and_its_keyed_hash_beside_its_shell() -> None:
    """No key: a tombstone (nothing to seal), a note just forgotten (its events read shredded), or
    one saved before the log sealed content (whose text the log holds in plain anyway)."""
    view, _ = _view()
    gone = NoteForgotten(
        event_id="e9", note_id=view.id, user_id="alice", version=2, command_id="c9", at=NOW, request_count=2
    )
    stored = NOTES.encode(tombstone(view, gone), None, note_label("alice", view.id))
    assert stored == msgspec.json.encode(tombstone(view, gone))
    assert NOTES.open(stored, None, note_label("alice", view.id)) == tombstone(view, gone)
    shell = NOTES.encode(view, None, note_label("alice", view.id), keyed="digest")
    assert not any(s in shell for s in SECRETS)
    assert NOTES.read(shell, None, note_label("alice", view.id)).keyed == "digest"


def test_a_value_moved_under_another_notes_name_is_refused() -> None:
    view, _ = _view()
    key = RecordKey(MASTER.new_data_key())
    stored = NOTES.encode(view, key, note_label("alice", view.id))
    with pytest.raises(EngramError) as refused:
        NOTES.open(stored, key, note_label("alice", "BBBBBBBB"))
    assert refused.value.code is ErrorCode.STORAGE_ERROR


def test_versions_and_turns_seal_their_origin_and_session_name() -> None:
    view, event = _view()
    key = RecordKey(MASTER.new_data_key())
    version = version_entry(view, event)
    stored = VERSIONS.encode(version, key, version_label("alice", view.id, "1"))
    assert not any(s in stored for s in SECRETS)
    assert VERSIONS.open(stored, key, version_label("alice", view.id, "1")) == version
    with pytest.raises(EngramError):
        VERSIONS.open(stored, key, version_label("alice", view.id, "2"))
    turn = message_view(
        MessageRecorded(
            event_id="e1",
            note_id="MMMMMMMM",
            user_id="alice",
            version=1,
            command_id="c1",
            at=NOW,
            session_id="tui-session-9",
            role="user",
            content="Alec is my boss",
            speaker="Ottoline",
        )
    )
    stored = MESSAGES.encode(turn, key, message_label("alice", turn.id))
    assert not any(s in stored for s in SECRETS)
    assert MESSAGES.open(stored, key, message_label("alice", turn.id)) == turn


def test_a_value_written_before_the_read_model_was_sealed_still_reads() -> None:
    view, _ = _view()
    legacy = msgspec.json.encode(view)
    assert NOTES.open(legacy, RecordKey(MASTER.new_data_key()), note_label("alice", view.id)) == view
    assert NOTES.read(legacy, None, note_label("alice", view.id)).view == view
