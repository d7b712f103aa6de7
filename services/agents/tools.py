"""Tool profiles: the LLM's surface, one profile per origin in docs/requirements.md (and Engram's own), and one
dispatcher that runs any profile's tool call over the bus and answers in the shape its origin
specifies. The MCP server (``services/agents/mcp_server.py``) and ``engram tools`` are views of this.

Every tool has a JSON Schema for its arguments, a description that teaches the LLM when and
how to use it (the requirements' own words where they give them), a read-only or side-effecting mark
and a timeout (requirements §2: searches 15 s, writes 10 s). Errors are requirements §4's object:
``{"error": {"code": ..., "message": ...}}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from contracts.commands import NoteDraft
from contracts.errors import EngramError, ErrorCode
from contracts.limits import parse_time
from contracts.model import NoteKind, NoteSource, NoteStatus, NoteView
from contracts.queries import ForgetReply
from services.bus.client import EngramClient

READ_TIMEOUT = 15.0
WRITE_TIMEOUT = 10.0


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]
    read_only: bool
    timeout: float = WRITE_TIMEOUT

    def openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def anthropic(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}


def _schema(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required or [], "additionalProperties": False}


_STR = {"type": "string"}
_ID = {"type": "string", "pattern": "^[A-Za-z0-9]{8}$", "description": "The 8-character memory id"}
_TOP_K = {"type": "integer", "minimum": 1, "maximum": 20, "default": 5}
_CATEGORY = {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,49}$"}

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
    _schema(
        {
            "memory_id": {**_ID, "description": "Exact ID of the memory to delete (request it twice)"},
            "memory_ids": {"type": "array", "items": _ID, "maxItems": 20, "description": "Several ids at once"},
            "query": {**_STR, "description": "Find candidates to delete (deletes nothing)"},
        }
    ),
    read_only=False,
)

PROFILES: dict[str, list[ToolSpec]] = {
    "engram": [
        ToolSpec(
            "search",
            "Search the user's memory by meaning and keywords; best first, superseded notes left out unless asked.",
            _schema(
                {
                    "query": _STR,
                    "top_k": _TOP_K,
                    "category": _CATEGORY,
                    "include_superseded": {"type": "boolean", "default": False},
                    "include_conversations": {
                        "type": "boolean",
                        "default": False,
                        "description": "also search what was said in every past conversation with the user",
                    },
                    "since": {
                        "type": "string",
                        "format": "date-time",
                        "description": "only what happened (was said, or occurred) at or after this time",
                    },
                    "until": {
                        "type": "string",
                        "format": "date-time",
                        "description": "only what happened at or before this time",
                    },
                    "ranking": {
                        "type": "string",
                        "enum": ["relevance", "blended"],
                        "default": "relevance",
                        "description": "blended: also favour recently used and important notes",
                    },
                },
                ["query"],
            ),
            read_only=True,
            timeout=READ_TIMEOUT,
        ),
        ToolSpec(
            "save",
            "Save one fact, preference or decision as a standalone note. The reply lists similar existing notes "
            "and says when one should be superseded or updated instead.",
            _schema(
                {
                    "content": _STR,
                    "category": _CATEGORY,
                    "subject": _STR,
                    "kind": {"type": "string", "enum": [k.value for k in NoteKind]},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                    "source": {"type": "string", "enum": [s.value for s in NoteSource]},
                    "importance": {"type": "number", "minimum": 0, "maximum": 1},
                    "summary": _STR,
                    "narrative": _STR,
                    "occurred_at": {"type": "string", "format": "date-time"},
                    "trigger": _STR,
                    "action": _STR,
                    "links": {"type": "array", "items": _ID, "description": "an episode's facts (their ids)"},
                },
                ["content"],
            ),
            read_only=False,
        ),
        ToolSpec(
            "update",
            "Change a note (same id, new version) when information was corrected.",
            _schema({"note_id": _ID, "content": _STR, "category": _CATEGORY, "subject": _STR}, ["note_id"]),
            read_only=False,
        ),
        ToolSpec(
            "supersede",
            "Mark an old note as outdated by a newer one (it leaves search; its history stays).",
            _schema({"old_id": _ID, "new_id": _ID}, ["old_id", "new_id"]),
            read_only=False,
        ),
        FORGET,
        ToolSpec(
            "list",
            "List the user's notes (category, then age, then id).",
            _schema({"category": _CATEGORY, "include_superseded": {"type": "boolean", "default": False}}),
            read_only=True,
            timeout=READ_TIMEOUT,
        ),
        ToolSpec(
            "history",
            "Every version of a note, with time and origin.",
            _schema({"note_id": _ID}, ["note_id"]),
            read_only=True,
            timeout=READ_TIMEOUT,
        ),
        ToolSpec(
            "context",
            "The user's memory as a prompt block (markdown or xml), optionally focused on a query and within a "
            "token budget.",
            _schema(
                {
                    "format": {"type": "string", "enum": ["markdown", "xml"], "default": "markdown"},
                    "query": _STR,
                    "max_tokens": {"type": "integer", "minimum": 1},
                }
            ),
            read_only=True,
            timeout=READ_TIMEOUT,
        ),
    ],
    "forget": [FORGET],
    "runtime": [
        ToolSpec(
            "memory_search",
            "Search your persistent memory for relevant information. Use this when you need to recall user "
            "preferences, past decisions, stored facts, or anything previously saved. Results are ranked by "
            "relevance using semantic similarity and keyword matching. By default searches only your saved notes; "
            "set include_conversation to true to also search the current conversation history.",
            _schema(
                {
                    "query": {**_STR, "description": "Natural language search query"},
                    "top_k": {**_TOP_K, "description": "Max results to return (default: 5, max: 20)"},
                    "include_conversation": {
                        "type": "boolean",
                        "default": False,
                        "description": "Also search the current conversation session",
                    },
                },
                ["query"],
            ),
            read_only=True,
            timeout=READ_TIMEOUT,
        ),
        ToolSpec(
            "memory_save",
            "Save an important piece of information to your persistent memory as a natural language note. Use "
            "this proactively whenever the user shares preferences, makes decisions, states facts, or tells you "
            "something worth remembering across conversations. Saved notes persist across all sessions and "
            "channels. Returns a note_id for future reference.",
            _schema({"content": {**_STR, "description": "Natural language text to save"}}, ["content"]),
            read_only=False,
        ),
        ToolSpec(
            "memory_update",
            "Update a previously saved note with new content. Use this when the user corrects or changes "
            "previously stored information (e.g., a new preferred name, an updated preference). First use "
            "memory_search to find the note and its note_id, then call this with the note_id and the new content.",
            _schema({"note_id": _ID, "content": _STR}, ["note_id", "content"]),
            read_only=False,
        ),
        ToolSpec(
            "memory_delete",
            "Delete a previously saved note from memory. Use this when the user asks you to forget specific "
            "information. First use memory_search to find the note and its note_id, then call this with the "
            "note_id. The first call asks for confirmation (show the user the note); call again with the same "
            "note_id to delete it.",
            _schema({"note_id": _ID}, ["note_id"]),
            read_only=False,
        ),
    ],
    "versioned": [
        ToolSpec(
            "add_to_memory",
            "Store important information for future conversations. Use this when the user shares facts about "
            "people, expresses preferences, or provides context that would be useful to remember. Ask for "
            "confirmation before storing new information. If a memory about the same subject exists, you are told "
            "to update that one instead.",
            _schema(
                {
                    "content": {"type": "string", "minLength": 5, "maxLength": 500},
                    "category": {"type": "string", "enum": ["person", "preference", "context", "project"]},
                    "subject": {"type": "string", "maxLength": 200},
                },
                ["content", "category"],
            ),
            read_only=False,
        ),
        ToolSpec(
            "update_memory",
            "Update an existing memory when information has changed. Use this instead of creating a new memory "
            "when correcting outdated information.",
            _schema(
                {"memory_id": _ID, "content": {"type": "string", "minLength": 5, "maxLength": 500}},
                ["memory_id", "content"],
            ),
            read_only=False,
        ),
    ],
    "memento": [
        ToolSpec(
            "store_memory",
            "Store a new memory. Always succeeds. Returns similar memories that might be outdated. ALWAYS check "
            "the response for supersede suggestions.",
            _schema(
                {
                    "content": {**_STR, "description": "The fact or information to remember; a standalone statement."},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1, "default": 1.0},
                    "source": {"type": "string", "enum": ["explicit", "extracted"], "default": "extracted"},
                },
                ["content"],
            ),
            read_only=False,
        ),
        ToolSpec(
            "supersede_memory",
            "Mark an old memory as outdated when replaced by newer information. Call this when store_memory "
            "suggests it.",
            _schema({"old_memory_id": _STR, "new_memory_id": _STR}, ["old_memory_id", "new_memory_id"]),
            read_only=False,
        ),
        ToolSpec(
            "search_memories",
            "Search for relevant memories based on a query. Automatically filters out superseded memories.",
            _schema(
                {"query": _STR, "limit": {"type": "integer", "minimum": 1, "maximum": 20, "default": 5}}, ["query"]
            ),
            read_only=True,
            timeout=READ_TIMEOUT,
        ),
        ToolSpec(
            "list_recent_memories",
            "Get the most recently created memories. Useful for reviewing what was just stored.",
            _schema({"limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10}}),
            read_only=True,
            timeout=READ_TIMEOUT,
        ),
    ],
    "assistant": [
        ToolSpec(
            "extract_memory",
            "Extract new facts the user shared about themselves, several at once. Don't extract facts already in "
            "<user_memory>. Returns memory_updated: true when memory changed (reload it).",
            _schema(
                {
                    "facts": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": 100,
                        "items": _schema({"content": _STR, "category": _CATEGORY}, ["content"]),
                    }
                },
                ["facts"],
            ),
            read_only=False,
        ),
        ToolSpec(
            "update_memory",
            "Update an existing fact when the user corrects or clarifies it (fact_id from list_memories).",
            _schema({"fact_id": _ID, "content": _STR, "category": _CATEGORY}, ["fact_id"]),
            read_only=False,
        ),
        ToolSpec(
            "remove_memory",
            "Remove specific facts when the user asks to forget them (fact_ids from list_memories). The first "
            "call asks for confirmation; call again with the same fact_ids to delete them.",
            _schema({"fact_ids": {"type": "array", "items": _ID, "minItems": 1, "maxItems": 20}}, ["fact_ids"]),
            read_only=False,
        ),
        ToolSpec(
            "list_memories",
            "View all stored facts with their ids, categories and timestamps.",
            _schema({}),
            read_only=True,
            timeout=READ_TIMEOUT,
        ),
    ],
}


# Names profiles had before they said what they are; configurations using them keep working.
PROFILE_ALIASES = {"prd29": "versioned"}
PROFILE_NAMES = [*PROFILES, *PROFILE_ALIASES]


def profile_name(name: str) -> str:
    """The profile's name, an alias resolved."""
    name = PROFILE_ALIASES.get(name, name)
    if name not in PROFILES:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"unknown profile {name!r}; one of {', '.join(PROFILE_NAMES)}")
    return name


