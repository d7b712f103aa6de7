"""A note's state as the decider sees it: a left fold over the note's own events."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import msgspec

from engram_ledger.contracts import events
from engram_ledger.contracts.model import NoteStatus


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What a note held at one version: what a revert to that version gives back."""

    version: int
    status: NoteStatus | None
    content: str
    category: str
    subject: str | None
    confidence: float
    importance: float
    superseded_by: str | None
    key: str | None
    value: str | None
    valid_from: datetime | None = None
    valid_until: datetime | None = None


class NoteState(msgspec.Struct, frozen=True, kw_only=True):
    """Only what decisions need. ``version == 0`` means the note does not exist."""

    version: int = 0
    status: NoteStatus | None = None
    content: str = ""
    category: str = ""
    subject: str | None = None
    confidence: float = 1.0
    importance: float = 0.5
    superseded_by: str | None = None
    # A note put by key: the key, and its value as JSON text.
    key: str | None = None
    value: str | None = None
    # A note put with a time to live: when it expires, and the time to live a renewal restarts.
    expires_at: datetime | None = None
    ttl_seconds: float | None = None
    # A conversation message lives in the same kind of stream but is not a note; its session
    # and speaker (the index puts a turn in the context of the turns before it).
    is_message: bool = False
    # A recall (``MemoryRecalled``): the user's like a note, forgotten with the user, never changed.
    is_recall: bool = False
    session_id: str | None = None
    speaker: str | None = None
    retracted: bool = False
    # A deletion awaiting confirmation (requirements §1): until when, and how many requests so far.
    forget_expires_at: datetime | None = None
    forget_requests: int = 0
    # When what it says held in the world, and when the note was saved (a supersede closes the
    # old note's validity where the new one's begins: its valid_from, else this).
    valid_from: datetime | None = None
    valid_until: datetime | None = None
    saved_at: datetime | None = None
    # Every version of a note as it was (one per version, in order; a message has none): a
    # revert's source. Emptied when the note is forgotten.
    past: tuple[Snapshot, ...] = ()

    def at_version(self, version: int) -> Snapshot | None:
        return self.past[version - 1] if 1 <= version <= len(self.past) else None

    def snapshot(self) -> Snapshot:
        return Snapshot(
            version=self.version,
            status=self.status,
            superseded_by=self.superseded_by,
            key=self.key,
            **version_fields(self),
        )

    @property
    def forgotten(self) -> bool:
        return self.status is NoteStatus.FORGOTTEN

    @property
    def exists(self) -> bool:
        return self.version > 0


ABSENT = NoteState()

# What one version of a note holds, under the same names wherever a version is kept: the events
# that set it (``NoteSaved``, ``NoteReverted``, and ``NoteUpdated`` for the fields it gives), a
# note's state and its snapshots, the read model's views and history entries (where ``value`` is
# the JSON text parsed).
VERSION_FIELDS = ("content", "category", "subject", "confidence", "importance", "value", "valid_from", "valid_until")


def version_fields(source: Any, *, value: bool = True) -> dict[str, Any]:
    """``VERSION_FIELDS`` as ``source`` (an event, a state or a view) holds them, by name, to build
    or replace another with; ``value=False`` leaves the value out (only a keyed note has one that
    a revert gives back)."""
    return {name: getattr(source, name) for name in VERSION_FIELDS if value or name != "value"}


# What each change of a note sets, by the names a note's state and the read model's view of it
# share: both folds (``evolve`` here, ``projections/history_model.py``) build on these.


def saved_fields(event: events.NoteSaved) -> dict[str, Any]:
    return {
        "version": event.version,
        "status": NoteStatus.ACTIVE,
        "superseded_by": None,
        "key": event.key,
        "expires_at": event.expires_at,
        **version_fields(event),
    }


def updated_fields(event: events.NoteUpdated) -> dict[str, Any]:
    """The fields an update gives (those it leaves ``None`` keep their value), and its new expiry
    if it sets one or clears it."""
    fields = {name: given for name in VERSION_FIELDS if (given := getattr(event, name)) is not None}
    if event.expires_at is not None or event.expiry_cleared:
        fields["expires_at"] = event.expires_at
    return {"version": event.version, **fields}


def reverted_fields(event: events.NoteReverted, *, keyed: bool) -> dict[str, Any]:
    """What the version reverted to held (its value only for a keyed note); active again if the
    revert undid a supersede."""
    fields = {"version": event.version, **version_fields(event, value=keyed)}
    if event.reactivated:
        fields |= {"status": NoteStatus.ACTIVE, "superseded_by": None}
    return fields


