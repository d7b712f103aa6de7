"""The versioned profile (requirements §3; once named prd29): memories with categories and
subjects, a known subject pointing to update_memory, updates reporting old -> new."""

from __future__ import annotations

from engram_ledger.contracts.limits import LIST_NOTES_MAX
from engram_ledger.contracts.model import NoteView
from engram_ledger.services.agents.session import AgentSession
from engram_ledger.services.agents.specs import ID, SUBJECT, Arguments, Result, Tool, ToolSpec, given, schema, text
from engram_ledger.services.domain.values import normalize_subject

# Requirements §3's bounds, checked by the schema before a handler runs.
CONTENT = text(500, min_length=5)

ADD_TO_MEMORY = ToolSpec(
    "add_to_memory",
    "Store important information for future conversations. Use this when the user shares facts about "
    "people, expresses preferences, or provides context that would be useful to remember. Ask for "
    "confirmation before storing new information. If a memory about the same subject exists, you are told "
    "to update that one instead.",
    schema(
        {
            "content": CONTENT,
            "category": {"type": "string", "enum": ["person", "preference", "context", "project"]},
            "subject": SUBJECT,
        },
        ["content", "category"],
    ),
    read_only=False,
)


async def about(s: AgentSession, subject: str) -> NoteView | None:
    """The first of the user's active notes about ``subject`` (case and spacing aside, as searches
    compare subjects), read a page of the
    listing at a time, so no one reply holds the whole memory."""
    offset = 0
    while True:
        page = await s.client.list_notes(s.user_id, offset=offset, limit=LIST_NOTES_MAX, after=s.last_token)
        wanted = normalize_subject(subject)
        found = next((n for n in page.notes if normalize_subject(n.subject or "") == wanted), None)
        offset += len(page.notes)
        if found is not None or not page.notes or offset >= page.total:
            return found


async def add_to_memory(s: AgentSession, a: Arguments) -> Result:
    content, subject = a["content"], a.get("subject")
    if subject:
        note = await about(s, subject)
        if note is not None:
            return {
                "created": False,
                "existing_id": note.id,
                "existing_content": note.content,
                "message": f"A memory about {subject} already exists ([id:{note.id}] {note.content}). "
                f"Use update_memory with memory_id {note.id} instead of adding a new one.",
            }
    # Requirements §3 answers created or not and a message: the similar notes would not be read.
    written = await s.client.save(s.user_id, content, advise=False, **given(a, "category", "subject"))
    s.track(written.token)
    if written.duplicate:
        return {"created": False, "id": written.note_id, "message": f"Already remembered as [id:{written.note_id}]"}
    return {"created": True, "id": written.note_id, "message": f"Remembered [id:{written.note_id}]: {content}"}


UPDATE_MEMORY = ToolSpec(
    "update_memory",
    "Update an existing memory when information has changed. Use this instead of creating a new memory "
    "when correcting outdated information.",
    schema({"memory_id": ID, "content": CONTENT}, ["memory_id", "content"]),
    read_only=False,
)


async def update_memory(s: AgentSession, a: Arguments) -> Result:
    content = a["content"]
    before = await s.client.get_note(s.user_id, a["memory_id"], after=s.last_token)
    written = await s.client.update(s.user_id, a["memory_id"], content=content)
    s.track(written.token)
    return {
        "id": written.note_id,
        "version": written.version,
        "old_content": before.content,
        "new_content": content,
        "message": f"Updated [id:{written.note_id}]: {before.content} -> {content}",
    }


TOOLS = [Tool(ADD_TO_MEMORY, add_to_memory), Tool(UPDATE_MEMORY, update_memory)]