def profile(name: str) -> list[ToolSpec]:
    return PROFILES[profile_name(name)]


_VALIDATORS: dict[int, Draft202012Validator] = {}


def _validator(spec: ToolSpec) -> Draft202012Validator:
    # Specs are module constants that live as long as the process: their id names them.
    if id(spec) not in _VALIDATORS:
        _VALIDATORS[id(spec)] = Draft202012Validator(spec.parameters)
    return _VALIDATORS[id(spec)]


def _invalid(spec: ToolSpec, arguments: dict[str, Any]) -> str | None:
    """Why the arguments do not fit the tool's schema, or None."""
    found = best_match(_validator(spec).iter_errors(arguments))
    if found is None:
        return None
    where = ".".join(str(p) for p in found.absolute_path)
    return f"{where}: {found.message}" if where else found.message


def error(code: ErrorCode | str, message: str) -> dict[str, Any]:
    return {"error": {"code": str(code), "message": message}}


def _builtins(value: Any) -> Any:
    return msgspec.to_builtins(value)


def memento_memory(note: NoteView, relevance: float | None = None) -> dict[str, Any]:
    """Requirements §4's Memory object."""
    out: dict[str, Any] = {
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


Handler = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class ToolDispatcher:
    """Runs tool calls of one profile for one user (and, for include_conversation, one session)."""

    client: EngramClient
    user_id: str
    profile_name: str
    session_id: str | None = None
    _last_token: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.profile_name = profile_name(self.profile_name)

    def specs(self) -> list[ToolSpec]:
        return profile(self.profile_name)

    async def call(self, name: str, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
        """Arguments are checked against the tool's schema first: what the LLM got wrong is an
        ``INVALID_PARAMETER`` it can correct; a failure past that is Engram's, and raises."""
        spec = next((t for t in self.specs() if t.name == name), None)
        if spec is None:
            return error(ErrorCode.INVALID_PARAMETER, f"unknown tool {name!r} in profile {self.profile_name!r}")
        args = dict(arguments or {})
        problem = _invalid(spec, args)
        if problem is not None:
            return error(ErrorCode.INVALID_PARAMETER, f"bad arguments for {name}: {problem}")
        handler: Handler = getattr(self, f"_{self.profile_name}_{name}")
        try:
            return await handler(args)
        except EngramError as e:
            return error(e.code, e.message)

    # Reads pass the token of this dispatcher's last write: the LLM always reads its own writes.
    def _track(self, token: str | None) -> None:
        if token:
            self._last_token = token

    async def _get(self, note_id: str) -> NoteView:
        return await self.client.get_note(self.user_id, note_id, after=self._last_token)

    async def _forget(self, ids: list[str] | None, query: str | None) -> dict[str, Any]:
        reply = await self.client.forget(self.user_id, query=query, note_ids=ids or (), after=self._last_token)
        self._track(reply.token)
        return _forget_result(reply)

    # engram ------------------------------------------------------------------------------------

    async def _engram_search(self, a: dict[str, Any]) -> dict[str, Any]:
        reply = await self.client.search(
            self.user_id,
            a["query"],
            top_k=a.get("top_k", 5),
            category=a.get("category"),
            include_superseded=a.get("include_superseded", False),
            include_conversation=a.get("include_conversations", False),
            since=parse_time(a["since"]) if "since" in a else None,
            until=parse_time(a["until"]) if "until" in a else None,
            after=self._last_token,
            ranking=a.get("ranking", "relevance"),
        )
        return {"results": [_builtins(h) for h in reply.results]}

    async def _engram_save(self, a: dict[str, Any]) -> dict[str, Any]:
        extra: dict[str, Any] = {k: a[k] for k in ("summary", "narrative", "trigger", "action", "links") if k in a}
        if "occurred_at" in a:
            extra["occurred_at"] = parse_time(a["occurred_at"])
        written = await self.client.save(
            self.user_id,
            a["content"],
            kind=NoteKind(a.get("kind", "fact")),
            category=a.get("category", "general"),
            subject=a.get("subject"),
            confidence=a.get("confidence", 1.0),
            source=NoteSource(a.get("source", "explicit")),
            importance=a.get("importance", 0.5),
            **extra,
        )
        self._track(written.token)
        return _builtins(written)

    async def _engram_update(self, a: dict[str, Any]) -> dict[str, Any]:
        fields = {k: a[k] for k in ("content", "category", "subject") if k in a}
        written = await self.client.update(self.user_id, a["note_id"], **fields)
        self._track(written.token)
        return _builtins(written)

    async def _engram_supersede(self, a: dict[str, Any]) -> dict[str, Any]:
        written = await self.client.supersede(self.user_id, a["old_id"], a["new_id"])
        self._track(written.token)
        return _builtins(written)

    async def _engram_forget(self, a: dict[str, Any]) -> dict[str, Any]:
        return await self._forget_forget(a)

    async def _engram_list(self, a: dict[str, Any]) -> dict[str, Any]:
        reply = await self.client.list_notes(
            self.user_id,
            category=a.get("category"),
            include_superseded=a.get("include_superseded", False),
            after=self._last_token,
        )
        return {"notes": _builtins(reply.notes), "total": reply.total}

    async def _engram_history(self, a: dict[str, Any]) -> dict[str, Any]:
        reply = await self.client.history(self.user_id, a["note_id"], after=self._last_token)
        return {"note_id": reply.note_id, "status": reply.status, "versions": _builtins(reply.versions)}

    async def _engram_context(self, a: dict[str, Any]) -> dict[str, Any]:
        reply = await self.client.context(
            self.user_id,
            format=a.get("format", "markdown"),
            query=a.get("query"),
            max_tokens=a.get("max_tokens"),
            after=self._last_token,
        )
        return {"text": reply.text, "tokens": reply.tokens, "note_ids": reply.note_ids, "truncated": reply.truncated}

    # forget (requirements §1) -------------------------------------------------------------------------

    async def _forget_forget(self, a: dict[str, Any]) -> dict[str, Any]:
        ids = list(a.get("memory_ids") or []) + ([a["memory_id"]] if a.get("memory_id") else [])
        query = a.get("query")
        if not ids and not query:
            return error(ErrorCode.INVALID_PARAMETER, "give memory_id to delete, or query to find candidates")
        return await self._forget(ids, None if ids else query)

    # runtime (requirements §2) ------------------------------------------------------------------------

    async def _runtime_memory_search(self, a: dict[str, Any]) -> dict[str, Any]:
        conversation = bool(a.get("include_conversation", False)) and self.session_id is not None
        reply = await self.client.search(
            self.user_id,
            a["query"],
            top_k=a.get("top_k", 5),
            include_conversation=conversation,
            session_id=self.session_id if conversation else None,
            after=self._last_token,
        )
        return {
            "results": [
                {"note_id": h.note_id, "text": h.content, "score": h.score, "source": h.source} for h in reply.results
            ]
        }

    async def _runtime_memory_save(self, a: dict[str, Any]) -> dict[str, Any]:
        written = await self.client.save(self.user_id, a["content"], advise=False)
        self._track(written.token)
        if written.duplicate:
            return {"note_id": written.note_id, "message": f"Already saved as note {written.note_id}"}
        return {"note_id": written.note_id, "message": f"Saved note {written.note_id}"}

    async def _runtime_memory_update(self, a: dict[str, Any]) -> dict[str, Any]:
        written = await self.client.update(self.user_id, a["note_id"], content=a["content"])
        self._track(written.token)
        return {"note_id": written.note_id, "message": f"Updated note {written.note_id}"}

    async def _runtime_memory_delete(self, a: dict[str, Any]) -> dict[str, Any]:
        result = await self._forget([a["note_id"]], None)
        if result.get("status") == "forgotten":
            result["note_id"] = a["note_id"]
        return result

    # versioned (requirements §3) --------------------------------------------------------------------------

    async def _versioned_add_to_memory(self, a: dict[str, Any]) -> dict[str, Any]:
        content, category, subject = a["content"], a["category"], a.get("subject")
        if not 5 <= len(content) <= 500:
            return error(ErrorCode.INVALID_PARAMETER, "content must be 5-500 characters")
        if subject:
            existing = await self.client.list_notes(self.user_id, after=self._last_token)
            same = [n for n in existing.notes if (n.subject or "").casefold() == subject.casefold()]
            if same:
                note = same[0]
                return {
                    "created": False,
                    "existing_id": note.id,
                    "existing_content": note.content,
                    "message": f"A memory about {subject} already exists ([id:{note.id}] {note.content}). "
                    f"Use update_memory with memory_id {note.id} instead of adding a new one.",
                }
        written = await self.client.save(self.user_id, content, category=category, subject=subject, advise=False)
        self._track(written.token)
        if written.duplicate:
            return {"created": False, "id": written.note_id, "message": f"Already remembered as [id:{written.note_id}]"}
        return {"created": True, "id": written.note_id, "message": f"Remembered [id:{written.note_id}]: {content}"}

    async def _versioned_update_memory(self, a: dict[str, Any]) -> dict[str, Any]:
        content = a["content"]
        if not 5 <= len(content) <= 500:
            return error(ErrorCode.INVALID_PARAMETER, "content must be 5-500 characters")
        before = await self._get(a["memory_id"])
        written = await self.client.update(self.user_id, a["memory_id"], content=content)
        self._track(written.token)
        return {
            "id": written.note_id,
            "version": written.version,
            "old_content": before.content,
            "new_content": content,
            "message": f"Updated [id:{written.note_id}]: {before.content} -> {content}",
        }

    # memento (requirements §4) ------------------------------------------------------------------------

    async def _memento_store_memory(self, a: dict[str, Any]) -> dict[str, Any]:
        written = await self.client.save(
            self.user_id,
            a["content"],
            confidence=a.get("confidence", 1.0),
            source=NoteSource(a.get("source", "extracted")),
        )
        self._track(written.token)
        created = await self._get(written.note_id)
        similar = []
        for s in written.similar:
            similar.append(
                {
                    "id": s.note_id,
                    "content": s.content,
                    "confidence": s.confidence,
                    "source": s.source,
                    "created_at": s.created_at.isoformat(),
                    "similarity": round(s.similarity, 4),
                }
            )
        action = None
        if similar:
            first = similar[0]["id"]
            action = f'Call supersede_memory("{first}", "{written.note_id}") to mark the old memory as outdated.'
            if len(similar) > 1:
                others = ", ".join(f'"{m["id"]}"' for m in similar[1:])
                action += f" Check {others} too: supersede those the new memory replaces, keep those it complements."
        return {"created": memento_memory(created), "similar": similar, "action_required": action}

    async def _memento_supersede_memory(self, a: dict[str, Any]) -> dict[str, Any]:
        old, new = a["old_memory_id"], a["new_memory_id"]
        written = await self.client.supersede(self.user_id, old, new)
        self._track(written.token)
        return {"success": True, "message": f"Memory {old} marked as superseded by {new}"}

    async def _memento_search_memories(self, a: dict[str, Any]) -> dict[str, Any]:
        reply = await self.client.search(self.user_id, a["query"], top_k=a.get("limit", 5), after=self._last_token)
        return {"memories": [memento_memory(h.note, h.score) for h in reply.results if h.note is not None]}

    async def _memento_list_recent_memories(self, a: dict[str, Any]) -> dict[str, Any]:
        reply = await self.client.list_recent(self.user_id, limit=a.get("limit", 10), after=self._last_token)
        return {"memories": [memento_memory(n) for n in reply.notes]}

    # assistant (requirements §5) ----------------------------------------------------------------------

    async def _assistant_extract_memory(self, a: dict[str, Any]) -> dict[str, Any]:
        drafts = [NoteDraft(content=f["content"], category=f.get("category", "general")) for f in a["facts"]]
        written = await self.client.save_many(self.user_id, drafts)
        self._track(written.token)
        saved = [n.note_id for n in written.notes if not n.duplicate]
        duplicates = [
            {"content": d.content, "existing_id": n.note_id}
            for d, n in zip(drafts, written.notes, strict=True)
            if n.duplicate
        ]
        return {"memory_updated": bool(saved), "saved": saved, "duplicates": duplicates}

    async def _assistant_update_memory(self, a: dict[str, Any]) -> dict[str, Any]:
        fields = {k: a[k] for k in ("content", "category") if k in a}
        written = await self.client.update(self.user_id, a["fact_id"], **fields)
        self._track(written.token)
        return {"memory_updated": True, "fact_id": written.note_id, "version": written.version}

    async def _assistant_remove_memory(self, a: dict[str, Any]) -> dict[str, Any]:
        result = await self._forget(list(a["fact_ids"]), None)
        result["memory_updated"] = result.get("status") == "forgotten"
        return result

    async def _assistant_list_memories(self, a: dict[str, Any]) -> dict[str, Any]:
        reply = await self.client.list_notes(self.user_id, after=self._last_token)
        return {
            "facts": [
                {"id": n.id, "content": n.content, "category": n.category, "created_at": n.created_at.isoformat()}
                for n in reply.notes
                if n.status is NoteStatus.ACTIVE
            ]
        }


def _forget_result(reply: ForgetReply) -> dict[str, Any]:
    """Requirements §1's answers: candidates, a confirmation to relay, or the deletion."""
    out: dict[str, Any] = {"status": reply.status, "message": reply.message}
    if reply.status == "candidates":
        out["candidates"] = [
            {"id": c.note_id, "content": c.preview, "similarity": round(c.similarity, 4)} for c in reply.candidates
        ]
    if reply.pending:
        out["pending"] = [
            {
                "id": p.note_id,
                "content_preview": p.preview,
                "request_count": p.request_count,
                "expires_at": p.expires_at.isoformat(),
            }
            for p in reply.pending
        ]
    if reply.forgotten:
        out["deleted"] = reply.forgotten
    return out
