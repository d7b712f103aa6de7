"""The forget profile (requirements §1): one tool, forgetting in two calls. Its handler and the
shape of its answers also serve the other profiles' delete tools."""

from __future__ import annotations

from collections.abc import Sequence

from engram_ledger.contracts.errors import ErrorCode
from engram_ledger.contracts.limits import MAX_FORGET_IDS
from engram_ledger.contracts.queries import ForgetReply
from engram_ledger.services.agents.session import AgentSession
from engram_ledger.services.agents.specs import ID, QUERY, Arguments, Result, Tool, ToolSpec, error, schema

FORGET = ToolSpec(
    "forget",
    "Delete a memory by its exact ID. This tool requires two calls to execute:\n\n"
    "1. First call: Provide memory_id to mark for deletion (confirmation requested)\n"
    "2. Second call: Provide the same memory_id again to execute deletion\n\n"
    "Alternatively, use query (without memory_id) to search for candidates.\n\n"
    "Parameters:\n"
    "- memory_id: The exact ID of the memory to delete. Must be called twice with the same ID for deletion "
    "to occur.\n"
    "- query: Search query to find memory candidates. Returns list with IDs. Use this to find the memory_id "
    "before deleting.\n\n"
    "Show the user what will be deleted and get their confirmation before the second call. Pending requests "
    'expire after 5 minutes. Examples: forget(query="San Francisco") returns a list; forget(memory_id="abc12345") '
    'asks "Please confirm..."; the same call again deletes it.',
    schema(
        {
            "memory_id": {**ID, "description": "Exact ID of the memory to delete (request it twice)"},
            "memory_ids": {
                "type": "array",
                "items": ID,
                "maxItems": MAX_FORGET_IDS,
                "description": "Several ids at once",
            },
            "query": {**QUERY, "description": "Find candidates to delete (deletes nothing)"},
        }
    ),
    read_only=False,
)


async def forget(s: AgentSession, a: Arguments) -> Result:
    return await forget_by_id_or_query(s, a, "memory_id", "memories")


async def forget_by_id_or_query(s: AgentSession, a: Arguments, one: str, noun: str, id_key: str = "id") -> Result:
    """A forget tool's call: the ids in ``one`` and ``one + "s"`` (at most ``MAX_FORGET_IDS``), or
    else ``query`` to find candidates; ``noun`` names what the ids are in an error."""
    ids = list(dict.fromkeys([*(a.get(f"{one}s") or []), *([a[one]] if a.get(one) else [])]))
    query = a.get("query")
    if not ids and not query:
        return error(ErrorCode.INVALID_PARAMETER, f"give {one} to delete, or query to find candidates")
    if len(ids) > MAX_FORGET_IDS:
        return error(
            ErrorCode.INVALID_PARAMETER,
            f"{one} and {one}s together name {len(ids)} {noun}; at most {MAX_FORGET_IDS} at once",
        )
    return await request_forget(s, ids, None if ids else query, id_key=id_key)


TOOLS = [Tool(FORGET, forget)]


async def request_forget(s: AgentSession, ids: Sequence[str], query: str | None, id_key: str = "id") -> Result:
    """Ask to forget these ids (or find candidates for the query) and answer as requirements §1 does.
    ``id_key``: what the profile calls a memory's id, in the candidates and the pending ones."""
    reply = await s.client.forget(s.user_id, query=query, note_ids=ids, after=s.last_token)
    s.track(reply.token)
    return forget_result(reply, id_key)


def forget_result(reply: ForgetReply, id_key: str = "id") -> Result:
    """Requirements §1's answers: candidates, a confirmation to relay, or the deletion."""
    out: Result = {"status": reply.status, "message": reply.message}
    if reply.status == "candidates":
        out["candidates"] = [
            {id_key: c.note_id, "content": c.preview, "similarity": round(c.similarity, 4)} for c in reply.candidates
        ]
    if reply.pending:
        out["pending"] = [
            {
                id_key: p.note_id,
                "content_preview": p.preview,
                "request_count": p.request_count,
                "expires_at": p.expires_at.isoformat(),
            }
            for p in reply.pending
        ]
    if reply.forgotten:
        out["deleted"] = reply.forgotten
    return out
