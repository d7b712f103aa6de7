"""The memento profile (requirements §4): store_memory answers the similar memories and the
supersede to call; Memory objects in every answer."""

from __future__ import annotations

from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.contracts.limits import LIST_RECENT_DEFAULT, LIST_RECENT_MAX
from engram_ledger.contracts.model import NoteSource, NoteView
from engram_ledger.services.agents.session import AgentSession
from engram_ledger.services.agents.specs import (
    CONTENT,
    ID,
    MIN_RELEVANCE,
    QUERY,
    READ_TIMEOUT,
    TOP_K,
    Arguments,
    Result,
    Tool,
    ToolSpec,
    contract_default,
    given,
    no_match,
    schema,
)

# Requirements §4.8: store_memory's memories are taken from the conversation unless it says otherwise,
# unlike a note saved elsewhere (the contract's default is explicit).
STORE_SOURCE = NoteSource.EXTRACTED

STORE_MEMORY = ToolSpec(
    "store_memory",
    "Store a new memory. Always succeeds. Returns similar memories that might be outdated. ALWAYS check "
    "the response for supersede suggestions.",
    schema(
        {
            "content": {**CONTENT, "description": "The fact or information to remember; a standalone statement."},
            "confidence": {
                "type": "number",
                "minimum": 0,
                "maximum": 1,
                "default": contract_default(NoteDraft, "confidence"),
            },
            "source": {"type": "string", "enum": ["explicit", "extracted"], "default": STORE_SOURCE.value},
        },
        ["content"],
    ),
    read_only=False,
)


async def store_memory(s: AgentSession, a: Arguments) -> Result:
    written = await s.client.save(
        s.user_id, a["content"], source=NoteSource(a.get("source", STORE_SOURCE)), **given(a, "confidence")
    )
    s.track(written.token)
    created = await s.client.get_note(s.user_id, written.note_id, after=s.last_token)
    similar = [
        {
            "id": m.note_id,
            "content": m.content,
            "confidence": m.confidence,
            "source": m.source,
            "created_at": m.created_at.isoformat(),
            "similarity": round(m.similarity, 4),
        }
        for m in written.similar
    ]
    action = None
    if similar:
        first = similar[0]["id"]
        action = f'Call supersede_memory("{first}", "{written.note_id}") to mark the old memory as outdated.'
        if len(similar) > 1:
            others = ", ".join(f'"{m["id"]}"' for m in similar[1:])
            action += f" Check {others} too: supersede those the new memory replaces, keep those it complements."
    return {"created": memento_memory(created), "similar": similar, "action_required": action}


SUPERSEDE_MEMORY = ToolSpec(
    "supersede_memory",
    "Mark an old memory as outdated when replaced by newer information. Call this when store_memory suggests it.",
    schema({"old_memory_id": ID, "new_memory_id": ID}, ["old_memory_id", "new_memory_id"]),
    read_only=False,
)


async def supersede_memory(s: AgentSession, a: Arguments) -> Result:
    old, new = a["old_memory_id"], a["new_memory_id"]
    written = await s.client.supersede(s.user_id, old, new)
    s.track(written.token)
    return {"success": True, "message": f"Memory {old} marked as superseded by {new}"}


SEARCH_MEMORIES = ToolSpec(
    "search_memories",
    "Search for relevant memories based on a query. Automatically filters out superseded memories.",
    # limit: the search's top_k, by memento's name.
    schema({"query": QUERY, "limit": TOP_K, "min_relevance": MIN_RELEVANCE}, ["query"]),
    read_only=True,
    timeout=READ_TIMEOUT,
)


async def search_memories(s: AgentSession, a: Arguments) -> Result:
    reply = await s.client.search(
        s.user_id, a["query"], after=s.last_token, origin=s.origin, **given(a, "min_relevance", top_k="limit")
    )
    memories = [memento_memory(h.note, h.score) for h in reply.results if h.note is not None]
    return {"memories": memories} if memories else {"memories": [], "message": no_match(a["query"])}


LIST_RECENT_MEMORIES = ToolSpec(
    "list_recent_memories",
    "Get the most recently created memories. Useful for reviewing what was just stored.",
    schema({"limit": {"type": "integer", "minimum": 1, "maximum": LIST_RECENT_MAX, "default": LIST_RECENT_DEFAULT}}),
    read_only=True,
    timeout=READ_TIMEOUT,
)


async def list_recent_memories(s: AgentSession, a: Arguments) -> Result:
    reply = await s.client.list_recent(s.user_id, after=s.last_token, **given(a, "limit"))
    return {"memories": [memento_memory(n) for n in reply.notes]}


TOOLS = [
    Tool(STORE_MEMORY, store_memory),
    Tool(SUPERSEDE_MEMORY, supersede_memory),
    Tool(SEARCH_MEMORIES, search_memories),
    Tool(LIST_RECENT_MEMORIES, list_recent_memories),
]


def memento_memory(note: NoteView, relevance: float | None = None) -> Result:
    """Requirements §4's Memory object."""
    out: Result = {
        "id": note.id,
        "content": note.content,
        "confidence": note.confidence,
        "source": note.source.value,
        "created_at": note.created_at.isoformat(),
        "updated_at": note.updated_at.isoformat(),
        "accessed_at": (note.last_accessed_at or note.updated_at).isoformat(),
    }
    if note.supersedes:
        out["supersedes"] = note.supersedes[0]
    if note.superseded_by:
        out["superseded_by"] = note.superseded_by
    if relevance is not None:
        out["relevance_score"] = round(relevance, 4)
    return out
