"""What a tool is: its spec (name, description, JSON Schema, read-only mark, timeout) and its
handler, side by side; the schema pieces the profiles share, and requirements §4's error object."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from contracts.errors import ErrorCode
from contracts.limits import NOTE_ID_PATTERN, SEARCH_TOP_K_DEFAULT, SEARCH_TOP_K_MAX
from services.agents.session import AgentSession

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


STR: dict[str, Any] = {"type": "string"}
ID: dict[str, Any] = {"type": "string", "pattern": NOTE_ID_PATTERN, "description": "The 8-character memory id"}
TOP_K: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": SEARCH_TOP_K_MAX, "default": SEARCH_TOP_K_DEFAULT}
# The contract's Category (a slug of 1-50 characters) as one pattern, the whole rule where the LLM reads it.
CATEGORY: dict[str, Any] = {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,49}$"}


def contract_default(struct: type[msgspec.Struct], name: str) -> Any:
    """A contract field's default, for a schema that documents it: the contract states it once."""
    return next(f.default for f in msgspec.structs.fields(struct) if f.name == name)


def given(arguments: Mapping[str, Any], *names: str, **renamed: str) -> dict[str, Any]:
    """The arguments the caller gave among ``names`` (and ``renamed``: client parameter = tool
    argument); what it left out is left to the client and the contract's defaults."""
    out = {name: arguments[name] for name in names if name in arguments}
    out.update({param: arguments[arg] for param, arg in renamed.items() if arg in arguments})
    return out


def error(code: ErrorCode | str, message: str) -> Result:
    """Requirements §4's error object, which the LLM reads and can act on."""
    return {"error": {"code": str(code), "message": message}}
