"""The history read model's pure part: how an event changes a note's view and its history."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from engram_ledger.contracts.events import (
    AnyEvent,
    ForgetExpired,
    ForgetRequested,
    MessageRecorded,
    MessageRetracted,
    NoteForgotten,
    NoteRenewed,
    NoteReverted,
    NoteSaved,
    NoteSuperseded,
    NoteUpdated,
)
from engram_ledger.contracts.model import MessageView, NoteStatus, NoteView, VersionView
from engram_ledger.services.application.as_of import Listed, listed, position_value


def message_view(event: MessageRecorded) -> MessageView:
    """A conversation message as the read model shows it."""
    return MessageView(
        id=event.note_id,
        user_id=event.user_id,
        session_id=event.session_id,
        role=event.role,
        content=event.content,
        created_at=event.at,
        speaker=event.speaker,
        sent_at=event.sent_at,
        item=_object(event.item),
    )


def retracted_view(event: MessageRetracted) -> MessageView:
    """What the read model keeps of a retracted turn: that it was, and no text."""
    return MessageView(
        id=event.note_id,
        user_id=event.user_id,
        session_id=event.session_id,
        role="user",
        content="",
        created_at=event.at,
        version=event.version,
        retracted=True,
    )


def _object(text: str | None) -> dict[str, Any] | None:
    """A value or item kept as JSON text in the log (read back empty once shredded)."""
    return json.loads(text) if text else None


def evolve_view(view: NoteView | None, event: AnyEvent) -> NoteView:
    if isinstance(event, NoteSaved):
        return NoteView(
            id=event.note_id,
            user_id=event.user_id,
            kind=event.kind,
            content=event.content,
            category=event.category,
            subject=event.subject,
            confidence=event.confidence,
            source=event.source,
            importance=event.importance,
            created_at=event.at,
            updated_at=event.at,
            last_accessed_at=None,
            version=event.version,
            status=NoteStatus.ACTIVE,
            # A supersede may have been applied to the replacement's view before; keep it.
            supersedes=view.supersedes if view is not None else [],
            superseded_by=None,
            summary=event.summary,
            narrative=event.narrative,
            occurred_at=event.occurred_at,
            trigger=event.trigger,
            action=event.action,
            links=list(event.links),
            key=event.key,
            value=_object(event.value),
            expires_at=event.expires_at,
            valid_from=event.valid_from,
            valid_until=event.valid_until,
        )
    if view is None:
        raise ValueError(f"{type(event).__name__} for unknown note {event.note_id}")
    if isinstance(event, NoteUpdated):
        changes = {
            f: v
            for f in ("content", "category", "subject", "confidence", "importance", "valid_from", "valid_until")
            if (v := getattr(event, f)) is not None
        }
        if event.value is not None:
            changes["value"] = _object(event.value)
        if event.expires_at is not None or event.expiry_cleared:
            changes["expires_at"] = event.expires_at
        return msgspec.structs.replace(view, version=event.version, updated_at=event.at, **changes)
    if isinstance(event, NoteSuperseded):
        return msgspec.structs.replace(
            view,
            version=event.version,
            updated_at=event.at,
            status=NoteStatus.SUPERSEDED,
            superseded_by=event.superseded_by,
            valid_until=event.valid_until or view.valid_until,
        )
    if isinstance(event, NoteReverted):
        reverted: dict[str, Any] = {
            "content": event.content,
            "category": event.category,
            "subject": event.subject,
            "confidence": event.confidence,
            "importance": event.importance,
            "valid_from": event.valid_from,
            "valid_until": event.valid_until,
        }
        if view.key is not None:
            reverted["value"] = _object(event.value)
        if event.reactivated:
            reverted |= {"status": NoteStatus.ACTIVE, "superseded_by": None}
        return msgspec.structs.replace(view, version=event.version, updated_at=event.at, **reverted)
    if isinstance(event, NoteRenewed):
        return msgspec.structs.replace(view, version=event.version, expires_at=event.expires_at)
    if isinstance(event, ForgetRequested | ForgetExpired):
        # Pending deletions live in the forget saga's state; the note itself is unchanged.
        return msgspec.structs.replace(view, version=event.version)
    if isinstance(event, NoteForgotten):
        return tombstone(view, event)
    raise TypeError(f"unknown event {type(event).__name__}")


def tombstone(view: NoteView, event: NoteForgotten) -> NoteView:
    """What the history keeps of a forgotten note: its id, times and status; no content."""
    return msgspec.structs.replace(
        view,
        version=event.version,
        updated_at=event.at,
        status=NoteStatus.FORGOTTEN,
        content="",
        subject=None,
        summary=None,
        narrative=None,
        trigger=None,
        action=None,
        superseded_by=None,
        key=None,
        value=None,
        expires_at=None,
        valid_from=None,
        valid_until=None,
    )


def drop_supersedes(view: NoteView, old_note_id: str) -> NoteView:
    """The replacement no longer supersedes a note brought back by a revert."""
    if old_note_id not in view.supersedes:
        return view
    return msgspec.structs.replace(view, supersedes=[n for n in view.supersedes if n != old_note_id])


def add_supersedes(view: NoteView, old_note_id: str) -> NoteView:
    """The replacement note learns which note it supersedes (a set: applying twice is harmless)."""
    if old_note_id in view.supersedes:
        return view
    return msgspec.structs.replace(view, supersedes=sorted([*view.supersedes, old_note_id]))


CHANGE_NAMES = {
    NoteSaved: "saved",
    NoteUpdated: "updated",
    NoteSuperseded: "superseded",
    NoteReverted: "reverted",
    NoteRenewed: "renewed",
    ForgetRequested: "forget_requested",
    ForgetExpired: "forget_expired",
    NoteForgotten: "forgotten",
}


def version_entry(view: NoteView, event: AnyEvent, position: str | None = None) -> VersionView:
    """The history's entry of the version ``event`` made, ``view`` being the note after it;
    ``position``: the event's place in the log."""
    return VersionView(
        version=event.version,
        change=CHANGE_NAMES[type(event)],
        content=view.content,
        category=view.category,
        subject=view.subject,
        status=view.status,
        created_at=event.at,
        command_id=event.command_id,
        origin=event.origin,
        superseded_by=view.superseded_by,
        value=view.value,
        position=position,
        confidence=view.confidence,
        importance=view.importance,
        expires_at=view.expires_at,
        reverted_to=event.to_version if isinstance(event, NoteReverted) else None,
        valid_from=view.valid_from,
        valid_until=view.valid_until,
    )


