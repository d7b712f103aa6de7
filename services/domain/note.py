"""A note's state as the decider sees it: a left fold over the note's own events."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import msgspec

from engram_ledger.contracts.events import (
    AnyEvent,
    ForgetExpired,
    ForgetRequested,
    MemoryRecalled,
    MessageRecorded,
    MessageRetracted,
    NoteForgotten,
    NoteRenewed,
    NoteReverted,
    NoteSaved,
    NoteSuperseded,
    NoteUpdated,
    SessionForgotten,
    UserForgotten,
)
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
            content=self.content,
            category=self.category,
            subject=self.subject,
            confidence=self.confidence,
            importance=self.importance,
            superseded_by=self.superseded_by,
            key=self.key,
            value=self.value,
            valid_from=self.valid_from,
            valid_until=self.valid_until,
        )

    @property
    def forgotten(self) -> bool:
        return self.status is NoteStatus.FORGOTTEN

    @property
    def exists(self) -> bool:
        return self.version > 0


ABSENT = NoteState()


def evolve(state: NoteState, event: AnyEvent) -> NoteState:
    after = _evolve(state, event)
    if after.is_message or after.is_recall or after.status is None or after.forgotten:
        return after
    # Gapless versions: a note's snapshots are its versions in order.
    return msgspec.structs.replace(after, past=(*after.past, after.snapshot()))


def _evolve(state: NoteState, event: AnyEvent) -> NoteState:
    if isinstance(event, NoteSaved):
        return NoteState(
            version=event.version,
            status=NoteStatus.ACTIVE,
            content=event.content,
            category=event.category,
            subject=event.subject,
            confidence=event.confidence,
            importance=event.importance,
            key=event.key,
            value=event.value,
            expires_at=event.expires_at,
            ttl_seconds=event.ttl_seconds,
            valid_from=event.valid_from,
            valid_until=event.valid_until,
            saved_at=event.at,
        )
    if isinstance(event, NoteUpdated):
        expiry: dict[str, Any] = {"expires_at": None, "ttl_seconds": None} if event.expiry_cleared else {}
        if event.expires_at is not None:
            expiry = {"expires_at": event.expires_at, "ttl_seconds": event.ttl_seconds}
        return msgspec.structs.replace(
            state,
            version=event.version,
            content=_keep(event.content, state.content),
            category=_keep(event.category, state.category),
            subject=_keep(event.subject, state.subject),
            confidence=_keep(event.confidence, state.confidence),
            importance=_keep(event.importance, state.importance),
            value=_keep(event.value, state.value),
            valid_from=_keep(event.valid_from, state.valid_from),
            valid_until=_keep(event.valid_until, state.valid_until),
            **expiry,
        )
    if isinstance(event, NoteReverted):
        return msgspec.structs.replace(
            state,
            version=event.version,
            status=NoteStatus.ACTIVE if event.reactivated else state.status,
            superseded_by=None if event.reactivated else state.superseded_by,
            content=event.content,
            category=event.category,
            subject=event.subject,
            confidence=event.confidence,
            importance=event.importance,
            value=event.value if state.key is not None else state.value,
            valid_from=event.valid_from,
            valid_until=event.valid_until,
        )
    if isinstance(event, NoteRenewed):
        return msgspec.structs.replace(state, version=event.version, expires_at=event.expires_at)
    if isinstance(event, NoteSuperseded):
        return msgspec.structs.replace(
            state,
            version=event.version,
            status=NoteStatus.SUPERSEDED,
            superseded_by=event.superseded_by,
            valid_until=_keep(event.valid_until, state.valid_until),
        )
    if isinstance(event, MessageRecorded):
        return NoteState(
            version=event.version,
            content=event.content,
            is_message=True,
            session_id=event.session_id,
            speaker=event.speaker,
        )
    if isinstance(event, MemoryRecalled):
        # Its session: erasing a conversation erases what was recalled in it.
        session_id = event.origin.session_id if event.origin is not None else None
        return NoteState(version=event.version, status=NoteStatus.ACTIVE, is_recall=True, session_id=session_id)
    if isinstance(event, MessageRetracted):
        return msgspec.structs.replace(state, version=event.version, retracted=True)
    if isinstance(event, ForgetRequested):
        return msgspec.structs.replace(
            state, version=event.version, forget_expires_at=event.expires_at, forget_requests=event.request_count
        )
    if isinstance(event, ForgetExpired):
        return msgspec.structs.replace(state, version=event.version, forget_expires_at=None, forget_requests=0)
    if isinstance(event, UserForgotten | SessionForgotten):
        # The account stream: the erasure is done, and a new one would start over.
        return msgspec.structs.replace(state, version=event.version, forget_expires_at=None, forget_requests=0)
    if isinstance(event, NoteForgotten):
        # The content was shredded with the key; nothing of it is kept.
        return NoteState(
            version=event.version,
            status=NoteStatus.FORGOTTEN,
            is_message=state.is_message,
            is_recall=state.is_recall,
            session_id=state.session_id,
        )
    raise TypeError(f"unknown event {type(event).__name__}")


def fold(events: Iterable[AnyEvent], state: NoteState = ABSENT) -> NoteState:
    for event in events:
        state = evolve(state, event)
    return state


def _keep(new, old):  # type: ignore[no-untyped-def]
    return old if new is None else new
