"""Given events / when RequestForget or ExpireForget / then events: requirements §1's rules, pure."""

from __future__ import annotations

from datetime import timedelta

import pytest

from engram_ledger.contracts.commands import ExpireForget, RequestForget
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import AnyEvent, ForgetExpired, ForgetRequested, NoteForgotten
from engram_ledger.services.domain.appends import content_digest
from engram_ledger.services.domain.decider import decide, note_ids_for
from engram_ledger.services.domain.note import fold
from tests.builders import NOW, USER, saved

TTL = timedelta(seconds=300)


def when(command, given: dict[str, list[AnyEvent]], now=NOW):  # type: ignore[no-untyped-def]
    ids = note_ids_for(command)
    return decide(command, {i: fold(given.get(i, [])) for i in ids}, ids, now, forget_ttl=TTL)


def requested(note_id: str = "AAAAAAAA", version: int = 2, count: int = 1, at=NOW) -> ForgetRequested:  # type: ignore[no-untyped-def]
    return ForgetRequested(
        event_id=f"e{version}",
        note_id=note_id,
        user_id=USER,
        version=version,
        command_id="f1",
        at=at,
        request_count=count,
        expires_at=at + TTL,
    )


def forget(*ids: str, confirmed: bool = False, command_id: str = "f2") -> RequestForget:
    return RequestForget(command_id=command_id, user_id=USER, note_ids=list(ids), confirmed=confirmed)


def test_the_first_request_makes_the_note_pending_with_a_deadline() -> None:
    (append,) = when(forget("AAAAAAAA"), {"AAAAAAAA": [saved()]})
    (event,) = append.events
    assert isinstance(event, ForgetRequested) and event.version == 2 and event.request_count == 1
    assert event.expires_at == NOW + TTL and not append.shred


def test_the_same_id_again_while_pending_forgets_and_shreds() -> None:
    (append,) = when(forget("AAAAAAAA"), {"AAAAAAAA": [saved(), requested()]}, now=NOW + timedelta(seconds=10))
    (event,) = append.events
    assert isinstance(event, NoteForgotten) and event.version == 3 and event.request_count == 2
    assert append.shred and append.releases == [content_digest("Alec is my boss")]


def test_after_the_deadline_the_request_lapses_and_asks_again() -> None:
    (append,) = when(forget("AAAAAAAA"), {"AAAAAAAA": [saved(), requested()]}, now=NOW + TTL + timedelta(seconds=1))
    lapsed, asked = append.events
    assert isinstance(lapsed, ForgetExpired) and lapsed.version == 3
    assert isinstance(asked, ForgetRequested) and asked.version == 4 and asked.request_count == 1
    assert not append.shred


def test_each_id_is_decided_on_its_own() -> None:
    given = {"AAAAAAAA": [saved(), requested()], "BBBBBBBB": [saved("BBBBBBBB", content="other")]}
    first, second = when(forget("AAAAAAAA", "BBBBBBBB"), given)
    assert isinstance(first.events[-1], NoteForgotten) and isinstance(second.events[-1], ForgetRequested)


def test_confirmed_forgets_at_once() -> None:
    (append,) = when(forget("AAAAAAAA", confirmed=True), {"AAAAAAAA": [saved()]})
    assert isinstance(append.events[0], NoteForgotten) and append.shred


@pytest.mark.parametrize(
    "given",
    [
        {},
        {
            "AAAAAAAA": [
                saved(),
                NoteForgotten(
                    event_id="x", note_id="AAAAAAAA", user_id=USER, version=2, command_id="c", at=NOW, request_count=2
                ),
            ]
        },
    ],
)
def test_unknown_or_forgotten_notes_are_not_found(given: dict[str, list[AnyEvent]]) -> None:
    with pytest.raises(EngramError) as refused:
        when(forget("AAAAAAAA"), given)
    assert refused.value.code is ErrorCode.MEMORY_NOT_FOUND


def test_the_saga_deadline_lapses_a_pending_request_only_when_due() -> None:
    given = {"AAAAAAAA": [saved(), requested()]}
    expire = ExpireForget(command_id="x1", user_id=USER, note_id="AAAAAAAA")
    assert when(expire, given, now=NOW + timedelta(seconds=1))[0].events == []
    (append,) = when(expire, given, now=NOW + TTL)
    assert isinstance(append.events[0], ForgetExpired)
    assert when(expire, {"AAAAAAAA": [saved()]}, now=NOW + TTL)[0].events == []


def test_a_forgotten_note_folds_to_a_state_without_content() -> None:
    state = fold(
        [
            saved(),
            requested(),
            NoteForgotten(
                event_id="x", note_id="AAAAAAAA", user_id=USER, version=3, command_id="c", at=NOW, request_count=2
            ),
        ]
    )
    assert state.forgotten and state.content == "" and state.version == 3 and state.forget_expires_at is None


def test_a_request_for_other_ids_lapses_the_users_other_pending_deletions() -> None:
    command = forget("BBBBBBBB")
    ids = note_ids_for(command)
    states = {"BBBBBBBB": fold([saved("BBBBBBBB", content="other")])}
    elsewhere = {"AAAAAAAA": fold([saved(), requested()]), "CCCCCCCC": fold([saved("CCCCCCCC", content="x")])}
    asked, lapsed = decide(command, states, ids, NOW, forget_ttl=TTL, pending_elsewhere=elsewhere)
    assert isinstance(asked.events[0], ForgetRequested) and asked.note_id == "BBBBBBBB"
    assert lapsed.note_id == "AAAAAAAA" and isinstance(lapsed.events[0], ForgetExpired)
    assert lapsed.expected_version == 2, "a note not pending (CCCCCCCC) is left alone"
