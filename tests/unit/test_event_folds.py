"""Every fold of events goes by a table keyed by event type: given events, then what each fold
builds (a note's state, the read model's views and writes, the index's meta, the forget saga's
deadlines, the lines of ``engram tail``), and what each does with an event type it has no rule
for: the note's state, its view and the history refuse it; the index and the forget saga leave
what they hold as it was; ``engram tail`` says no more than the event's header."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from engram_ledger.contracts.channels import HistoryKeys, SagaKeys
from engram_ledger.contracts.events import (
    ACCOUNT,
    Event,
    ForgetExpired,
    ForgetRequested,
    MemoryRecalled,
    MessageRecorded,
    MessageRetracted,
    NoteForgotten,
    NoteRenewed,
    NoteReverted,
    NoteSuperseded,
    NoteUpdated,
    UserForgotten,
)
from engram_ledger.contracts.model import NoteStatus, Origin
from engram_ledger.projections.forget_saga import ForgetSagaProjection, member
from engram_ledger.projections.history import _fold
from engram_ledger.projections.history_model import evolve_view, version_entry
from engram_ledger.projections.index_model import BatchChanges, NoteMeta, apply_event
from engram_ledger.services.adapters.crypto import KeyedFields
from engram_ledger.services.application.as_of import Moment, note_as_of
from engram_ledger.services.application.ports import LogEntry
from engram_ledger.services.cli.render import _event_details
from engram_ledger.services.domain.note import VERSION_FIELDS, fold
from tests.builders import NOW, USER, saved

A, B, TURN, RECALL = "AAAAAAAA", "BBBBBBBB", "MMMMMMMM", "recall-1"
KEYS = HistoryKeys(0, 1)
FIELDS = KeyedFields(bytes(32))


class NoteArchived(Event, tag="note_archived", frozen=True, kw_only=True):
    """An event type none of the folds has a rule for, as a new one is until it is given one."""


def header(version: int, note_id: str = A) -> dict[str, Any]:
    return {"event_id": f"e-{note_id}-{version}", "note_id": note_id, "user_id": USER, "version": version,
            "command_id": f"c{version}", "at": NOW + timedelta(seconds=version)}  # fmt: skip


def entries(*events: Any) -> list[LogEntry]:
    return [LogEntry(position=f"1-{i}", event=event) for i, event in enumerate(events)]


def reverted(version: int, **fields: Any) -> NoteReverted:
    return NoteReverted(**header(version), to_version=1, content="Alec is my boss", category="person",
                        subject="Alec", confidence=1.0, importance=0.5, **fields)  # fmt: skip


# A note's state (services/domain/note.py) ----------------------------------------------------------


def test_a_save_holds_the_same_version_in_the_state_the_view_its_history_and_the_past() -> None:
    event = saved(A, confidence=0.8, importance=0.9, key="door", value='{"pin": "4417"}',
                  valid_from=NOW - timedelta(days=1), valid_until=NOW + timedelta(days=1))  # fmt: skip
    view = evolve_view(None, event)
    entry = version_entry(view, event, "1-0")
    then = note_as_of(view, [entry], Moment(NOW))
    held = {name: getattr(event, name) for name in VERSION_FIELDS}
    state = fold([event])
    assert {name: getattr(state, name) for name in VERSION_FIELDS} == held
    assert state.at_version(1) == state.snapshot()
    for copy in (view, entry, then):  # the read model holds the value parsed
        assert {name: getattr(copy, name) for name in VERSION_FIELDS} == held | {"value": {"pin": "4417"}}


def test_a_notes_state_follows_each_change_by_its_rule() -> None:
    expires = NOW + timedelta(hours=1)
    state = fold([saved(A), NoteUpdated(**header(2), content="Alec left", expires_at=expires, ttl_seconds=60)])
    assert (state.version, state.content, state.expires_at, state.ttl_seconds) == (2, "Alec left", expires, 60)
    state = fold([NoteSuperseded(**header(3), superseded_by=B, valid_until=NOW)], state)
    assert (state.status, state.superseded_by, state.valid_until) == (NoteStatus.SUPERSEDED, B, NOW)
    state = fold([reverted(4, reactivated=True, replaced_by=B)], state)
    assert (state.status, state.superseded_by, state.content) == (NoteStatus.ACTIVE, None, "Alec is my boss")
    assert state.valid_until is None, "as at version 1"
    state = fold([NoteRenewed(**header(5), expires_at=NOW)], state)
    state = fold([ForgetRequested(**header(6), request_count=1, expires_at=NOW)], state)
    assert (state.expires_at, state.forget_requests, state.forget_expires_at) == (NOW, 1, NOW)
    state = fold([ForgetExpired(**header(7), reason="lapsed")], state)
    assert (state.forget_requests, state.forget_expires_at, len(state.past)) == (0, None, 7)
    state = fold([NoteForgotten(**header(8), request_count=2)], state)
    assert (state.status, state.content, state.past) == (NoteStatus.FORGOTTEN, "", ())


def test_turns_recalls_and_the_account_stream_follow_their_rules() -> None:
    turn = fold([MessageRecorded(**header(1, TURN), session_id="s1", role="user", content="hi", speaker="Bo")])
    assert (turn.is_message, turn.session_id, turn.speaker, turn.past) == (True, "s1", "Bo", ())
    turn = fold([MessageRetracted(**header(2, TURN), session_id="s1")], turn)
    assert turn.retracted and turn.version == 2
    turn = fold([NoteForgotten(**header(3, TURN), request_count=0)], turn)
    assert (turn.forgotten, turn.is_message, turn.session_id, turn.content) == (True, True, "s1", "")
    asked = Origin(channel="mcp", session_id="s1")
    recall = fold([MemoryRecalled(**header(1, RECALL), kind="search", origin=asked)])
    assert (recall.is_recall, recall.session_id, recall.status) == (True, "s1", NoteStatus.ACTIVE)
    account = fold([ForgetRequested(**header(1, ACCOUNT), request_count=1, expires_at=NOW)])
    account = fold([UserForgotten(**header(2, ACCOUNT), erased=[A])], account)
    assert (account.version, account.forget_requests, account.forget_expires_at) == (2, 0, None)


def test_an_event_type_without_a_rule_is_refused_by_the_notes_state_its_view_and_the_history() -> None:
    archived = NoteArchived(**header(2))
    with pytest.raises(TypeError, match="NoteArchived"):
        fold([saved(A), archived])
    with pytest.raises(TypeError, match="NoteArchived"):
        evolve_view(evolve_view(None, saved(A)), archived)
    with pytest.raises(ValueError, match="for unknown note"):
        evolve_view(None, NoteRenewed(**header(2), expires_at=NOW))
    # The history refuses it wherever it stands: a saved note's stream, a note it never saw
    # saved, an account's stream. It never skips it as if it changed nothing.
    saved_view = {KEYS.note(USER, A): evolve_view(None, saved(A))}
    for views, event in ((saved_view, archived), ({}, archived), ({}, NoteArchived(**header(1, ACCOUNT)))):
        with pytest.raises(TypeError, match="NoteArchived"):
            _fold(entries(event), dict(views), KEYS, FIELDS)


# The history read model (projections/history.py) ---------------------------------------------------


def test_the_history_writes_each_event_of_a_batch_by_its_rule() -> None:
    batch = entries(
        saved(A),
        saved(B, "Alec runs the team"),
        NoteSuperseded(**header(2), superseded_by=B),
        reverted(3, reactivated=True, replaced_by=B),
        ForgetRequested(**header(1, ACCOUNT), request_count=1, expires_at=NOW),
        MessageRecorded(**header(1, TURN), session_id="s1", role="user", content="hi"),
        MessageRetracted(**header(2, TURN), session_id="s1"),
        MemoryRecalled(**header(1, RECALL), kind="search", notes=[B]),
        NoteForgotten(**header(4), request_count=1),
    )
    writes = _fold(batch, {}, KEYS, FIELDS)
    assert writes.views[KEYS.note(USER, B)].supersedes == [], "the revert took back the supersede"
    assert writes.views[KEYS.note(USER, A)].status is NoteStatus.FORGOTTEN
    assert (USER, A) not in writes.versions and KEYS.versions(USER, A) in writes.dropped
    assert sorted(writes.shells[KEYS.versions(USER, A)]) == ["1", "2", "3", "4"], "its versions, without their words"
    assert sorted(writes.versions[(USER, B)]) == ["1"]
    assert writes.messages[KEYS.message(USER, TURN)].retracted
    assert writes.said == {(KEYS.said(USER, "s1"), TURN): None}
    assert writes.recalls[KEYS.recall(USER, RECALL)].view.notes == [B]
    assert KEYS.note(USER, ACCOUNT) not in writes.views, "a pending erasure lives in the forget saga"


def test_an_erased_user_takes_what_the_batch_wrote_before_with_it() -> None:
    batch = entries(saved(A), MessageRecorded(**header(1, TURN), session_id="s1", role="user", content="hi"),
                    UserForgotten(**header(2, ACCOUNT), erased=[A, TURN]))  # fmt: skip
    writes = _fold(batch, {}, KEYS, FIELDS)
    assert not writes.views and not writes.messages and not writes.versions and not writes.said
    assert {KEYS.note(USER, A), KEYS.message(USER, TURN), KEYS.said(USER, "s1")} <= writes.erased


# The index (projections/index_model.py) ------------------------------------------------------------


class NoTurns:
    def before(self, event: MessageRecorded) -> list[str]:
        return []

    def retract(self, event: MessageRetracted) -> None:
        return None

    def forget(self, user_id: str, session_id: str) -> None:
        return None


def subject_key(user_id: str, subject: str | None) -> str | None:
    return None if subject is None else f"hash({subject})"


def indexed(version: int = 1, status: str = "active") -> NoteMeta:
    return NoteMeta(version=version, status=status, category="person", kind="fact", created_at=0.0, chunks=1)


def test_the_index_takes_each_change_of_a_note_by_its_rule() -> None:
    changes = BatchChanges()
    meta = apply_event(NoteSuperseded(**header(2), superseded_by=B), "k", indexed(), changes, subject_key, NoTurns())
    assert meta == indexed(2, "superseded") and changes == BatchChanges()
    meta = apply_event(reverted(3), "k", meta, changes, subject_key, NoTurns())
    assert meta is not None and (meta.status, meta.subject_key) == ("active", "hash(Alec)")
    assert changes.texts == {"k": (USER, A, "Alec is my boss")} and changes.names == {"k": "Alec"}
    meta = apply_event(NoteRenewed(**header(4), expires_at=NOW), "k", meta, changes, subject_key, NoTurns())
    assert meta is not None and (meta.version, meta.status) == (4, "active")
    meta = apply_event(NoteForgotten(**header(5), request_count=1), "k", meta, changes, subject_key, NoTurns())
    assert meta is not None and (meta.status, meta.subject_key) == ("forgotten", None)
    assert not changes.texts and changes.forgotten == {"k"}


def test_the_index_takes_an_event_type_without_a_rule_as_changing_nothing_it_shows() -> None:
    changes = BatchChanges()
    archived = NoteArchived(**header(2))
    assert apply_event(archived, "k", indexed(), changes, subject_key, NoTurns()) == indexed(2)
    assert apply_event(archived, "k", None, changes, subject_key, NoTurns()) is None, "a note never indexed"
    assert changes == BatchChanges()


# The forget saga (projections/forget_saga.py) ------------------------------------------------------


class Pipe:
    """Records the commands queued on it, as (command, key, argument)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, command: str) -> Any:
        return lambda *args: self.calls.append((command, *args))


