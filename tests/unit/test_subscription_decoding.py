"""The subscription's pure parts: what a delivery shows of an event (with and without the key,
for a forgotten note), which events a filter lets through, what an erasure asks, and bad input."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import (
    ForgetRequested,
    MessageRecorded,
    NoteForgotten,
    NoteSaved,
    NoteSuperseded,
    NoteUpdated,
    SessionForgotten,
    UserForgotten,
)
from engram_ledger.contracts.model import NoteKind, NoteSource
from engram_ledger.services.adapters.crypto import MasterKey, NoteCipher
from engram_ledger.services.bus.deliveries import (
    EVENT_TYPES,
    ContentState,
    checked_users,
    erasure_of,
    event_kinds,
    reveal,
)
from engram_ledger.services.bus.subscription import Subscription

AT = datetime(2026, 1, 1, tzinfo=UTC)
MASTER = MasterKey(bytes(range(32)))


def header(note_id: str = "Ab3dE9xZ", version: int = 1, user_id: str = "alice") -> dict[str, Any]:
    return {"event_id": f"e-{note_id}-{version}", "note_id": note_id, "user_id": user_id, "version": version,
            "command_id": "c", "at": AT}  # fmt: skip


def saved() -> NoteSaved:
    return NoteSaved(
        kind=NoteKind.FACT, content="Alec is my boss", category="person", subject="Alec", confidence=0.9,
        source=NoteSource.EXPLICIT, importance=0.5, **header(),
    )  # fmt: skip


def sealed(event: Any) -> tuple[Any, bytes]:
    """The event as the log holds it, and its note's wrapped data key."""
    data_key = MASTER.new_data_key()
    return NoteCipher(data_key).seal_event(event), MASTER.wrap(data_key, f"{event.user_id}/{event.note_id}")


def test_the_key_holder_reads_the_content_of_a_note_that_still_has_its_key() -> None:
    event, wrapped = sealed(saved())
    assert event.content.startswith("enc1:") and event.subject.startswith("enc1:")
    shown, state = reveal(event, MASTER, wrapped)
    assert state is ContentState.OPEN and shown == saved()


def test_without_the_key_a_delivery_is_metadata_only() -> None:
    event, wrapped = sealed(saved())
    shown, state = reveal(event, None, wrapped)
    assert state is ContentState.WITHHELD
    assert isinstance(shown, NoteSaved) and shown.content == "" and shown.subject is None
    assert (shown.note_id, shown.kind, shown.category, shown.version, shown.at) == ("Ab3dE9xZ", "fact", "person", 1, AT)
    assert b"enc1:" not in msgspec.json.encode(shown), "no ciphertext handed on either"


def test_a_forgotten_notes_key_is_gone_so_its_content_is_too() -> None:
    event, _ = sealed(saved())
    shown, state = reveal(event, MASTER, None)
    assert state is ContentState.ERASED and isinstance(shown, NoteSaved)
    assert shown.content == "" and shown.subject is None and b"Alec" not in msgspec.json.encode(shown)


def test_events_without_content_pass_as_they_are() -> None:
    for event in (
        NoteSuperseded(superseded_by="Qq81LmN0", **header()),
        NoteUpdated(importance=0.9, **header(version=2)),
        NoteForgotten(request_count=2, **header(version=3)),
    ):
        assert reveal(event, None, None) == (event, ContentState.NONE)


def test_a_wrong_master_key_is_a_clear_error() -> None:
    event, wrapped = sealed(saved())
    with pytest.raises(EngramError) as refused:
        reveal(event, MasterKey(bytes(32)), wrapped)
    assert refused.value.code is ErrorCode.INVALID_PARAMETER and "cannot open" in refused.value.message


def test_a_data_key_of_another_note_opens_nothing() -> None:
    event, _ = sealed(saved())
    _, someone_elses = sealed(NoteSaved(**{**msgspec.structs.asdict(saved()), "note_id": "Zz000000"}))
    with pytest.raises(EngramError) as refused:
        reveal(event, MASTER, someone_elses)
    assert refused.value.code is ErrorCode.INVALID_PARAMETER


def test_erasures_say_what_must_go() -> None:
    note = erasure_of(NoteForgotten(request_count=1, **header(version=4)))
    assert note is not None and (note.scope, note.user_id, note.note_ids) == ("note", "alice", ("Ab3dE9xZ",))
    assert str(note).startswith("erase every copy of note Ab3dE9xZ of user alice")
    user = erasure_of(UserForgotten(erased=["Ab3dE9xZ", "Qq81LmN0"], **header("_account")))
    assert user is not None and user.scope == "user" and user.note_ids == ("Ab3dE9xZ", "Qq81LmN0")
    assert "erase everything held about user alice" in str(user)
    session = erasure_of(SessionForgotten(session_id="s-42", erased=["Mm000001"], **header("_session:s-42")))
    assert session is not None and session.scope == "session" and session.session_id == "s-42"
    assert "conversation s-42" in str(session) and "Mm000001" in str(session)
    pending = ForgetRequested(request_count=1, expires_at=AT, **header(version=2))
    assert erasure_of(pending) is None and erasure_of(saved()) is None


