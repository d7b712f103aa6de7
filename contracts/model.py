"""The memory model shared by events, queries and replies."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

import msgspec

from engram_ledger.contracts.limits import Category, NoteId, ShortText, UnitInterval


class NoteKind(enum.StrEnum):
    """What sort of memory a note is."""

    FACT = "fact"
    EPISODE = "episode"
    PROCEDURE = "procedure"


class NoteSource(enum.StrEnum):
    """Whether the user asked for the note to be remembered or it was extracted from conversation."""

    EXPLICIT = "explicit"
    EXTRACTED = "extracted"


class NoteStatus(enum.StrEnum):
    """Lifecycle of a note. Superseded notes stay in history but leave default listings."""

    ACTIVE = "active"
    SUPERSEDED = "superseded"
    FORGOTTEN = "forgotten"


class Origin(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where a change came from: the channel (tui, whatsapp, api...) and the session or conversation."""

    channel: ShortText | None = None
    session_id: ShortText | None = None


class NoteView(msgspec.Struct, frozen=True, kw_only=True):
    """A note as the read model holds it: its current version and lifecycle."""

    id: NoteId
    user_id: str
    kind: NoteKind
    content: str
    category: Category
    subject: str | None
    confidence: UnitInterval
    source: NoteSource
    importance: UnitInterval
    created_at: datetime
    updated_at: datetime
    last_accessed_at: datetime | None
    version: int
    status: NoteStatus
    supersedes: list[str]
    superseded_by: str | None
    summary: str | None = None
    narrative: str | None = None
    occurred_at: datetime | None = None
    trigger: str | None = None
    action: str | None = None
    # An episode's facts (ids of the notes it gave rise to).
    links: list[str] = msgspec.field(default_factory=list)
    # How often a search or a read returned it (kept beside the read model, not in the log).
    access_count: int = 0
    # A note put by key (``PutNote``): its key, unique among the user's active notes of its
    # category, and the JSON object it holds (its content is the text of that value).
    key: str | None = None
    value: dict[str, Any] | None = None
    # A note put with a time to live: when it is forgotten unless renewed or put again.
    expires_at: datetime | None = None
    # When what it says held in the world, apart from when it was recorded (None: open).
    valid_from: datetime | None = None
    valid_until: datetime | None = None


class MessageView(msgspec.Struct, frozen=True, kw_only=True):
    """A recorded conversation turn (requirements §2): its session, who said it and when
    (``sent_at``: when it was said; ``created_at``: when it was recorded)."""

    id: str
    user_id: str
    session_id: str
    role: str
    content: str
    created_at: datetime
    speaker: str | None = None
    sent_at: datetime | None = None
    # The caller's own record of the turn (e.g. an agent framework's input item), kept whole.
    item: dict[str, Any] | None = None
    # 1 as recorded; 2 once retracted (RetractMessage), when the read model keeps only this
    # marker, no text, so that replaying the log out of order cannot bring the turn back.
    version: int = 1
    retracted: bool = False


class VersionView(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a note's history: the state the note had from this version on."""

    version: int
    change: str
    content: str
    category: str
    subject: str | None
    status: NoteStatus
    created_at: datetime
    command_id: str
    origin: Origin | None = None
    superseded_by: str | None = None
    # A keyed note's value at this version.
    value: dict[str, Any] | None = None
    # The log position of the change ('<ms>-<seq>'): a consistency token names a moment exactly
    # by it. None in histories recorded before positions were kept.
    position: str | None = None
    # The rest of the note as it was from this version on (None in histories recorded before
    # these were kept: the note's current values stand in).
    confidence: float | None = None
    importance: float | None = None
    expires_at: datetime | None = None
    # A revert: the version whose content and fields this one restored.
    reverted_to: int | None = None
    valid_from: datetime | None = None
    valid_until: datetime | None = None


class NoteChange(msgspec.Struct, frozen=True, kw_only=True):
    """One change of a note between two moments (``DiffNotes``): ``change`` is ``saved``,
    ``updated``, ``superseded``, ``reverted`` or ``forgotten``; ``before`` is the note as it was
    just before (None for a save), ``after`` as it was right after (None for a forget: its
    content is gone with its key)."""

    note_id: str
    change: str
    version: int
    at: datetime
    before: VersionView | None = None
    after: VersionView | None = None


class RecallView(msgspec.Struct, frozen=True, kw_only=True):
    """One recall: what a search or a memory block showed an agent (``MemoryRecalled``).
    ``query`` is None once a note it showed, or the user, was forgotten (its key is gone), or
    when it was recorded without one (``asked`` tells which)."""

    recall_id: str
    at: datetime
    kind: str
    notes: list[str]
    versions: list[int]
    channel: str | None = None
    session_id: str | None = None
    query: str | None = None
    # Whether it was asked with a query (a memory block may be built without one): with
    # ``query`` None, the query is gone.
    asked: bool = False