def queued(*events: Any) -> list[tuple[Any, ...]]:
    pipe = Pipe()
    ForgetSagaProjection(None, 0)._queue(pipe, entries(*events))  # type: ignore[arg-type]
    return pipe.calls


def test_the_forget_saga_keeps_deadlines_and_expiries_by_each_events_rule() -> None:
    keys, ms, who = SagaKeys(0), NOW.timestamp() * 1000, member(USER, A)
    requested = ForgetRequested(**header(2), request_count=1, expires_at=NOW)
    assert queued(requested) == [("zadd", keys.deadlines, {who: ms}), ("sadd", keys.pending(USER), A)]
    assert queued(ForgetExpired(**header(3), reason="lapsed")) == [
        ("zrem", keys.deadlines, who), ("srem", keys.pending(USER), A)
    ]  # fmt: skip
    assert (
        queued(saved(A, expires_at=NOW), NoteRenewed(**header(2), expires_at=NOW))
        == [("zadd", keys.expiries, {who: ms})] * 2
    )
    assert queued(NoteUpdated(**header(2), expiry_cleared=True)) == [("zrem", keys.expiries, who)]
    assert queued(NoteForgotten(**header(4), request_count=2)) == [
        ("zrem", keys.deadlines, who), ("srem", keys.pending(USER), A), ("zrem", keys.expiries, who)
    ]  # fmt: skip
    assert queued(saved(A), NoteUpdated(**header(2), content="Alec left")) == [], "no time to live: nothing due"


