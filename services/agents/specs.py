"""What a tool is: its spec (name, description, JSON Schema, read-only mark, timeout) and its
handler, side by side; the schema pieces the profiles share, and requirements §4's error object."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from engram_ledger.contracts.errors import ErrorCode
from engram_ledger.contracts.limits import (
    CATEGORY_PATTERN,
    LIST_NOTES_MAX,
    LIST_NOTES_PAGE,
    MAX_CATEGORY_CHARS,
    MAX_CONTENT_CHARS,
    MAX_EPISODE_FIELD_CHARS,
    MAX_QUERY_CHARS,
    MAX_SUBJECT_CHARS,
    NOT_BLANK,
    NOTE_ID_PATTERN,
    SEARCH_TOP_K_DEFAULT,
    SEARCH_TOP_K_MAX,
)
from engram_ledger.contracts.queries import NotesReply
from engram_ledger.services.agents.session import AgentSession

# Requirements §2: searches 15 s, writes 10 s.
READ_TIMEOUT = 15.0
WRITE_TIMEOUT = 10.0

Arguments = dict[str, Any]
Result = dict[str, Any]
Handler = Callable[[AgentSession, Arguments], Awaitable[Result]]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the LLM sees it."""

    name: str
    description: str
    parameters: dict[str, Any]
    read_only: bool
    timeout: float = WRITE_TIMEOUT

    def openai(self) -> dict[str, Any]:
        """The OpenAI function-calling definition."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def anthropic(self) -> dict[str, Any]:
        """The Anthropic tool definition."""
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}


@dataclass(frozen=True)
class Tool:
    """A spec and the handler that runs its calls (arguments already checked against the schema)."""

    spec: ToolSpec
    handler: Handler


def schema(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """An object schema that refuses unknown arguments."""
    return {"type": "object", "properties": properties, "required": required or [], "additionalProperties": False}


def text(max_length: int, min_length: int = 1, **extra: Any) -> dict[str, Any]:
    """A text parameter with the contracts' rule for text: not blank, and within these lengths."""
    return {"type": "string", "minLength": min_length, "maxLength": max_length, "pattern": NOT_BLANK, **extra}


# The contracts' limits, stated where the LLM reads them: what passes a tool's schema is not then
# refused by a contract under another name (a tool's memory_id is a command's note_id).
CONTENT = text(MAX_CONTENT_CHARS)
QUERY = text(MAX_QUERY_CHARS)
SUBJECT = text(MAX_SUBJECT_CHARS)
LONG_TEXT = text(MAX_EPISODE_FIELD_CHARS)
ID: dict[str, Any] = {"type": "string", "pattern": NOTE_ID_PATTERN, "description": "The 8-character memory id"}
MIN_RELEVANCE: dict[str, Any] = {
    "type": "number",
    "minimum": 0,
    "maximum": 1,
    "description": "leave out results less likely than this to be relevant (default: the service's floor; "
    "0: every result, however weak)",
}
TOP_K: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": SEARCH_TOP_K_MAX, "default": SEARCH_TOP_K_DEFAULT}
CATEGORY: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_CATEGORY_CHARS,
    "pattern": CATEGORY_PATTERN,
    "description": "a lower-case word of a-z, 0-9, _ and -, e.g. person, preference, project",
}
TIME: dict[str, Any] = {"type": "string", "format": "date-time"}
# A page of a listing: never the whole of a memory that may hold thousands of notes.
OFFSET: dict[str, Any] = {
    "type": "integer",
    "minimum": 0,
    "default": 0,
    "description": "where the page starts: the next_offset of the previous page",
}
LIMIT: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": LIST_NOTES_MAX, "default": LIST_NOTES_PAGE}


async def list_page(s: AgentSession, arguments: Mapping[str, Any], **filters: Any) -> tuple[NotesReply, Result]:
    """One page of the user's notes (``offset``, ``limit`` as the tool was given them) and what
    the reply says about the rest: ``total``, and ``next_offset`` while notes remain."""
    offset, limit = arguments.get("offset", 0), arguments.get("limit", LIST_NOTES_PAGE)
    reply = await s.client.list_notes(s.user_id, offset=offset, limit=limit, after=s.last_token, **filters)
    paging: Result = {"total": reply.total}
    if offset + len(reply.notes) < reply.total:
        paging["next_offset"] = offset + len(reply.notes)
    return reply, paging


def contract_default(struct: type[msgspec.Struct], name: str) -> Any:
    """A contract field's default, for a schema that documents it: the contract states it once."""
    return next(f.default for f in msgspec.structs.fields(struct) if f.name == name)


def no_match(query: str) -> str:
    """What a search tool says when nothing is above the floor, so the model does not guess."""
    return (
        f"No memory matched {query!r}: nothing the user's memory holds is relevant enough. "
        "Do not assume an answer; ask the user or search with other words."
    )


def given(arguments: Mapping[str, Any], *names: str, **renamed: str) -> dict[str, Any]:
    """The arguments the caller gave among ``names`` (and ``renamed``: client parameter = tool
    argument); what it left out is left to the client and the contract's defaults."""
    out = {name: arguments[name] for name in names if name in arguments}
    out.update({param: arguments[arg] for param, arg in renamed.items() if arg in arguments})
    return out


def error(code: ErrorCode | str, message: str) -> Result:
    """Requirements §4's error object, which the LLM reads and can act on."""
    return {"error": {"code": str(code), "message": message}}
