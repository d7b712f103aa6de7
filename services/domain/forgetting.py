"""Forgetting, decided: requirements §1's two calls for notes (ask, then delete; a
deadline lapses a request not confirmed), and the erasure of a whole user or conversation, over
what the caller loaded."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from engram_ledger.contracts.commands import (
    ExpireForget,
    RequestForget,
    RequestForgetSession,
    RequestForgetUser,
)
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import (
    ACCOUNT,
    AnyEvent,
    ForgetRequested,
    NoteForgotten,
    SessionForgotten,
    UserForgotten,
    session_stream,
)
from engram_ledger.services.domain.appends import (
    StreamAppend,
    event_header,
    forget_expired,
    identity_claim,
    lapse_if_due,
)
from engram_ledger.services.domain.note import NoteState

DEFAULT_FORGET_TTL = timedelta(seconds=300)


def forgettable(state: NoteState) -> bool:
    return state.exists and not state.is_message and not state.is_recall and not state.forgotten


def request_forget(
    command: RequestForget,
    ids: list[str],
    states: Mapping[str, NoteState],
    now: datetime,
    ttl: timedelta,
    elsewhere: Mapping[str, NoteState],
) -> list[StreamAppend]:
    """Requirements §1's two calls, per id: not pending -> pending (ask); pending -> forgotten; pending
    but past its deadline -> lapsed, then pending again (ask again). A pending deletion of a
    note this request does not name lapses: "user requests a different ID on the second call:
    treated as a new first call for the new ID, the old pending expires"."""
    if command.query is not None or not ids:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "give note_ids to forget (a query only finds candidates)")
    missing = [i for i in ids if not forgettable(states[i])]
    if missing:
        raise EngramError(ErrorCode.MEMORY_NOT_FOUND, f"Memory with ID {', '.join(missing)} not found")
    appends = []
    for note_id in ids:
        state = states[note_id]
        version, events, pending = lapse_if_due(command, note_id, state, now)
        common = event_header(command, note_id, version + 1, now)
        count = (state.forget_requests if pending else 0) + 1
        if pending or command.confirmed:
            events.append(NoteForgotten(request_count=count, **common))
            appends.append(
                StreamAppend(
                    note_id=note_id,
                    expected_version=state.version,
                    events=events,
                    releases=[identity_claim(state)],
                    shred=True,
                )
            )
        else:
            events.append(ForgetRequested(request_count=count, expires_at=now + ttl, **common))
            appends.append(StreamAppend(note_id=note_id, expected_version=state.version, events=events))
    for note_id, state in sorted(elsewhere.items()):
        if note_id in ids or state.forget_expires_at is None or not forgettable(state):
            continue
        lapsed = forget_expired(command, note_id, state.version + 1, now, "another memory was requested instead")
        appends.append(StreamAppend(note_id=note_id, expected_version=state.version, events=[lapsed]))
    return appends


def decide_forget_user(
    command: RequestForgetUser,
    account: NoteState,
    notes: Mapping[str, NoteState],
    now: datetime,
    ttl: timedelta = DEFAULT_FORGET_TTL,
) -> list[StreamAppend]:
    """Erasing a whole user, in the same two calls, pending on the user's account stream. When
    it executes, every note and message still readable is forgotten (its key shredded) and the
    account gets the receipt, all in one append."""
    return _erase(
        command, ACCOUNT, account, notes, now, ttl, lambda erased, header: UserForgotten(erased=erased, **header)
    )


def decide_forget_session(
    command: RequestForgetSession,
    control: NoteState,
    messages: Mapping[str, NoteState],
    now: datetime,
    ttl: timedelta = DEFAULT_FORGET_TTL,
) -> list[StreamAppend]:
    """Erasing one conversation, as a user is erased: pending on the session's control stream,
    then every message of the session forgotten (``messages``: the user's messages, any session;
    only this session's are touched) with a receipt."""
    mine = session_messages(command.session_id, messages)
    if not erasable(mine):
        raise EngramError(ErrorCode.MEMORY_NOT_FOUND, f"Conversation {command.session_id} not found")
    return _erase(
        command,
        session_stream(command.session_id),
        control,
        mine,
        now,
        ttl,
        lambda erased, header: SessionForgotten(session_id=command.session_id, erased=erased, **header),
    )


def session_messages(session_id: str, states: Mapping[str, NoteState]) -> dict[str, NoteState]:
    """The user's messages said in this conversation, and what was recalled in it."""
    return {i: s for i, s in states.items() if (s.is_message or s.is_recall) and s.session_id == session_id}


def erasable(states: Mapping[str, NoteState]) -> list[str]:
    """The notes and messages an erasure would forget: those still readable, in id order."""
    return sorted(i for i, s in states.items() if s.exists and not s.forgotten)


def _erase(
    command: RequestForgetUser | RequestForgetSession,
    control_id: str,
    control: NoteState,
    targets: Mapping[str, NoteState],
    now: datetime,
    ttl: timedelta,
    receipt: Callable[[list[str], dict[str, Any]], AnyEvent],
) -> list[StreamAppend]:
    version, control_events, pending = lapse_if_due(command, control_id, control, now)
    header = event_header(command, control_id, version + 1, now)
    if not (pending or command.confirmed):
        count = (control.forget_requests if pending else 0) + 1
        control_events.append(ForgetRequested(request_count=count, expires_at=now + ttl, **header))
        return [StreamAppend(note_id=control_id, expected_version=control.version, events=control_events)]
    appends = []
    erased = erasable(targets)
    for note_id in erased:
        state = targets[note_id]
        event = NoteForgotten(request_count=0, **event_header(command, note_id, state.version + 1, now))
        releases = [] if state.is_message or state.is_recall else [identity_claim(state)]
        appends.append(
            StreamAppend(note_id=note_id, expected_version=state.version, events=[event], releases=releases, shred=True)
        )
    control_events.append(receipt(erased, header))
    appends.append(StreamAppend(note_id=control_id, expected_version=control.version, events=control_events))
    return appends


def erase_late(
    command: RequestForgetUser | RequestForgetSession, late: Mapping[str, NoteState], now: datetime
) -> list[StreamAppend]:
    """What an executed erasure did not see, forgotten as it forgot the rest: notes or messages
    written while it decided, before its receipt (``late``, by the caller's reading of the log).
    No receipt of its own: the erasure's lists what it saw, and each of these its own
    ``note_forgotten``."""
    appends = []
    for note_id in erasable(late):
        state = late[note_id]
        event = NoteForgotten(request_count=0, **event_header(command, note_id, state.version + 1, now))
        releases = [] if state.is_message or state.is_recall else [identity_claim(state)]
        appends.append(
            StreamAppend(note_id=note_id, expected_version=state.version, events=[event], releases=releases, shred=True)
        )
    return appends


def expire_forget(command: ExpireForget, state: NoteState, now: datetime) -> list[StreamAppend]:
    """The saga's deadline: lapse the pending state if it is still pending and due (a renewed
    or executed request leaves nothing to do)."""
    due = state.forget_expires_at is not None and state.forget_expires_at <= now
    if not forgettable(state) or not due:
        return [StreamAppend(note_id=command.note_id, expected_version=state.version, events=[])]
    event = forget_expired(command, command.note_id, state.version + 1, now, "not confirmed in time")
    return [StreamAppend(note_id=command.note_id, expected_version=state.version, events=[event])]