def test_the_forget_saga_leaves_its_state_as_it_was_for_events_it_has_no_rule_for() -> None:
    superseded = NoteSuperseded(**header(2), superseded_by=B)
    assert queued(superseded, NoteArchived(**header(3)), MessageRetracted(**header(2, TURN), session_id="s1")) == []


# engram tail (services/cli/render.py) --------------------------------------------------------------


def test_tail_says_what_each_event_did_and_no_more_for_one_it_has_no_rule_for() -> None:
    said = {
        "saved": _event_details(saved(A)),
        "updated": _event_details(NoteUpdated(**header(2), content="x", expiry_cleared=True)),
        "reverted": _event_details(reverted(3, reactivated=True)),
        "turn": _event_details(
            MessageRecorded(**header(1, TURN), session_id="s1", role="user", content="hi", speaker="Bo")
        ),
        "recall": _event_details(MemoryRecalled(**header(1, RECALL), kind="search", notes=[A])),
        "requested": _event_details(ForgetRequested(**header(2), request_count=2, expires_at=NOW)),
        "archived": _event_details(NoteArchived(**header(2))),
        "erased": _event_details(UserForgotten(**header(2, ACCOUNT), erased=[A])),
    }
    assert said == {
        "saved": ["fact in person, about Alec"],
        "updated": ["changed content, expiry cleared"],
        "reverted": ["reverted to version 1, active again"],
        "turn": ["user (Bo) in conversation s1"],
        "recall": ["search showed 1 memory"],
        "requested": ["deletion requested (2), to confirm by 2026-01-02 03:04:05 UTC"],
        "archived": [],
        "erased": [],
    }
