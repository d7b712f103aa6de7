"""Commands: what a caller asks Engram to change. Each is answered with a reply from
``engram_ledger.contracts.queries`` (``NoteWritten``/``NotesWritten``) or an ``ErrorReply``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec

from engram_ledger.contracts.base import SCHEMA_VERSION, Message
from engram_ledger.contracts.limits import (
    DEFAULT_CATEGORY,
    MAX_BATCH_MESSAGES,
    MAX_BATCH_NOTES,
    MAX_FORGET_IDS,
    MAX_INDEX_FIELDS,
    MAX_QUERY_CHARS,
    MAX_TTL_SECONDS,
    NOT_BLANK,
    SEARCH_TOP_K_DEFAULT,
    SEARCH_TOP_K_MAX,
    AwareTime,
    Category,
    CommandId,
    Content,
    Key,
    LongText,
    NoteId,
    ShortText,
    Subject,
    Token,
    UnitInterval,
    UserId,
    Version,
)
from engram_ledger.contracts.model import NoteKind, NoteSource, Origin


class Command(Message, frozen=True, kw_only=True):
    """Fields every command carries."""

    command_id: CommandId
    user_id: UserId
    expected_version: Version | None = None
    origin: Origin | None = None


class NoteDraft(msgspec.Struct, frozen=True, kw_only=True):
    """The content of a new note. Episodes may carry summary, narrative, occurred_at and links
    (the ids of facts they gave rise to, requirements §5); procedures carry trigger and action."""

    content: Content
    kind: NoteKind = NoteKind.FACT
    category: Category = DEFAULT_CATEGORY
    subject: Subject | None = None
    confidence: UnitInterval = 1.0
    source: NoteSource = NoteSource.EXPLICIT
    importance: UnitInterval = 0.5
    summary: LongText | None = None
    narrative: LongText | None = None
    occurred_at: datetime | None = None
    trigger: LongText | None = None
    action: LongText | None = None
    links: Annotated[list[NoteId], msgspec.Meta(max_length=MAX_FORGET_IDS)] = msgspec.field(default_factory=list)
    # When what the note says held in the world (not when it was recorded): from ``valid_from``
    # (None: always had) until ``valid_until`` (None: still holds), the end excluded.
    valid_from: AwareTime | None = None
    valid_until: AwareTime | None = None


class SaveNote(NoteDraft, tag_field="type", tag="save_note", frozen=True, kw_only=True):
    """Save a new note. The reply names the note id (8 chars) and version 1.
    ``expected_version``, if given, must be 0 (the note does not exist yet)."""

    # Reply with the similar notes and hints (requirements §3-§5). It costs an embedding and a wait
    # for the index to catch up (tens of ms); bulk writers turn it off.
    advise: bool = True
    # msgspec allows one field-carrying base only, so the Command fields are repeated here.
    schema_version: int = SCHEMA_VERSION
    command_id: CommandId
    user_id: UserId
    expected_version: Version | None = None
    origin: Origin | None = None

    def draft(self) -> NoteDraft:
        """The note part of the command."""
        return NoteDraft(**{f: getattr(self, f) for f in NoteDraft.__struct_fields__})


class SaveNotes(Command, tag="save_notes", frozen=True, kw_only=True):
    """Save several notes at once (batch extraction). All are written atomically or none is."""

    notes: Annotated[list[NoteDraft], msgspec.Meta(min_length=1, max_length=MAX_BATCH_NOTES)]


class UpdateNote(Command, tag="update_note", frozen=True, kw_only=True):
    """Change an active note: a new version with the given fields changed. The note id stays the
    same. At least one field must be given. With ``expected_version`` the update is refused with
    ``VERSION_CONFLICT`` unless the note is at exactly that version."""

    note_id: NoteId
    content: Content | None = None
    category: Category | None = None
    subject: Subject | None = None
    confidence: UnitInterval | None = None
    importance: UnitInterval | None = None
    # When it held in the world (see ``NoteDraft``); None keeps what it had.
    valid_from: AwareTime | None = None
    valid_until: AwareTime | None = None


class SupersedeNote(Command, tag="supersede_note", frozen=True, kw_only=True):
    """Mark the active note ``note_id`` as outdated, replaced by the active note ``superseded_by``.
    The old note leaves default searches and listings; its history stays. ``expected_version``
    applies to the old note. Unless ``close_validity`` is false, what the old note says stops
    holding where the new one begins: its ``valid_until`` becomes the new note's ``valid_from``
    (or, without one, when the new note was saved), if it did not end earlier."""

    note_id: NoteId
    superseded_by: NoteId
    close_validity: bool = True


class RevertNote(Command, tag="revert_note", frozen=True, kw_only=True):
    """Undo as a new version: the note gets the content and fields it had at ``to_version``
    (``NoteReverted``); its history keeps every version. Reverting a superseded note to a
    version before its supersede brings it back to the active set; a supersede's own version is
    none to revert to, and the current version changes nothing. A forgotten note cannot be
    reverted (its content is gone with its key). ``expected_version``: the note's current
    version, else ``VERSION_CONFLICT``."""

    note_id: NoteId
    to_version: Annotated[int, msgspec.Meta(ge=1)]


class PutNote(Command, tag="put_note", frozen=True, kw_only=True):
    """Put a structured value under a caller-chosen ``key`` in ``category`` (an upsert, as a
    key-value store's put): the first put saves a note (``NoteSaved``, version 1), a later put
    of a different value updates it (``NoteUpdated``; its history keeps every version), the
    same value again changes nothing. The value is sealed like content and shredded when the
    note is forgotten. The text searched is the value's fields named by ``index`` (dotted
    paths, ``$`` for the whole value), the whole value by default. ``expected_version``: the
    note's version (0: the key must be free), else ``VERSION_CONFLICT``."""

    category: Category = DEFAULT_CATEGORY
    key: Key
    value: dict[str, Any]
    index: Annotated[list[ShortText], msgspec.Meta(min_length=1, max_length=MAX_INDEX_FIELDS)] | None = None
    # Forget the note this long after the put (or its last renewal, ``RenewNote``): the same
    # provable forget as any other (``NoteForgotten``, its data key destroyed), sent by the
    # service when the time comes. None: it never expires (a put without it clears an expiry).
    ttl_seconds: Annotated[float, msgspec.Meta(gt=0, le=MAX_TTL_SECONDS)] | None = None
    # When it held in the world (see ``NoteDraft``); on a later put, None keeps what it had.
    valid_from: AwareTime | None = None
    valid_until: AwareTime | None = None


