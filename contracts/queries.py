"""Queries (request/reply over the bus) and every reply Engram sends.

A query may carry ``after``, the consistency token a command returned: the responder waits
(bounded) until the read model has applied that log position, so the caller reads its own writes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from engram_ledger.contracts.base import Message
from engram_ledger.contracts.errors import ErrorReply
from engram_ledger.contracts.limits import (
    LIST_NOTES_MAX,
    LIST_RECENT_DEFAULT,
    LIST_RECENT_MAX,
    MAX_CONTEXT_TOKENS,
    MAX_QUERY_CHARS,
    NOT_BLANK,
    SEARCH_DEPTH_MAX,
    SEARCH_TOP_K_DEFAULT,
    SEARCH_TOP_K_MAX,
    AsOf,
    AwareTime,
    Category,
    Key,
    NoteId,
    ShortText,
    Subject,
    Token,
    UnitInterval,
    UserId,
)
from engram_ledger.contracts.model import (
    MessageView,
    NoteChange,
    NoteKind,
    NoteView,
    Origin,
    RecallView,
    VersionView,
)


class Query(Message, frozen=True, kw_only=True):
    """Fields every query carries. ``origin``: the channel and session asking (a search or a
    memory block recorded as a recall names them)."""

    user_id: UserId
    after: Token | None = None
    origin: Origin | None = None


class GetNote(Query, tag="get_note", frozen=True, kw_only=True):
    """One note, in its current version (superseded notes included). With ``as_of``: the note
    as it was at that moment (``MEMORY_NOT_FOUND`` if it was saved later); a note forgotten
    since is its tombstone, never its old content."""

    note_id: NoteId
    as_of: AsOf | None = None


class GetNoteByKey(Query, tag="get_note_by_key", frozen=True, kw_only=True):
    """The active note put under ``key`` in ``category`` (``PutNote``); ``MEMORY_NOT_FOUND``
    if there is none (never put, superseded or forgotten)."""

    category: Category
    key: Key


# A filter on a keyed note's value (LangGraph's ``filter``): {"field": value} is equality,
# {"field": {"$eq"|"$ne"|"$gt"|"$gte"|"$lt"|"$lte": value}} compares; every condition must hold.
# A dotted field ("a.b") reads nested objects. A missing field (a note without a value has
# none) satisfies "$ne" and equality with null only, as in LangGraph's stores.
Where = Annotated[dict[str, Any], msgspec.Meta(max_length=20)]


class GetHistory(Query, tag="get_history", frozen=True, kw_only=True):
    """Every version of one note, oldest first."""

    note_id: NoteId


class ListNotes(Query, tag="list_notes", frozen=True, kw_only=True):
    """The user's notes in a deterministic order: category, then created_at, then id (stable
    across calls for the same memory state, so a prompt built from it can be cached)."""

    category: Category | None = None
    # A category and every category under it ("memories" also lists "memories/alice").
    category_prefix: Category | None = None
    include_superseded: bool = False
    where: Where | None = None
    # Only notes put by key (a key-value store's items), not those saved as text.
    keyed_only: bool = False
    # A page of the listing; ``total`` in the reply counts every note that matched. Without
    # ``limit`` the page holds LIST_NOTES_MAX notes at most: a listing is never unbounded.
    offset: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=LIST_NOTES_MAX)] | None = None
    # What the memory held at that moment: the notes active then (superseded then, with
    # ``include_superseded``), each as it was then, in the same order; notes saved later are
    # absent; a note forgotten since, listed then, is its tombstone (status ``forgotten``).
    as_of: AsOf | None = None
    # Only notes whose content held in the world at that time (``valid_from``/``valid_until``;
    # a note without them always holds), superseded ones included: what held then may have
    # been superseded since.
    valid_at: AwareTime | None = None


class DiffNotes(Query, tag="diff_notes", frozen=True, kw_only=True):
    """What changed in the user's notes between two moments, oldest first: each save, update
    (before and after), supersede, revert and forget after ``since`` and at or before ``until``
    (None: now). At most ``limit`` changes; ``truncated`` in the reply says more followed."""

    since: AsOf
    until: AsOf | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=LIST_NOTES_MAX)] = 200


class ListRecalls(Query, tag="list_recalls", frozen=True, kw_only=True):
    """What searches and memory blocks showed the user's agents (where recalls are audited),
    newest first: after ``since`` and up to ``until`` (None: open), of one ``session_id`` if
    given, at most ``limit``."""

    since: AwareTime | None = None
    until: AwareTime | None = None
    session_id: ShortText | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=LIST_NOTES_MAX)] = 50


class ListCategories(Query, tag="list_categories", frozen=True, kw_only=True):
    """The categories holding at least one of the user's active notes, sorted; with ``prefix``
    only that category and those under it (a LangGraph store's ``list_namespaces``)."""

    prefix: Category | None = None
    # Only categories holding a note put by key.
    keyed_only: bool = False


class ListMessages(Query, tag="list_messages", frozen=True, kw_only=True):
    """One conversation's recorded turns, oldest first (retracted and forgotten turns left
    out); with ``limit``, its latest ``limit`` turns. An unknown session has none."""

    session_id: ShortText
    limit: Annotated[int, msgspec.Meta(ge=1, le=LIST_NOTES_MAX)] | None = None


class ListRecent(Query, tag="list_recent", frozen=True, kw_only=True):
    """The user's most recently created active notes, newest first."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=LIST_RECENT_MAX)] = LIST_RECENT_DEFAULT


class SearchNotes(Query, tag="search_notes", frozen=True, kw_only=True):
    """Hybrid search (dense MiniLM + BM25, each scaled over its candidates, then a weighted sum)
    over the user's notes and, with ``include_conversation``, conversation turns; best first,
    one result per note or turn (long ones are searched by chunk, turns also in the context of
    the turns before them). Superseded notes are left out unless ``include_superseded``. With
    ``after``, waits until the index has the caller's writes."""

    query: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_QUERY_CHARS, pattern=NOT_BLANK)]
    top_k: Annotated[int, msgspec.Meta(ge=1, le=SEARCH_TOP_K_MAX)] = SEARCH_TOP_K_DEFAULT
    # Skip the best ``offset`` results (a page further down); offset + top_k is at most 100.
    offset: Annotated[int, msgspec.Meta(ge=0, le=SEARCH_DEPTH_MAX)] = 0
    category: Category | None = None
    # A category and every category under it.
    category_prefix: Category | None = None
    # Keyed notes whose value passes this filter (see ``Where``).
    where: Where | None = None
    # Only notes put by key.
    keyed_only: bool = False
    kind: NoteKind | None = None
    subject: Subject | None = None
    include_superseded: bool = False
    # Also search conversations (RecordMessage/RecordMessages): with session_id that session
    # only, without it every conversation the user has had.
    include_conversation: bool = False
    session_id: ShortText | None = None
    # Only what happened within this time: a message's sent_at, a note's occurred_at, else when
    # it was saved (inclusive bounds, either may be left open).
    since: AwareTime | None = None
    until: AwareTime | None = None
    # "blended": relevance mixed with recency (of update or last access) and importance, weights
    # ENGRAM_RANKING_WEIGHTS; "relevance" (the default) is the plain fused score.
    ranking: Literal["relevance", "blended"] = "relevance"
    # Hits whose ``relevance`` is below this are not returned; None: the service's floor
    # (``ENGRAM_MIN_RELEVANCE``); 0: every hit, ranked as by ``ranking``. A search with nothing
    # above the floor has no results: nothing the user's memory holds matched. A query that asks
    # about a time and nothing else ("what did I do in May 2023?") keeps what happened then.
    min_relevance: UnitInterval | None = None
    # Search the memory as it was at that moment: the versions current then are ranked, each
    # with its text then (notes saved later are absent; a note forgotten since is never found).
    # Times the query names ("last week") are read from that moment.
    as_of: AsOf | None = None
    # Only notes whose content held in the world at that time (see ``ListNotes.valid_at``,
    # superseded ones included). A query naming a time ("where did Tess work in 2022?") also
    # ranks first the notes that held then, superseded or not.
    valid_at: AwareTime | None = None


