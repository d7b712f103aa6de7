"""Given events / when PutNote or RetractMessage / then events: notes put by key with a value,
and turns taken back; plus the pure rules of values (their text, their filters)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from engram_ledger.contracts.commands import (
    ExpireNote,
    PutNote,
    RenewNote,
    RequestForget,
    RetractMessage,
    SupersedeNote,
    UpdateNote,
)
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import (
    MessageRecorded,
    MessageRetracted,
    NoteForgotten,
    NoteRenewed,
    NoteSaved,
    NoteUpdated,
)
from engram_ledger.services.domain.appends import identity_claim
from engram_ledger.services.domain.decider import decide, decide_put
from engram_ledger.services.domain.note import ABSENT, fold
from engram_ledger.services.domain.values import check_where, key_claim, matches, text_of, value_json
from tests.builders import NOW, USER, saved


def put(value: dict[str, Any], **fields: Any) -> PutNote:
    return PutNote(command_id="c1", user_id=USER, category="prefs", key="food", value=value, **fields)


def first_put() -> NoteSaved:
    (append,) = decide_put(put({"content": "likes pizza"}), "note0001", ABSENT, NOW)
    (event,) = append.events
    assert isinstance(event, NoteSaved)
    return event


def test_a_first_put_saves_a_note_holding_its_key_not_its_text() -> None:
    (append,) = decide_put(put({"content": "likes pizza", "stars": 3}), "note0001", ABSENT, NOW)
    (event,) = append.events
    assert isinstance(event, NoteSaved)
    assert (event.key, event.category, event.version) == ("food", "prefs", 1)
    assert event.value == '{"content":"likes pizza","stars":3}'
    assert event.content == "likes pizza\nstars: 3"
    assert append.claims == [key_claim("prefs", "food")] and append.expected_version == 0


def test_a_later_put_updates_only_what_changed_and_the_same_value_appends_nothing() -> None:
    state = fold([first_put()])
    (same,) = decide_put(put({"content": "likes pizza"}), "note0001", state, NOW)
    assert same.events == [] and same.expected_version == 1
    (changed,) = decide_put(put({"content": "likes sushi"}), "note0001", state, NOW)
    (event,) = changed.events
    assert isinstance(event, NoteUpdated) and event.version == 2
    assert (event.content, event.value) == ("likes sushi", '{"content":"likes sushi"}')
    assert changed.claims == [] and changed.releases == []


def test_expected_version_guards_a_put() -> None:
    with pytest.raises(EngramError) as fresh:
        decide_put(put({"a": 1}, expected_version=2), "note0001", ABSENT, NOW)
    assert fresh.value.code is ErrorCode.VERSION_CONFLICT
    with pytest.raises(EngramError) as held:
        decide_put(put({"a": 1}, expected_version=0), "note0001", fold([first_put()]), NOW)
    assert held.value.code is ErrorCode.VERSION_CONFLICT


def test_a_keyed_note_gives_its_key_back_when_forgotten_or_superseded() -> None:
    given = fold([first_put()])
    assert identity_claim(given) == key_claim("prefs", "food")
    forget = RequestForget(command_id="c2", user_id=USER, note_ids=["note0001"], confirmed=True)
    (gone,) = decide(forget, {"note0001": given}, ["note0001"], NOW)
    assert gone.releases == [key_claim("prefs", "food")] and gone.shred
    other = fold([saved("note0002", "something else")])
    supersede = SupersedeNote(command_id="c3", user_id=USER, note_id="note0001", superseded_by="note0002")
    old, _ = decide(supersede, {"note0001": given, "note0002": other}, ["note0001", "note0002"], NOW)
    assert old.releases == [key_claim("prefs", "food")]


def test_a_keyed_note_keeps_its_category_and_its_text_claims_nothing() -> None:
    given = {"note0001": fold([first_put()])}
    moved = UpdateNote(command_id="c2", user_id=USER, note_id="note0001", category="other")
    with pytest.raises(EngramError) as refused:
        decide(moved, given, ["note0001"], NOW)
    assert refused.value.code is ErrorCode.INVALID_PARAMETER and "key" in refused.value.message
    reworded = UpdateNote(command_id="c3", user_id=USER, note_id="note0001", content="likes pasta")
    (append,) = decide(reworded, given, ["note0001"], NOW)
    assert append.claims == [] and append.releases == []


def test_a_retracted_turn_is_an_event_and_cannot_be_retracted_twice() -> None:
    recorded = MessageRecorded(
        event_id="e1", note_id="msg00001", user_id=USER, version=1, command_id="c0", at=NOW, session_id="s1",
        role="user", content="hello",
    )  # fmt: skip
    retract = RetractMessage(command_id="c1", user_id=USER, message_id="msg00001")
    (append,) = decide(retract, {"msg00001": fold([recorded])}, ["msg00001"], NOW)
    (event,) = append.events
    assert isinstance(event, MessageRetracted) and (event.version, event.session_id) == (2, "s1")
    for state in (fold([recorded, event]), ABSENT, fold([saved("msg00001", "a note")])):
        with pytest.raises(EngramError) as refused:
            decide(retract, {"msg00001": state}, ["msg00001"], NOW)
        assert refused.value.code is ErrorCode.MEMORY_NOT_FOUND


def test_the_text_of_a_value_is_its_named_fields_or_all_of_it() -> None:
    value = {"title": "garden", "body": {"text": "water the tomatoes", "tags": ["green", "daily"]}, "n": 2}
    assert text_of(value, None) == "green\ndaily\nwater the tomatoes\nn: 2\ngarden"  # fields in name order
    assert text_of(value, ["body.text"]) == "water the tomatoes"
    assert text_of(value, ["title", "missing"]) == "garden"
    assert text_of({"a.b": "dotted key"}, ["a.b"]) == "dotted key"
    assert text_of({}, None) == "{}" and text_of({"x": ""}, ["x"]) == '{"x":""}'
    assert text_of({"log": "\x1b[1mbold\x00"}, None) == "[1mbold"  # kept whole in the value
    assert value_json({"b": 1, "a": "é"}) == '{"b":1,"a":"é"}'  # kept in the order given


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ({"kind": "dog"}, True),
        ({"kind": "cat"}, False),
        ({"age": {"$gt": 2, "$lte": 3}}, True),
        ({"age": {"$lt": 3}}, False),
        ({"age": {"$gte": 3}, "kind": "dog"}, True),
        ({"owner.name": "ann"}, True),
        ({"owner": {"name": "ann"}}, True),
        ({"missing": {"$ne": 1}}, True),
        ({"missing": {"$eq": None}}, True),
        ({"missing": None}, True),
        ({"kind": None}, False),
        ({"kind": {"$gt": 1}}, False),
        ({"age": {"$ne": 3}}, False),
    ],
)
def test_filters_on_values(where: dict[str, Any], expected: bool) -> None:
    value = {"kind": "dog", "age": 3, "owner": {"name": "ann"}}
    assert matches(value, where) is expected


def test_a_note_without_a_value_matches_only_what_a_missing_field_satisfies() -> None:
    assert not matches(None, {"kind": "dog"})
    assert not matches(None, {"kind": {"$gt": 1}})
    assert matches(None, {"kind": {"$ne": "dog"}})
    assert matches(None, {"kind": None})


def test_an_unknown_operator_is_refused_by_name() -> None:
    with pytest.raises(EngramError) as refused:
        check_where({"age": {"$between": [1, 2]}})
    assert refused.value.code is ErrorCode.INVALID_PARAMETER and "$between" in refused.value.message


# Times to live ------------------------------------------------------------------------------------


def test_a_put_with_a_time_to_live_expires_then_and_each_put_starts_it_again() -> None:
    (append,) = decide_put(put({"a": 1}, ttl_seconds=60), "note0001", ABSENT, NOW)
    (event,) = append.events
    assert isinstance(event, NoteSaved)
    assert (event.expires_at, event.ttl_seconds) == (NOW + timedelta(seconds=60), 60)
    state = fold([event])
    later = NOW + timedelta(seconds=30)
    (same_value,) = decide_put(put({"a": 1}, ttl_seconds=60), "note0001", state, later)
    (renewed,) = same_value.events
    assert isinstance(renewed, NoteUpdated) and renewed.expires_at == later + timedelta(seconds=60)
    assert (renewed.content, renewed.value) == (None, None)
    (without,) = decide_put(put({"a": 1}), "note0001", state, later)
    (cleared,) = without.events
    assert isinstance(cleared, NoteUpdated) and cleared.expiry_cleared
    assert fold([event, cleared]).expires_at is None


def test_a_renewal_restarts_the_time_to_live_and_a_note_without_one_stays_as_it_is() -> None:
    (saved_with_ttl,) = decide_put(put({"a": 1}, ttl_seconds=10), "note0001", ABSENT, NOW)[0].events
    renew = RenewNote(command_id="c2", user_id=USER, note_id="note0001")
    later = NOW + timedelta(seconds=5)
    (append,) = decide(renew, {"note0001": fold([saved_with_ttl])}, ["note0001"], later)
    (event,) = append.events
    assert isinstance(event, NoteRenewed) and event.expires_at == later + timedelta(seconds=10)
    (nothing,) = decide(renew, {"note0001": fold([first_put()])}, ["note0001"], later)
    assert nothing.events == []


def test_an_expired_note_is_forgotten_as_a_confirmed_forget_is_and_a_renewed_one_is_not() -> None:
    (saved_with_ttl,) = decide_put(put({"a": 1}, ttl_seconds=10), "note0001", ABSENT, NOW)[0].events
    state = fold([saved_with_ttl])
    expire = ExpireNote(command_id="c3", user_id=USER, note_id="note0001")
    (early,) = decide(expire, {"note0001": state}, ["note0001"], NOW + timedelta(seconds=9))
    assert early.events == []
    (due,) = decide(expire, {"note0001": state}, ["note0001"], NOW + timedelta(seconds=10))
    (event,) = due.events
    assert isinstance(event, NoteForgotten) and event.reason == "expired"
    assert due.shred and due.releases == [key_claim("prefs", "food")]
    gone = fold([saved_with_ttl, event])
    (again,) = decide(expire, {"note0001": gone}, ["note0001"], NOW + timedelta(seconds=20))
    assert again.events == []


def test_an_expired_note_cannot_be_renewed_back() -> None:
    (saved_with_ttl,) = decide_put(put({"a": 1}, ttl_seconds=10), "note0001", ABSENT, NOW)[0].events
    renew = RenewNote(command_id="c2", user_id=USER, note_id="note0001")
    with pytest.raises(EngramError) as refused:
        decide(renew, {"note0001": fold([saved_with_ttl])}, ["note0001"], NOW + timedelta(seconds=10))
    assert refused.value.code is ErrorCode.MEMORY_NOT_FOUND
