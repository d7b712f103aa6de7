"""The assistant profile (requirements §5): facts extracted several at once, duplicates caught,
and ``memory_updated`` telling the host to reload the memory block."""

from __future__ import annotations

from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.contracts.limits import MAX_BATCH_NOTES, MAX_FORGET_IDS
from engram_ledger.contracts.model import NoteStatus
from engram_ledger.services.agents.profiles.forget import request_forget
from engram_ledger.services.agents.session import AgentSession
from engram_ledger.services.agents.specs import (
    CATEGORY,
    CONTENT,
    ID,
    LIMIT,
    OFFSET,
    READ_TIMEOUT,
    Arguments,
    Result,
    Tool,
    ToolSpec,
    given,
    list_page,
    schema,
)

EXTRACT_MEMORY = ToolSpec(
    "extract_memory",
    "Extract new facts the user shared about themselves, several at once. Don't extract facts already in "
    "<user_memory>. Returns memory_updated: true when memory changed (reload it).",
    schema(
        {
            "facts": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_BATCH_NOTES,
                "items": schema({"content": CONTENT, "category": CATEGORY}, ["content"]),
            }
        },
        ["facts"],
    ),
    read_only=False,
)


async def extract_memory(s: AgentSession, a: Arguments) -> Result:
    drafts = [NoteDraft(content=f["content"], **given(f, "category")) for f in a["facts"]]
    written = await s.client.save_many(s.user_id, drafts)
    s.track(written.token)
    saved = [n.note_id for n in written.notes if not n.duplicate]
    duplicates = [
        {"content": d.content, "existing_id": n.note_id}
        for d, n in zip(drafts, written.notes, strict=True)
        if n.duplicate
    ]
    return {"memory_updated": bool(saved), "saved": saved, "duplicates": duplicates}


UPDATE_MEMORY = ToolSpec(
    "update_memory",
    "Update an existing fact when the user corrects or clarifies it (fact_id from list_memories).",
    schema({"fact_id": ID, "content": CONTENT, "category": CATEGORY}, ["fact_id"]),
    read_only=False,
)


async def update_memory(s: AgentSession, a: Arguments) -> Result:
    written = await s.client.update(s.user_id, a["fact_id"], **given(a, "content", "category"))
    s.track(written.token)
    return {"memory_updated": True, "fact_id": written.note_id, "version": written.version}


REMOVE_MEMORY = ToolSpec(
    "remove_memory",
    "Remove specific facts when the user asks to forget them (fact_ids from list_memories). The first "
    "call asks for confirmation; call again with the same fact_ids to delete them.",
    schema({"fact_ids": {"type": "array", "items": ID, "minItems": 1, "maxItems": MAX_FORGET_IDS}}, ["fact_ids"]),
    read_only=False,
)


async def remove_memory(s: AgentSession, a: Arguments) -> Result:
    result = await request_forget(s, list(a["fact_ids"]), None)
    result["memory_updated"] = result.get("status") == "forgotten"
    return result


LIST_MEMORIES = ToolSpec(
    "list_memories",
    "View the stored facts with their ids, categories and timestamps, a page at a time: total counts "
    "them all, and next_offset, while facts remain, is the offset of the next page.",
    schema({"offset": OFFSET, "limit": LIMIT}),
    read_only=True,
    timeout=READ_TIMEOUT,
)


async def list_memories(s: AgentSession, a: Arguments) -> Result:
    reply, paging = await list_page(s, a)
    facts = [
        {"id": n.id, "content": n.content, "category": n.category, "created_at": n.created_at.isoformat()}
        for n in reply.notes
        if n.status is NoteStatus.ACTIVE
    ]
    return {"facts": facts, **paging}


TOOLS = [
    Tool(EXTRACT_MEMORY, extract_memory),
    Tool(UPDATE_MEMORY, update_memory),
    Tool(REMOVE_MEMORY, remove_memory),
    Tool(LIST_MEMORIES, list_memories),
]