class BuildContext(Query, tag="build_context", frozen=True, kw_only=True):
    """The user's memory as a block for a system prompt: ``markdown`` (requirements §3: grouped by
    category, ``- [id:xxxxxxxx] [subject] content``) or ``xml`` (requirements §5: ``<user_memory>``
    with the profile and the facts as plain sentences, procedures as rules, and, given a
    ``query``, the most relevant episodes). The same memory state renders to the same bytes.
    With ``max_tokens`` (MiniLM word pieces) the most relevant to ``query`` and most important
    notes are kept, and the block never exceeds it; a budget smaller than the block's frame is
    ``INVALID_PARAMETER``, naming the smallest that works. Episodes are only ever retrieved by
    relevance."""

    format: Literal["markdown", "xml"] = "markdown"
    query: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_QUERY_CHARS, pattern=NOT_BLANK)] | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_CONTEXT_TOKENS)] | None = None
    # With ``query``: notes and episodes count as relevant only at or above this floor (as
    # ``SearchNotes.min_relevance``; None: the service's floor).
    min_relevance: UnitInterval | None = None
    # The markdown block tells the agent to change a memory with this tool (requirements §3's
    # ``update_memory``); None: an agent without such a tool, and the block does not mention one.
    update_tool: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] | None = "update_memory"
    # The block as the memory was at that moment (notes as they were then; with ``query``, its
    # episodes searched as of then too).
    as_of: AsOf | None = None


