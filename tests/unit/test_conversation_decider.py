"""Given events / when RecordMessages or RequestForgetSession / then events: importing a
transcript and erasing one conversation, pure."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engram_ledger.contracts.commands import MessageDraft, RecordMessages, RequestForgetSession
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import (
    ForgetRequested,
    MessageRecorded,
    NoteForgotten,
    SessionForgotten,
    session_stream,
)
from engram_ledger.services.domain.decider import decide, note_ids_for
from engram_ledger.services.domain.forgetting import decide_forget_session
from engram_ledger.services.domain.ids import new_note_id
from engram_ledger.services.domain.note import ABSENT, fold
from tests.builders import NOW, USER

EARLIER = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


def transcript(*turns: tuple[str, str], command_id: str = "r1", session: str = "s1") -> RecordMessages:
    return RecordMessages(
        command_id=command_id,
        user_id=USER,
        session_id=session,
        messages=[MessageDraft(content=text, speaker=speaker, sent_at=EARLIER) for speaker, text in turns],
    )


def test_a_transcript_becomes_one_message_per_turn_in_the_order_given() -> None:
    command = transcript(("Caroline", "I went to a support group"), ("Melanie", "How was it?"), ("Caroline", "Great"))
    ids = note_ids_for(command)
    assert ids == [new_note_id(USER, "r1", i, 0) for i in range(3)] and len(set(ids)) == 3
    appends = decide(command, dict.fromkeys(ids, ABSENT), ids, NOW)
    assert [a.note_id for a in appends] == ids
    events = [a.events[0] for a in appends]
    assert all(isinstance(e, MessageRecorded) for e in events)
    assert [(e.speaker, e.content) for e in events] == [  # type: ignore[union-attr]
        ("Caroline", "I went to a support group"),
        ("Melanie", "How was it?"),
        ("Caroline", "Great"),
    ]
    assert all(e.session_id == "s1" and e.sent_at == EARLIER and e.at == NOW for e in events)  # type: ignore[union-attr]
    assert fold(events[:1]).is_message and fold(events[:1]).speaker == "Caroline"


def test_a_transcript_with_a_control_character_is_refused_whole() -> None:
    command = transcript(("A", "fine"), ("B\x00", "bad speaker"))
    ids = note_ids_for(command)
    with pytest.raises(EngramError) as info:
        decide(command, dict.fromkeys(ids, ABSENT), ids, NOW)
    assert info.value.code is ErrorCode.INVALID_PARAMETER and "speaker" in info.value.message


def recorded(message_id: str, session: str) -> MessageRecorded:
    return MessageRecorded(
        event_id=f"e-{message_id}",
        note_id=message_id,
        user_id=USER,
        version=1,
        command_id="r0",
        at=NOW,
        session_id=session,
        role="user",
        content=f"said in {session}",
    )


def test_forgetting_a_session_asks_first_then_erases_only_its_messages() -> None:
    messages = {
        "AAAAAAAA": fold([recorded("AAAAAAAA", "s1")]),
        "BBBBBBBB": fold([recorded("BBBBBBBB", "s1")]),
        "CCCCCCCC": fold([recorded("CCCCCCCC", "s2")]),
    }
    command = RequestForgetSession(command_id="f1", user_id=USER, session_id="s1")
    (ask,) = decide_forget_session(command, ABSENT, messages, NOW)
    assert ask.note_id == session_stream("s1") and isinstance(ask.events[0], ForgetRequested)
    control = fold(ask.events)
    again = RequestForgetSession(command_id="f2", user_id=USER, session_id="s1")
    appends = decide_forget_session(again, control, messages, NOW)
    erased = {a.note_id: a for a in appends if a.note_id != session_stream("s1")}
    assert sorted(erased) == ["AAAAAAAA", "BBBBBBBB"], "the other session's message stays"
    assert all(a.shred and isinstance(a.events[0], NoteForgotten) for a in erased.values())
    receipt = appends[-1].events[-1]
    assert isinstance(receipt, SessionForgotten) and receipt.erased == ["AAAAAAAA", "BBBBBBBB"]
    assert receipt.session_id == "s1"
