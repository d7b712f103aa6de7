"""The runtime profile (requirements §2): an agent runtime's memory_* tools, the current
conversation searchable with include_conversation."""

from __future__ import annotations

from engram_ledger.services.agents.profiles.forget import request_forget
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
    given,
    no_match,
    schema,
)

MEMORY_SEARCH = ToolSpec(
    "memory_search",
    "Search your persistent memory for relevant information. Use this when you need to recall user "
    "preferences, past decisions, stored facts, or anything previously saved. Results are ranked by "
    "relevance using semantic similarity and keyword matching. By default searches only your saved notes; "
    "set include_conversation to true to also search the current conversation history.",
    schema(
        {
            "query": {**QUERY, "description": "Natural language search query"},
            "top_k": {**TOP_K, "description": "Max results to return (default: 5, max: 20)"},
            "include_conversation": {
                "type": "boolean",
                "default": False,
                "description": "Also search the current conversation session",
            },
            "min_relevance": MIN_RELEVANCE,
        },
        ["query"],
    ),
    read_only=True,
    timeout=READ_TIMEOUT,
)


async def memory_search(s: AgentSession, a: Arguments) -> Result:
    # Without a session there is no current conversation to search.
    conversation = bool(a.get("include_conversation")) and s.session_id is not None
    reply = await s.client.search(
        s.user_id,
        a["query"],
        include_conversation=conversation,
        session_id=s.session_id if conversation else None,
        after=s.last_token,
        origin=s.origin,
        **given(a, "top_k", "min_relevance"),
    )
    if not reply.results:
        return {"results": [], "message": no_match(a["query"])}
    return {
        "results": [
            {"note_id": h.note_id, "text": h.content, "score": h.score, "relevance": h.relevance, "source": h.found_in}
            for h in reply.results
        ]
    }


MEMORY_SAVE = ToolSpec(
    "memory_save",
    "Save an important piece of information to your persistent memory as a natural language note. Use "
    "this proactively whenever the user shares preferences, makes decisions, states facts, or tells you "
    "something worth remembering across conversations. Saved notes persist across all sessions and "
    "channels. Returns a note_id for future reference.",
    schema({"content": {**CONTENT, "description": "Natural language text to save"}}, ["content"]),
    read_only=False,
)


async def memory_save(s: AgentSession, a: Arguments) -> Result:
    # Requirements §2 answers a note_id and a message: the similar notes would not be read.
    written = await s.client.save(s.user_id, a["content"], advise=False)
    s.track(written.token)
    if written.duplicate:
        return {"note_id": written.note_id, "message": f"Already saved as note {written.note_id}"}
    return {"note_id": written.note_id, "message": f"Saved note {written.note_id}"}


MEMORY_UPDATE = ToolSpec(
    "memory_update",
    "Update a previously saved note with new content. Use this when the user corrects or changes "
    "previously stored information (e.g., a new preferred name, an updated preference). First use "
    "memory_search to find the note and its note_id, then call this with the note_id and the new content.",
    schema({"note_id": ID, "content": CONTENT}, ["note_id", "content"]),
    read_only=False,
)


async def memory_update(s: AgentSession, a: Arguments) -> Result:
    written = await s.client.update(s.user_id, a["note_id"], content=a["content"])
    s.track(written.token)
    return {"note_id": written.note_id, "message": f"Updated note {written.note_id}"}


MEMORY_DELETE = ToolSpec(
    "memory_delete",
    "Delete a previously saved note from memory. Use this when the user asks you to forget specific "
    "information. First use memory_search to find the note and its note_id, then call this with the "
    "note_id. The first call asks for confirmation (show the user the note); call again with the same "
    "note_id to delete it.",
    schema({"note_id": ID}, ["note_id"]),
    read_only=False,
)


async def memory_delete(s: AgentSession, a: Arguments) -> Result:
    result = await request_forget(s, [a["note_id"]], None)
    if result.get("status") == "forgotten":
        result["note_id"] = a["note_id"]
    return result


TOOLS = [
    Tool(MEMORY_SEARCH, memory_search),
    Tool(MEMORY_SAVE, memory_save),
    Tool(MEMORY_UPDATE, memory_update),
    Tool(MEMORY_DELETE, memory_delete),
]