AnyQuery = (
    GetNote
    | GetNoteByKey
    | GetHistory
    | ListNotes
    | ListRecent
    | ListCategories
    | ListMessages
    | SearchNotes
    | BuildContext
    | DiffNotes
    | ListRecalls
)


class WrittenNote(msgspec.Struct, frozen=True, kw_only=True):
    """A note a command wrote and the version it is at now. ``duplicate``: the text was already
    held by this (existing, active) note, so no new note was made (requirements §5)."""

    note_id: str
    version: int
    duplicate: bool = False


class SimilarNote(msgspec.Struct, frozen=True, kw_only=True):
    """An active note close in meaning to one just saved: it may be outdated by it (requirements §4)."""

    note_id: str
    content: str
    similarity: float
    category: str
    subject: str | None
    confidence: float
    source: str
    created_at: datetime


class NoteWritten(Message, tag="note_written", frozen=True, kw_only=True):
    """A command on one note was applied (or had been: ``replayed`` is true when the same
    ``command_id`` was seen before and this is the first outcome again). ``token`` is the
    consistency token to pass as ``after`` to read this write."""

    note_id: str
    version: int
    token: str
    replayed: bool = False
    superseded_by: str | None = None
    # SaveNote only. duplicate: the same text (case and spacing aside) is already this active
    # note, and no new note was made. similar: active notes close in meaning (cosine at least
    # ENGRAM_SIMILAR_THRESHOLD). same_subject: active notes about the same subject (requirements §3).
    # action_required: what the caller should consider doing about them.
    duplicate: bool = False
    similar: list[SimilarNote] = msgspec.field(default_factory=list)
    same_subject: list[str] = msgspec.field(default_factory=list)
    action_required: str | None = None


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


class DiffReply(Message, tag="diff", frozen=True, kw_only=True):
    """Answer to ``DiffNotes``: the changes in the order they happened."""

    changes: list[NoteChange]
    truncated: bool = False


class RecallsReply(Message, tag="recalls", frozen=True, kw_only=True):
    """Answer to ``ListRecalls``, newest first."""

    recalls: list[RecallView]


class CategoriesReply(Message, tag="categories", frozen=True, kw_only=True):
    """Answer to ``ListCategories``."""

    categories: list[str]


class MessagesReply(Message, tag="messages", frozen=True, kw_only=True):
    """Answer to ``ListMessages``: the turns oldest first, and how many the session holds."""

    messages: list[MessageView]
    total: int


