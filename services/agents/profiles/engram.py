"""The engram profile: Engram's own tools, every field of a note and every read."""

from __future__ import annotations

import msgspec

from engram_ledger.contracts.limits import MAX_CONTEXT_TOKENS, MAX_FORGET_IDS, parse_time
from engram_ledger.contracts.model import NoteKind, NoteSource
from engram_ledger.services.agents.profiles.forget import forget_by_id_or_query
from engram_ledger.services.agents.session import AgentSession
from engram_ledger.services.agents.specs import (
    CATEGORY,
    CONTENT,
    ID,
    LIMIT,
    LONG_TEXT,
    MIN_RELEVANCE,
    OFFSET,
    QUERY,
    READ_TIMEOUT,
    SUBJECT,
    TIME,
    TOP_K,
    Arguments,
    Result,
    Tool,
    ToolSpec,
    given,
    list_page,
    no_match,
    schema,
)

SEARCH = ToolSpec(
    "search",
    "Search the user's memory by meaning and keywords; best first, superseded notes left out unless asked. "
    "Each result has a relevance from 0 to 1; results too unlikely to be relevant are left out, and when none "
    "is left the answer says no memory matched. A time in the query ('in May 2023', 'last week') brings what "
    "happened then first.",
    schema(
        {
            "query": QUERY,
            "top_k": TOP_K,
            "category": CATEGORY,
            "include_superseded": {"type": "boolean", "default": False},
            "include_conversations": {
                "type": "boolean",
                "default": False,
                "description": "also search what was said in every past conversation with the user",
            },
            "since": {
                **TIME,
                "description": "only what happened (was said, or occurred) at or after this time",
            },
            "until": {
                **TIME,
                "description": "only what happened at or before this time",
            },
            "ranking": {
                "type": "string",
                "enum": ["relevance", "blended"],
                "default": "relevance",
                "description": "blended: also favour recently used and important notes",
            },
            "min_relevance": MIN_RELEVANCE,
        },
        ["query"],
    ),
    read_only=True,
    timeout=READ_TIMEOUT,
)


async def search(s: AgentSession, a: Arguments) -> Result:
    options = given(
        a,
        "top_k",
        "category",
        "include_superseded",
        "ranking",
        "min_relevance",
        include_conversation="include_conversations",
    )
    options.update({bound: parse_time(a[bound]) for bound in ("since", "until") if bound in a})
    reply = await s.client.search(s.user_id, a["query"], after=s.last_token, origin=s.origin, **options)
    if not reply.results:
        return {"results": [], "message": no_match(a["query"])}
    return {"results": [msgspec.to_builtins(h) for h in reply.results]}