def keyed_field(category: str, digest: str) -> str:
    """A keyed note's field in its user's key lookup (GetNoteByKey): its category, then the
    keyed hash of its key (``KeyedFields``). Read models written before keys were hashed have
    the key itself there."""
    return f"{category}\x00{digest}"


def said_score(position: str) -> float:
    """A turn's place in its conversation: its log position (milliseconds, then sequence) as
    one float that keeps its precision until the year 2255 (sequence numbers past 999 in one
    millisecond of one partition's log aside)."""
    return position_value(position)


def order_member(view: NoteView) -> bytes:
    """Lexicographic member of the listing index: category, then created_at (ms, zero-padded),
    then id. Sorting these bytes is the deterministic order requirements §3 needs for prompt caching."""
    return place_member(listed(view))


def place_member(place: Listed) -> bytes:
    """A place in a listing as the listing index holds it (``order_member``)."""
    return f"{place.category}\x00{place.created_ms:015d}\x00{place.note_id}".encode()


def relists(event: AnyEvent) -> bool:
    """Whether an event can change where, or whether, its note is in a listing (its category,
    status, existence or expiry), unlike a change of its words alone."""
    if isinstance(event, NoteSaved | NoteSuperseded | NoteReverted | NoteForgotten | NoteRenewed):
        return True
    return isinstance(event, NoteUpdated) and (
        event.category is not None or event.expires_at is not None or event.expiry_cleared
    )


def changed_score(event: AnyEvent, position: str) -> float:
    """When a note changed, for ``HistoryKeys.changed`` (milliseconds): the later of the event's
    time and its log position's, so a reading of a moment before either (by time or by token)
    finds the note among those changed since."""
    ms, _ = position.split("-")
    return float(max(int(event.at.timestamp() * 1000), int(ms)))


def recent_score(view: NoteView) -> float:
    return view.created_at.timestamp() * 1000