class SearchHit(msgspec.Struct, frozen=True, kw_only=True):
    """One note (``found_in: memory``) or conversation message (``found_in: conversation``)
    found by a search. (Until schema version 2 of ``SearchReply`` this field was ``source``, a
    name a note's own ``source``, its provenance, also has.) ``score`` is the fused score that
    orders results (see ``services/application/ranking.py``); ``similarity`` the cosine of the
    query and the best chunk; ``keyword`` the keyword (BM25) score of its best chunk, 0 when
    none of the query's words is in it: the two parts the fusion weighs, for a person asking why
    a note was or was not found. A conversation hit's ``message`` says its session, speaker and
    time. ``relevance`` (schema version 3) is an estimate in [0, 1] that the hit is what the
    query asks for, comparable across queries, unlike ``score``: ``SearchNotes.min_relevance``
    filters on it."""

    note_id: str
    content: str
    score: float
    similarity: float
    found_in: Literal["memory", "conversation"]
    note: NoteView | None = None
    message: MessageView | None = None
    keyword: float = 0.0
    relevance: float = 0.0


class SearchReply(Message, tag="search_results", frozen=True, kw_only=True):
    """Answer to ``SearchNotes``, best first; empty when nothing is above the floor. Schema
    version 2: a hit says where it was found in ``found_in`` (version 1 called it ``source``);
    version 3: each hit carries ``relevance``."""

    schema_version: int = 3

    results: list[SearchHit]


class ForgetCandidate(msgspec.Struct, frozen=True, kw_only=True):
    """A note a forget query found: nothing is deleted until it is requested by id, twice."""

    note_id: str
    preview: str
    similarity: float


class PendingForget(msgspec.Struct, frozen=True, kw_only=True):
    """A deletion awaiting confirmation: requesting ``note_id`` again before ``expires_at``
    deletes it. ``request_count`` counts the requests since it became pending."""

    note_id: str
    preview: str
    request_count: int
    expires_at: datetime


class ForgetReply(Message, tag="forget", frozen=True, kw_only=True):
    """The answer to ``RequestForget`` (requirements §1). ``status``: ``candidates`` (a query found
    these notes; nothing was deleted), ``confirmation_required`` (some requested notes are now
    pending: ``pending``), or ``forgotten`` (every requested note was deleted: ``forgotten``).
    ``message`` says it in words for an LLM to relay (the tools' text); ``withdrawn``: notes whose
    pending deletion this request withdrew (a request for other notes replaces it)."""

    status: Literal["candidates", "confirmation_required", "forgotten"]
    message: str
    candidates: list[ForgetCandidate] = msgspec.field(default_factory=list)
    pending: list[PendingForget] = msgspec.field(default_factory=list)
    forgotten: list[str] = msgspec.field(default_factory=list)
    withdrawn: list[str] = msgspec.field(default_factory=list)
    token: str | None = None
    replayed: bool = False
    # RequestForgetUser, once executed: when the user's memory was erased.
    erased_at: datetime | None = None


class ContextReply(Message, tag="context", frozen=True, kw_only=True):
    """A memory block: ``text`` to paste into a prompt, its size in ``tokens``, every note it
    shows (``note_ids``, the profile's too, in the order shown), and whether some were left out
    to fit ``max_tokens``."""

    text: str
    tokens: int
    note_ids: list[str]
    truncated: bool = False


AnyReply = (
    NoteWritten
    | NotesWritten
    | NoteReply
    | HistoryReply
    | NotesReply
    | CategoriesReply
    | MessagesReply
    | SearchReply
    | ForgetReply
    | ContextReply
    | DiffReply
    | RecallsReply
    | ErrorReply
)

CommandReply = NoteWritten | NotesWritten | ForgetReply | ErrorReply
QueryReply = (
    NoteReply
    | HistoryReply
    | NotesReply
    | CategoriesReply
    | MessagesReply
    | SearchReply
    | ContextReply
    | DiffReply
    | RecallsReply
    | ErrorReply
)