SAVE = ToolSpec(
    "save",
    "Save one fact, preference or decision as a standalone note. The reply lists similar existing notes "
    "and says when one should be superseded or updated instead.",
    schema(
        {
            "content": CONTENT,
            "category": CATEGORY,
            "subject": SUBJECT,
            "kind": {"type": "string", "enum": [k.value for k in NoteKind]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "source": {"type": "string", "enum": [s.value for s in NoteSource]},
            "importance": {"type": "number", "minimum": 0, "maximum": 1},
            "summary": LONG_TEXT,
            "narrative": LONG_TEXT,
            "occurred_at": TIME,
            "trigger": LONG_TEXT,
            "action": LONG_TEXT,
            "links": {
                "type": "array",
                "items": ID,
                "maxItems": MAX_FORGET_IDS,
                "description": "an episode's facts (their ids)",
            },
        },
        ["content"],
    ),
    read_only=False,
)


async def save(s: AgentSession, a: Arguments) -> Result:
    # What the LLM left out is the contract's default (NoteDraft), not one restated here.
    fields = given(
        a, "category", "subject", "confidence", "importance", "summary", "narrative", "trigger", "action", "links"
    )
    if "kind" in a:
        fields["kind"] = NoteKind(a["kind"])
    if "source" in a:
        fields["source"] = NoteSource(a["source"])
    if "occurred_at" in a:
        fields["occurred_at"] = parse_time(a["occurred_at"])
    written = await s.client.save(s.user_id, a["content"], **fields)
    s.track(written.token)
    return msgspec.to_builtins(written)


UPDATE = ToolSpec(
    "update",
    "Change a note (same id, new version) when information was corrected.",
    schema({"note_id": ID, "content": CONTENT, "category": CATEGORY, "subject": SUBJECT}, ["note_id"]),
    read_only=False,
)


async def update(s: AgentSession, a: Arguments) -> Result:
    written = await s.client.update(s.user_id, a["note_id"], **given(a, "content", "category", "subject"))
    s.track(written.token)
    return msgspec.to_builtins(written)


SUPERSEDE = ToolSpec(
    "supersede",
    "Mark an old note as outdated by a newer one (it leaves search; its history stays).",
    schema({"old_id": ID, "new_id": ID}, ["old_id", "new_id"]),
    read_only=False,
)


async def supersede(s: AgentSession, a: Arguments) -> Result:
    written = await s.client.supersede(s.user_id, a["old_id"], a["new_id"])
    s.track(written.token)
    return msgspec.to_builtins(written)


LIST = ToolSpec(
    "list",
    "List the user's notes (category, then age, then id), a page at a time: total counts them all, "
    "and next_offset, while notes remain, is the offset of the next page.",
    schema(
        {
            "category": CATEGORY,
            "include_superseded": {"type": "boolean", "default": False},
            "offset": OFFSET,
            "limit": LIMIT,
        }
    ),
    read_only=True,
    timeout=READ_TIMEOUT,
)


async def list_notes(s: AgentSession, a: Arguments) -> Result:
    reply, paging = await list_page(s, a, **given(a, "category", "include_superseded"))
    return {"notes": msgspec.to_builtins(reply.notes), **paging}


HISTORY = ToolSpec(
    "history",
    "Every version of a note, with time and origin.",
    schema({"note_id": ID}, ["note_id"]),
    read_only=True,
    timeout=READ_TIMEOUT,
)


async def history(s: AgentSession, a: Arguments) -> Result:
    reply = await s.client.history(s.user_id, a["note_id"], after=s.last_token)
    return {"note_id": reply.note_id, "status": reply.status, "versions": msgspec.to_builtins(reply.versions)}


CONTEXT = ToolSpec(
    "context",
    "The user's memory as a prompt block (markdown or xml), optionally focused on a query and within a token budget.",
    schema(
        {
            "format": {"type": "string", "enum": ["markdown", "xml"], "default": "markdown"},
            "query": QUERY,
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_CONTEXT_TOKENS},
            "min_relevance": {**MIN_RELEVANCE, "description": "with query: what counts as relevant to it"},
        }
    ),
    read_only=True,
    timeout=READ_TIMEOUT,
)


async def context(s: AgentSession, a: Arguments) -> Result:
    reply = await s.client.context(
        s.user_id,
        after=s.last_token,
        origin=s.origin,
        update_tool="update",
        **given(a, "format", "query", "max_tokens", "min_relevance"),
    )
    return {"text": reply.text, "tokens": reply.tokens, "note_ids": reply.note_ids, "truncated": reply.truncated}


FORGET = ToolSpec(
    "forget",
    "Delete memories in two calls. First call with note_id (or note_ids): the deletion is requested and "
    "the answer asks you to confirm; show the user what will be deleted and get their agreement. Second call "
    "with the same note_id: it is deleted for good. Pending requests expire after 5 minutes. Or call with "
    "query (and no note_id) to find candidates; that deletes nothing.",
    schema(
        {
            "note_id": {**ID, "description": "the note to delete (request it twice)"},
            "note_ids": {"type": "array", "items": ID, "maxItems": MAX_FORGET_IDS, "description": "several at once"},
            "query": {**QUERY, "description": "find candidates to delete (deletes nothing)"},
        }
    ),
    read_only=False,
)


async def forget(s: AgentSession, a: Arguments) -> Result:
    return await forget_by_id_or_query(s, a, "note_id", "notes", id_key="note_id")


TOOLS = [
    Tool(SEARCH, search),
    Tool(SAVE, save),
    Tool(UPDATE, update),
    Tool(SUPERSEDE, supersede),
    Tool(FORGET, forget),  # the profile's own: its ids are note_id, as in every other tool of it
    Tool(LIST, list_notes),
    Tool(HISTORY, history),
    Tool(CONTEXT, context),
]