class RenewNote(Command, tag="renew_note", frozen=True, kw_only=True):
    """Start a note's time to live again from now (a key-value store's refresh on read): it
    expires ``ttl_seconds`` (as last put) after this. A note without one is left as it is."""

    note_id: NoteId


class ExpireNote(Command, tag="expire_note", frozen=True, kw_only=True):
    """Sent by the service when a note's time to live has run out: the note is forgotten
    (``NoteForgotten``, reason ``expired``) unless it was renewed or put again meanwhile."""

    note_id: NoteId


Role = Annotated[str, msgspec.Meta(pattern="^(user|assistant|system|tool)$")]


class RecordMessage(Command, tag="record_message", frozen=True, kw_only=True):
    """Record one turn of a conversation, so that later searches (in this session, or across all
    of the user's conversations) can find what was said (requirements §2's ``include_conversation``).
    Messages are not notes: they are never listed, updated or superseded, and are searched only
    with ``include_conversation``. ``speaker``: who said it, by name (e.g. in a group chat);
    ``sent_at``: when it was said (a past time when importing; default: now)."""

    session_id: ShortText
    role: Role = "user"
    content: Content
    speaker: ShortText | None = None
    sent_at: AwareTime | None = None
    # The caller's own record of the turn (an agent framework's input item), kept whole and
    # sealed; ``content`` is its text, what searches match.
    item: dict[str, Any] | None = None


