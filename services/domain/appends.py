"""What every decision is made of: the append of events to one note's stream
(``StreamAppend``), the claims that keep an active note's text (or key) unique per user, the
fields every event carries, and the checks every rule makes."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

import msgspec

from engram_ledger.contracts.commands import (
    AnyCommand,
)
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import (
    AnyEvent,
    ForgetExpired,
)
from engram_ledger.contracts.model import NoteStatus
from engram_ledger.services.domain.ids import event_id
from engram_ledger.services.domain.note import NoteState
from engram_ledger.services.domain.values import UNPRINTABLE, key_claim


class StreamAppend(msgspec.Struct, frozen=True, kw_only=True):
    """Append ``events`` to one note's stream if it is still at ``expected_version``. An append
    with no events only checks the version (the other note of a supersede)."""

    note_id: str
    expected_version: int
    events: list[AnyEvent]
    # Content digests this note takes or gives up: an active note's content is unique per user.
    claims: list[str] = msgspec.field(default_factory=list)
    releases: list[str] = msgspec.field(default_factory=list)
    # Destroy the note's data key with this append (crypto-shredding: the note is forgotten).
    shred: bool = False


def content_digest(content: str) -> str:
    """Case- and whitespace-insensitive identity of a text (requirements §5's duplicate detection)."""
    normal = " ".join(content.casefold().split())
    return hashlib.blake2b(normal.encode(), digest_size=16).hexdigest()


def identity_claim(state: NoteState) -> str:
    """What an active note holds in its user's memory: its key (a note put by key), else its
    content, which no other active note may hold."""
    return key_claim(state.category, state.key) if state.key is not None else content_digest(state.content)


def event_header(command: AnyCommand, note_id: str, version: int, now: datetime) -> dict[str, Any]:
    """The fields every event carries, for an event at ``version`` of ``note_id``."""
    return {
        "event_id": event_id(command.user_id, note_id, version),
        "note_id": note_id,
        "user_id": command.user_id,
        "version": version,
        "command_id": command.command_id,
        "at": now,
        "origin": command.origin,
    }


def lapse_if_due(
    command: AnyCommand, note_id: str, state: NoteState, now: datetime
) -> tuple[int, list[AnyEvent], bool]:
    """A pending deletion past its deadline lapses first (``ForgetExpired``). Returns the
    version after that, the events so far, and whether a deletion is still pending."""
    if state.forget_expires_at is None:
        return state.version, [], False
    if state.forget_expires_at > now:
        return state.version, [], True
    return (
        state.version + 1,
        [forget_expired(command, note_id, state.version + 1, now, "not confirmed in time")],
        False,
    )


def forget_expired(command: AnyCommand, note_id: str, version: int, now: datetime, reason: str) -> ForgetExpired:
    return ForgetExpired(reason=reason, **event_header(command, note_id, version, now))


def require_active(note_id: str, state: NoteState) -> None:
    if not state.exists or state.is_message or state.is_recall or state.status is NoteStatus.FORGOTTEN:
        raise EngramError(ErrorCode.MEMORY_NOT_FOUND, f"Memory with ID {note_id} not found")
    if state.status is NoteStatus.SUPERSEDED:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"Memory {note_id} is superseded by {state.superseded_by}; change {state.superseded_by} instead",
        )


def check_version(note_id: str, expected: int | None, state: NoteState) -> None:
    if expected is not None and expected != state.version:
        raise EngramError(
            ErrorCode.VERSION_CONFLICT,
            f"Memory {note_id} is at version {state.version}, not the expected {expected}; read it again and retry",
        )


def expect_new(expected: int | None) -> None:
    if expected not in (None, 0):
        raise EngramError(ErrorCode.INVALID_PARAMETER, "expected_version of a new note can only be 0")


_FORBIDDEN = UNPRINTABLE


def check_text(field: str, value: str | None) -> None:
    """Refuse what would corrupt storage or prompts: blank text (the contracts refuse it on the
    wire; a command built in process is checked here too), NUL and other control characters, and
    lone surrogates (not encodable as UTF-8)."""
    if value is None:
        return
    if not value.strip():
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{field} must not be blank")
    found = _FORBIDDEN.search(value)
    if found:
        ch = found.group()
        what = "an unpaired surrogate" if "\ud800" <= ch <= "\udfff" else "a control character"
        raise EngramError(
            ErrorCode.INVALID_PARAMETER, f"{field} contains {what} (U+{ord(ch):04X}) at position {found.start()}"
        )
