"""Queries (request/reply over the bus) and every reply Engram sends.

A query may carry ``after``, the consistency token a command returned: the responder waits
(bounded) until the read model has applied that log position, so the caller reads its own writes.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from contracts.base import Message
from contracts.errors import ErrorReply
from contracts.limits import (
    LIST_RECENT_DEFAULT,
    LIST_RECENT_MAX,
    Category,
    NoteId,
    Token,
    UserId,
)
from contracts.model import NoteView, VersionView


class Query(Message, frozen=True, kw_only=True):
    """Fields every query carries."""

    user_id: UserId
    after: Token | None = None


class GetNote(Query, tag="get_note", frozen=True, kw_only=True):
    """One note, in its current version (superseded notes included)."""

    note_id: NoteId


class GetHistory(Query, tag="get_history", frozen=True, kw_only=True):
    """Every version of one note, oldest first."""

    note_id: NoteId


class ListNotes(Query, tag="list_notes", frozen=True, kw_only=True):
    """The user's notes in a deterministic order: category, then created_at, then id (stable
    across calls for the same memory state, so a prompt built from it can be cached)."""

    category: Category | None = None
    include_superseded: bool = False


class ListRecent(Query, tag="list_recent", frozen=True, kw_only=True):
    """The user's most recently created active notes, newest first."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=LIST_RECENT_MAX)] = LIST_RECENT_DEFAULT


AnyQuery = GetNote | GetHistory | ListNotes | ListRecent


class WrittenNote(msgspec.Struct, frozen=True, kw_only=True):
    """A note a command wrote and the version it is at now."""

    note_id: str
    version: int


class NoteWritten(Message, tag="note_written", frozen=True, kw_only=True):
    """A command on one note was applied (or had been: ``replayed`` is true when the same
    ``command_id`` was seen before and this is the first outcome again). ``token`` is the
    consistency token to pass as ``after`` to read this write."""

    note_id: str
    version: int
    token: str
    replayed: bool = False
    superseded_by: str | None = None


class NotesWritten(Message, tag="notes_written", frozen=True, kw_only=True):
    """A batch save was applied; notes in the order they were given."""

    notes: list[WrittenNote]
    token: str
    replayed: bool = False


class NoteReply(Message, tag="note", frozen=True, kw_only=True):
    """Answer to ``GetNote``."""

    note: NoteView


class HistoryReply(Message, tag="history", frozen=True, kw_only=True):
    """Answer to ``GetHistory``."""

    note_id: str
    status: str
    versions: list[VersionView]


class NotesReply(Message, tag="notes", frozen=True, kw_only=True):
    """Answer to ``ListNotes`` and ``ListRecent``."""

    notes: list[NoteView]
    total: int


CommandReply = NoteWritten | NotesWritten | ErrorReply
QueryReply = NoteReply | HistoryReply | NotesReply | ErrorReply
AnyReply = NoteWritten | NotesWritten | NoteReply | HistoryReply | NotesReply | ErrorReply