class MessageDraft(msgspec.Struct, frozen=True, kw_only=True):
    """One turn of a transcript to import with ``RecordMessages``."""

    role: Role = "user"
    content: Content
    speaker: ShortText | None = None
    sent_at: AwareTime | None = None
    item: dict[str, Any] | None = None


class RecordMessages(Command, tag="record_messages", frozen=True, kw_only=True):
    """Import up to 100 turns of one conversation at once (a transcript), in the order they were
    said; all are recorded atomically or none is. The reply (``NotesWritten``) lists the new
    message ids in the order given. Each turn is indexed with the turns before it in the same
    session as context, so a search for "what did she say about it?" can find it."""

    session_id: ShortText
    messages: Annotated[list[MessageDraft], msgspec.Meta(min_length=1, max_length=MAX_BATCH_MESSAGES)]


class RetractMessage(Command, tag="retract_message", frozen=True, kw_only=True):
    """Take back one recorded turn (an agent framework's "pop the last item"): it leaves the
    conversation's listing and searches (``MessageRetracted``); the log keeps it, as it keeps
    everything, until its session or user is forgotten. An unknown, retracted or forgotten
    message is ``MEMORY_NOT_FOUND``."""

    message_id: NoteId


class RequestForget(Command, tag="request_forget", frozen=True, kw_only=True):
    """Forget in two calls (requirements §1). With ``query``: answers candidates (ids, previews,
    similarity) and deletes nothing. With ``note_ids``: the first request for an id makes it
    pending and answers with a confirmation to relay; the same id requested again while pending
    (``ENGRAM_FORGET_TTL_SECONDS``, 300 s by default) deletes it for good. Each id is tracked on
    its own; an unknown or already deleted id is ``MEMORY_NOT_FOUND`` (with suggestions).
    ``confirmed`` executes at once: for operators (``engram forget --yes``), never for an LLM."""

    query: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_QUERY_CHARS, pattern=NOT_BLANK)] | None = None
    note_ids: Annotated[list[NoteId], msgspec.Meta(max_length=MAX_FORGET_IDS)] = msgspec.field(default_factory=list)
    top_k: Annotated[int, msgspec.Meta(ge=1, le=SEARCH_TOP_K_MAX)] = SEARCH_TOP_K_DEFAULT
    confirmed: bool = False
    # With a query: the caller's last write token, so the candidates include what it just saved.
    after: Token | None = None


class RequestForgetUser(Command, tag="request_forget_user", frozen=True, kw_only=True):
    """Erase all of one user's memory, with the same two calls as ``RequestForget``: the first
    asks for confirmation, the same request again within the TTL erases every note and message
    of the user (each data key destroyed) and answers with a receipt. ``confirmed`` executes at
    once (operators only)."""

    confirmed: bool = False


class RequestForgetSession(Command, tag="request_forget_session", frozen=True, kw_only=True):
    """Erase one conversation (every message of ``session_id``), in the same two calls as
    ``RequestForget``: the first asks for confirmation, the same request again within the TTL
    erases the messages (each data key destroyed) and answers with the erased ids.
    ``confirmed`` executes at once (operators only)."""

    session_id: ShortText
    confirmed: bool = False


class ExpireForget(Command, tag="expire_forget", frozen=True, kw_only=True):
    """Sent by the forget saga when a pending deletion's deadline has passed: the pending state
    lapses (``ForgetExpired``) unless it was confirmed or renewed meanwhile."""

    note_id: NoteId


AnyCommand = (
    SaveNote
    | SaveNotes
    | PutNote
    | UpdateNote
    | SupersedeNote
    | RevertNote
    | RecordMessage
    | RecordMessages
    | RetractMessage
    | RenewNote
    | ExpireNote
    | RequestForget
    | RequestForgetUser
    | RequestForgetSession
    | ExpireForget
)