def superseded_fields(event: events.NoteSuperseded, valid_until: datetime | None) -> dict[str, Any]:
    """``valid_until``: the note's before; a supersede that closes its validity ends it."""
    return {
        "version": event.version,
        "status": NoteStatus.SUPERSEDED,
        "superseded_by": event.superseded_by,
        "valid_until": valid_until if event.valid_until is None else event.valid_until,
    }


def evolve(state: NoteState, event: events.AnyEvent) -> NoteState:
    rule = _RULES.get(type(event))
    if rule is None:
        # Every event the log holds changes a note's state: one without a rule is a bug.
        raise TypeError(f"unknown event {type(event).__name__}")
    after = rule(state, event)
    if after.is_message or after.is_recall or after.status is None or after.forgotten:
        return after
    # Gapless versions: a note's snapshots are its versions in order.
    return msgspec.structs.replace(after, past=(*after.past, after.snapshot()))


def _saved(state: NoteState, event: events.NoteSaved) -> NoteState:
    return NoteState(ttl_seconds=event.ttl_seconds, saved_at=event.at, **saved_fields(event))


def _updated(state: NoteState, event: events.NoteUpdated) -> NoteState:
    fields = updated_fields(event)
    if "expires_at" in fields:  # and the time to live a renewal restarts
        fields["ttl_seconds"] = None if event.expires_at is None else event.ttl_seconds
    return msgspec.structs.replace(state, **fields)


def _reverted(state: NoteState, event: events.NoteReverted) -> NoteState:
    return msgspec.structs.replace(state, **reverted_fields(event, keyed=state.key is not None))


def _renewed(state: NoteState, event: events.NoteRenewed) -> NoteState:
    return msgspec.structs.replace(state, version=event.version, expires_at=event.expires_at)


def _superseded(state: NoteState, event: events.NoteSuperseded) -> NoteState:
    return msgspec.structs.replace(state, **superseded_fields(event, state.valid_until))


def _recorded(state: NoteState, event: events.MessageRecorded) -> NoteState:
    return NoteState(
        version=event.version,
        content=event.content,
        is_message=True,
        session_id=event.session_id,
        speaker=event.speaker,
    )


def _recalled(state: NoteState, event: events.MemoryRecalled) -> NoteState:
    # Its session: erasing a conversation erases what was recalled in it.
    session_id = event.origin.session_id if event.origin is not None else None
    return NoteState(version=event.version, status=NoteStatus.ACTIVE, is_recall=True, session_id=session_id)


def _retracted(state: NoteState, event: events.MessageRetracted) -> NoteState:
    return msgspec.structs.replace(state, version=event.version, retracted=True)


def _forget_requested(state: NoteState, event: events.ForgetRequested) -> NoteState:
    return msgspec.structs.replace(
        state, version=event.version, forget_expires_at=event.expires_at, forget_requests=event.request_count
    )


def _no_forget_pending(state: NoteState, event: events.AnyEvent) -> NoteState:
    # A request lapsed, or (on an account or session stream) the erasure is done: a new one
    # would start over.
    return msgspec.structs.replace(state, version=event.version, forget_expires_at=None, forget_requests=0)


def _forgotten(state: NoteState, event: events.NoteForgotten) -> NoteState:
    # The content was shredded with the key; nothing of it is kept.
    return NoteState(
        version=event.version,
        status=NoteStatus.FORGOTTEN,
        is_message=state.is_message,
        is_recall=state.is_recall,
        session_id=state.session_id,
    )


# One rule per event type: the state after it, given the state before.
_RULES: dict[type[events.AnyEvent], Callable[[NoteState, Any], NoteState]] = {
    events.NoteSaved: _saved,
    events.NoteUpdated: _updated,
    events.NoteReverted: _reverted,
    events.NoteRenewed: _renewed,
    events.NoteSuperseded: _superseded,
    events.MessageRecorded: _recorded,
    events.MemoryRecalled: _recalled,
    events.MessageRetracted: _retracted,
    events.ForgetRequested: _forget_requested,
    events.ForgetExpired: _no_forget_pending,
    events.UserForgotten: _no_forget_pending,
    events.SessionForgotten: _no_forget_pending,
    events.NoteForgotten: _forgotten,
}


def fold(changes: Iterable[events.AnyEvent], state: NoteState = ABSENT) -> NoteState:
    for event in changes:
        state = evolve(state, event)
    return state
