"""Events: what happened, past tense, immutable once in the log.

Every event carries ``event_id``, ``note_id``, ``user_id``, ``version`` (the note's version after
this event, gapless from 1), ``command_id`` (the command that caused it) and ``at`` (when).
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from engram_ledger.contracts.base import Message
from engram_ledger.contracts.model import NoteKind, NoteSource, Origin


class Event(Message, frozen=True, kw_only=True):
    """Fields every event carries."""

    event_id: str
    note_id: str
    user_id: str
    version: int
    command_id: str
    at: datetime
    origin: Origin | None = None


class NoteSaved(Event, tag="note_saved", frozen=True, kw_only=True):
    """A new note was saved (version 1)."""

    kind: NoteKind
    content: str
    category: str
    subject: str | None
    confidence: float
    source: NoteSource
    importance: float
    summary: str | None = None
    narrative: str | None = None
    occurred_at: datetime | None = None
    trigger: str | None = None
    action: str | None = None
    links: list[str] = msgspec.field(default_factory=list)
    # A note put by key (PutNote): the key, and the JSON text of its value (both sealed).
    key: str | None = None
    value: str | None = None
    # When it expires (a put with a time to live), and that time to live, for renewals.
    expires_at: datetime | None = None
    ttl_seconds: float | None = None
    # When what it says held in the world (None: open on that side).
    valid_from: datetime | None = None
    valid_until: datetime | None = None


class NoteUpdated(Event, tag="note_updated", frozen=True, kw_only=True):
    """An active note changed. Fields left ``None`` kept their previous value."""

    content: str | None = None
    category: str | None = None
    subject: str | None = None
    confidence: float | None = None
    importance: float | None = None
    # A keyed note's new value, as JSON text (sealed).
    value: str | None = None
    # A put's new expiry and time to live; ``expiry_cleared``: the put had none, so the note no
    # longer expires.
    expires_at: datetime | None = None
    ttl_seconds: float | None = None
    expiry_cleared: bool = False
    valid_from: datetime | None = None
    valid_until: datetime | None = None


class NoteReverted(Event, tag="note_reverted", frozen=True, kw_only=True):
    """A note was given back the content and fields it had at ``to_version`` (``RevertNote``):
    the fields below are its values from now on; ``status`` is ``active`` again if the revert
    undid a supersede."""

    to_version: int
    content: str
    category: str
    subject: str | None
    confidence: float
    importance: float
    # A keyed note's value at ``to_version``, as JSON text (sealed).
    value: str | None = None
    # Whether the note returns to the active set (it was superseded, and was not then), and
    # the note that had superseded it.
    reactivated: bool = False
    replaced_by: str | None = None
    # When it held in the world, as at ``to_version``.
    valid_from: datetime | None = None
    valid_until: datetime | None = None


class NoteRenewed(Event, tag="note_renewed", frozen=True, kw_only=True):
    """A note's time to live started again (``RenewNote``): it now expires at ``expires_at``."""

    expires_at: datetime


class NoteSuperseded(Event, tag="note_superseded", frozen=True, kw_only=True):
    """An active note was marked outdated, replaced by the note ``superseded_by``;
    ``valid_until``: what it says stopped holding then (None: its validity was left as it was)."""

    superseded_by: str
    valid_until: datetime | None = None


class MessageRecorded(Event, tag="message_recorded", frozen=True, kw_only=True):
    """A conversation turn was recorded (``note_id`` is the message's id, version 1).
    ``speaker``: who said it, by name, if given; ``sent_at``: when it was said, if not ``at``."""

    session_id: str
    role: str
    content: str
    speaker: str | None = None
    sent_at: datetime | None = None
    # The caller's own record of the turn, as JSON text (sealed).
    item: str | None = None


class MessageRetracted(Event, tag="message_retracted", frozen=True, kw_only=True):
    """A recorded turn was taken back: it leaves its conversation's listing and searches. Its
    content stays sealed in the log until its session or user is forgotten."""

    session_id: str


class MemoryRecalled(Event, tag="memory_recalled", frozen=True, kw_only=True):
    """What a search or a memory block showed (recorded where the deployment audits recalls):
    ``note_id`` is the recall's own id (``recall_id``), ``notes`` and ``versions`` what it
    showed, ``origin`` the channel and session that asked, ``named`` the notes not shown whose
    subject the query names. ``query`` is sealed under a key drawn from the recall's own data key
    and the data key of every note in ``notes`` then ``named``, so forgetting any of them, or the
    user, leaves it unreadable; None when the recall was taken without one, empty when it was
    asked but its text not kept (it showed nothing, or a note it names was already gone)."""

    kind: str
    notes: list[str] = msgspec.field(default_factory=list)
    versions: list[int] = msgspec.field(default_factory=list)
    query: str | None = None
    named: list[str] = msgspec.field(default_factory=list)


class ForgetRequested(Event, tag="forget_requested", frozen=True, kw_only=True):
    """Deletion of the note was requested and awaits confirmation (requirements §1): the same request
    again before ``expires_at`` deletes it. ``request_count``: requests since it became pending."""

    request_count: int
    expires_at: datetime


class ForgetExpired(Event, tag="forget_expired", frozen=True, kw_only=True):
    """A pending deletion lapsed unconfirmed; the note stays, and a new request asks again."""

    reason: str


class NoteForgotten(Event, tag="note_forgotten", frozen=True, kw_only=True):
    """The note was forgotten: its data key is destroyed, so the content in every earlier event
    can no longer be read; only this tombstone says it existed. Carries no content.
    ``reason``: ``expired`` when its time to live ran out (else a request or an erasure)."""

    request_count: int
    reason: str | None = None


class UserForgotten(Event, tag="user_forgotten", frozen=True, kw_only=True):
    """All of a user's memory was erased (every note and message forgotten, each key destroyed):
    the receipt. It lives on the user's account stream (``note_id`` is ``ACCOUNT``)."""

    erased: list[str]


class SessionForgotten(Event, tag="session_forgotten", frozen=True, kw_only=True):
    """Every message of one conversation was erased (each forgotten, its key destroyed): the
    receipt, on the session's control stream (``note_id`` is ``session_stream(session_id)``)."""

    session_id: str
    erased: list[str]


# The pseudo note id of a user's account stream: where a request to erase the whole user is
# pending (ForgetRequested / ForgetExpired with this note id) and where its receipt is kept.
ACCOUNT = "_account"


def session_stream(session_id: str) -> str:
    """The pseudo note id of a conversation's control stream, where a request to erase the
    session is pending and its receipt kept."""
    return f"_session:{session_id}"


RECALL_PREFIX = "recall-"


def is_recall(note_id: str) -> bool:
    """A recall's stream (``MemoryRecalled``): a stream of the user's like a note's, so an
    erasure of the user forgets it too, but never a note (note ids are 8 letters and digits)."""
    return note_id.startswith(RECALL_PREFIX)


def is_control_stream(note_id: str) -> bool:
    """Account and session streams hold requests and receipts, never a note (note ids are
    alphanumeric, so they never start with an underscore)."""
    return note_id.startswith("_")


AnyEvent = (
    NoteSaved
    | NoteUpdated
    | NoteSuperseded
    | NoteReverted
    | NoteRenewed
    | MessageRecorded
    | MessageRetracted
    | MemoryRecalled
    | ForgetRequested
    | ForgetExpired
    | NoteForgotten
    | UserForgotten
    | SessionForgotten
)