def test_kinds_are_event_tags_or_structs_and_unknown_ones_are_named() -> None:
    assert event_kinds(None) is None
    assert event_kinds(["note_saved", NoteForgotten]) == {"note_saved", "note_forgotten"}
    assert event_kinds("note_saved") == {"note_saved"}
    assert set(EVENT_TYPES) >= {"note_saved", "message_recorded", "user_forgotten", "session_forgotten"}
    with pytest.raises(EngramError) as refused:
        event_kinds(["note_saved", "note_deleted"])
    assert refused.value.code is ErrorCode.INVALID_PARAMETER
    assert "'note_deleted' is not an event type" in refused.value.message and "note_forgotten" in refused.value.message
    with pytest.raises(EngramError):
        event_kinds([])


def test_users_are_checked_like_the_contracts_user_ids() -> None:
    assert checked_users(["alice", "tg:12345"]) == {"alice", "tg:12345"}
    assert checked_users("alice") == {"alice"}
    for bad in (["bad user"], [""], ["x" * 129], []):
        with pytest.raises(EngramError) as refused:
            checked_users(bad)
        assert refused.value.code is ErrorCode.INVALID_PARAMETER and "users" in refused.value.message


def test_a_filter_lets_erasures_through_whatever_the_kinds() -> None:
    only_saves = Subscription(None, "g", users=["alice"], kinds=["note_saved"])
    message = MessageRecorded(session_id="s", role="user", content="hi", **header("Mm000001"))
    assert only_saves._wanted(saved())
    assert not only_saves._wanted(message)
    assert not only_saves._wanted(NoteSaved(**{**msgspec.structs.asdict(saved()), "user_id": "bob"}))
    assert only_saves._wanted(NoteForgotten(request_count=1, **header(version=2)))
    assert only_saves._wanted(UserForgotten(erased=[], **header("_account")))
    assert not only_saves._wanted(UserForgotten(erased=[], **header("_account", user_id="bob")))


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"consumer": "has space"}, "consumer"),
        ({"batch": 0}, "batch"),
        ({"claim_idle_ms": -1}, "claim_idle_ms"),
        ({"block_ms": 1.5}, "block_ms"),
        ({"kinds": ["nope"]}, "nope"),
    ],
)
def test_bad_options_are_refused_before_anything_is_read(options: dict[str, Any], words: str) -> None:
    with pytest.raises(EngramError) as refused:
        Subscription(None, "crm-sync", **options)
    assert refused.value.code is ErrorCode.INVALID_PARAMETER and words in refused.value.message


def test_the_asyncapi_document_says_how_to_subscribe_and_what_a_forget_asks() -> None:
    from engram_ledger.contracts.asyncapi import asyncapi

    doc = asyncapi()
    log = doc["channels"]["log"]["description"]
    for words in ("consumer group", "XGROUP CREATE", "XACK", "XAUTOCLAIM", "examples/subscriber.py", "at least once"):
        assert words in log, words
    follow = doc["operations"]["followLog"]
    assert follow["channel"] == {"$ref": "#/channels/log"}
    assert "on note_forgotten erase every copy of that note" in follow["description"]
    assert "on user_forgotten erase everything held about the user" in follow["description"]


def test_tail_lines_say_what_happened_and_show_content_only_when_opened() -> None:
    from engram_ledger.services.bus.deliveries import Delivery
    from engram_ledger.services.cli.render import event_line

    owner = Subscription(None, "g")

    def line(event: Any, state: ContentState) -> str:
        return event_line(Delivery(owner, 2, "1700000000000-0", event, state, False)).plain

    opened = line(saved(), ContentState.OPEN)
    assert opened.startswith("2026-01-01 00:00:00 UTC  2:1700000000000-0  note_saved  alice/Ab3dE9xZ v1")
    assert 'fact in person, about Alec  "Alec is my boss"' in opened
    withheld, _ = reveal(sealed(saved())[0], None, None)
    assert "(content sealed: --content or --key-file to read it)" in line(withheld, ContentState.WITHHELD)
    assert "Alec" not in line(withheld, ContentState.WITHHELD)
    assert "(content erased: the note was forgotten)" in line(withheld, ContentState.ERASED)
    forgotten = line(NoteForgotten(request_count=2, **header(version=3)), ContentState.NONE)
    assert "forgotten (requested)  → erase every copy of note Ab3dE9xZ of user alice" in forgotten
    hostile = NoteSaved(**{**msgspec.structs.asdict(saved()), "content": "Alec\x1b[2J is\nmy boss"})
    assert '"Alec\\x1b[2J is my boss"' in line(hostile, ContentState.OPEN), "control characters escaped, one line"
