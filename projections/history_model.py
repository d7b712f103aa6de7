"""The history read model's pure part: how an event changes a note's view and its history."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from engram_ledger.contracts import events
from engram_ledger.contracts.model import MessageView, NoteStatus, NoteView, VersionView
from engram_ledger.services.application.as_of import Listed, listed, position_value
from engram_ledger.services.domain.note import (
    reverted_fields,
    saved_fields,
    superseded_fields,
    updated_fields,
    version_fields,
)

# What a turn's view takes from its event as the event has it.
_AS_RECORDED = ("user_id", "session_id", "role", "content", "speaker", "sent_at")


def message_view(event: events.MessageRecorded) -> MessageView:
    """A conversation message as the read model shows it."""
    return MessageView(
        id=event.note_id,
        created_at=event.at,
        item=_object(event.item),
        **{name: getattr(event, name) for name in _AS_RECORDED},
    )


def retracted_view(event: events.MessageRetracted) -> MessageView:
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


def evolve_view(view: NoteView | None, event: events.AnyEvent) -> NoteView:
    """The note's view after ``event`` (``view``: before it; None: not saved yet)."""
    rule = _RULES.get(type(event))
    if rule is None:
        # The history shows every event a note's stream holds: one without a rule is a bug.
        raise TypeError(f"unknown event {type(event).__name__}")
    return rule.view(view, event)


# What a note's view takes from its save as the event has it (besides ``saved_fields``).
_AS_SAVED = ("user_id", "kind", "source", "summary", "narrative", "occurred_at", "trigger", "action")


def _saved_view(view: NoteView | None, event: events.NoteSaved) -> NoteView:
    return NoteView(
        id=event.note_id,
        **_parsed(saved_fields(event)),
        **{name: getattr(event, name) for name in _AS_SAVED},
        links=list(event.links),
        created_at=event.at,
        updated_at=event.at,
        last_accessed_at=None,
        # A supersede may have been applied to the replacement's view before; keep it.
        supersedes=view.supersedes if view is not None else [],
    )


def _parsed(fields: dict[str, Any]) -> dict[str, Any]:
    """Fields an event sets, as a view holds them: a value as the JSON object its text is."""
    return fields | {"value": _object(fields["value"])} if "value" in fields else fields


def _of_a_saved_note(change: Callable[[NoteView, Any], NoteView]) -> Callable[[NoteView | None, Any], NoteView]:
    """The rule of an event that changes a saved note: one for a note never saved is refused."""

    def rule(view: NoteView | None, event: events.AnyEvent) -> NoteView:
        if view is None:
            raise ValueError(f"{type(event).__name__} for unknown note {event.note_id}")
        return change(view, event)

    return rule


def _updated_view(view: NoteView, event: events.NoteUpdated) -> NoteView:
    return msgspec.structs.replace(view, updated_at=event.at, **_parsed(updated_fields(event)))


def _superseded_view(view: NoteView, event: events.NoteSuperseded) -> NoteView:
    return msgspec.structs.replace(view, updated_at=event.at, **superseded_fields(event, view.valid_until))


def _reverted_view(view: NoteView, event: events.NoteReverted) -> NoteView:
    reverted = reverted_fields(event, keyed=view.key is not None)
    return msgspec.structs.replace(view, updated_at=event.at, **_parsed(reverted))


def _renewed_view(view: NoteView, event: events.NoteRenewed) -> NoteView:
    return msgspec.structs.replace(view, version=event.version, expires_at=event.expires_at)


def _version_only(view: NoteView, event: events.AnyEvent) -> NoteView:
    # Pending deletions live in the forget saga's state; the note itself is unchanged.
    return msgspec.structs.replace(view, version=event.version)


def tombstone(view: NoteView, event: events.NoteForgotten) -> NoteView:
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


class _Rule(NamedTuple):
    """How the history takes one event type: its name in a note's history (``VersionView.change``),
    the note's view after it, given the one before (None: not saved yet), and whether it can
    change where, or whether, the note is in a listing (``relists``)."""

    change: str
    view: Callable[[NoteView | None, Any], NoteView]
    relists: Callable[[Any], bool] = lambda event: False


def _always(event: events.AnyEvent) -> bool:
    return True


def _update_relists(event: events.NoteUpdated) -> bool:
    return event.category is not None or event.expires_at is not None or event.expiry_cleared


# One row per event a note's own stream holds (messages, recalls and erasures have their own
# records: ``projections/history.py``).
_RULES: dict[type[events.AnyEvent], _Rule] = {
    events.NoteSaved: _Rule("saved", _saved_view, _always),
    events.NoteUpdated: _Rule("updated", _of_a_saved_note(_updated_view), _update_relists),
    events.NoteSuperseded: _Rule("superseded", _of_a_saved_note(_superseded_view), _always),
    events.NoteReverted: _Rule("reverted", _of_a_saved_note(_reverted_view), _always),
    events.NoteRenewed: _Rule("renewed", _of_a_saved_note(_renewed_view), _always),
    events.ForgetRequested: _Rule("forget_requested", _of_a_saved_note(_version_only)),
    events.ForgetExpired: _Rule("forget_expired", _of_a_saved_note(_version_only)),
    events.NoteForgotten: _Rule("forgotten", _of_a_saved_note(tombstone), _always),
}


def version_entry(view: NoteView, event: events.AnyEvent, position: str | None = None) -> VersionView:
    """The history's entry of the version ``event`` made, ``view`` being the note after it;
    ``position``: the event's place in the log."""
    return VersionView(
        version=event.version,
        change=_RULES[type(event)].change,
        status=view.status,
        created_at=event.at,
        command_id=event.command_id,
        origin=event.origin,
        superseded_by=view.superseded_by,
        position=position,
        expires_at=view.expires_at,
        reverted_to=event.to_version if isinstance(event, events.NoteReverted) else None,
        **version_fields(view),
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


def relists(event: events.AnyEvent) -> bool:
    """Whether an event can change where, or whether, its note is in a listing (its category,
    status, existence or expiry), unlike a change of its words alone."""
    rule = _RULES.get(type(event))
    return rule is not None and rule.relists(event)


def changed_score(event: events.AnyEvent, position: str) -> float:
    """When a note changed, for ``HistoryKeys.changed`` (milliseconds): the later of the event's
    time and its log position's, so a reading of a moment before either (by time or by token)
    finds the note among those changed since."""
    ms, _ = position.split("-")
    return float(max(int(event.at.timestamp() * 1000), int(ms)))


def recent_score(view: NoteView) -> float:
    return view.created_at.timestamp() * 1000
