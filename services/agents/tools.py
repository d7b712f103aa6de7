"""Tool profiles: the LLM's surface, one profile per origin in docs/requirements.md (and Engram's own), and one
dispatcher that runs any profile's tool call over the bus and answers in the shape its origin
specifies. The MCP server (``services/agents/mcp_server.py``) and ``engram tools`` are views of this.

Each profile is a module of ``services/agents/profiles/``: its tools' specs and handlers side by side
(``services/agents/specs.py`` says what a tool is). Every tool has a JSON Schema for its arguments, a
description that teaches the LLM when and how to use it (the requirements' own words where they give
them), a read-only or side-effecting mark and a timeout (requirements §2: searches 15 s, writes 10 s).
Errors are requirements §4's object: ``{"error": {"code": ..., "message": ...}}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import ValidationError, best_match

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.agents.profiles import (
    ALIASES,
    assistant,
    canonical,
    engram,
    forget,
    memento,
    runtime,
    versioned,
)
from engram_ledger.services.agents.session import AgentSession
from engram_ledger.services.agents.specs import Result, Tool, ToolSpec, error
from engram_ledger.services.application.decoding import check_user_id, explain, join, path_name
from engram_ledger.services.bus.client import EngramClient

__all__ = [
    "PROFILES",
    "PROFILE_ALIASES",
    "PROFILE_NAMES",
    "AgentSession",
    "ToolDispatcher",
    "ToolSpec",
    "error",
    "profile",
    "profile_name",
]

_TOOLS: dict[str, list[Tool]] = {
    "engram": engram.TOOLS,
    "forget": forget.TOOLS,
    "runtime": runtime.TOOLS,
    "versioned": versioned.TOOLS,
    "memento": memento.TOOLS,
    "assistant": assistant.TOOLS,
}
PROFILES: dict[str, list[ToolSpec]] = {name: [t.spec for t in tools] for name, tools in _TOOLS.items()}

# Names profiles had before they said what they are for; configurations using them keep working.
PROFILE_ALIASES = ALIASES
PROFILE_NAMES = [*PROFILES, *PROFILE_ALIASES]


def profile_name(name: str) -> str:
    """The profile's name, an old name resolved."""
    if canonical(name) not in PROFILES:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"unknown profile {name!r}; one of {', '.join(PROFILES)}")
    return canonical(name)


def profile(name: str) -> list[ToolSpec]:
    """The specs of a profile's tools, in the order the LLM is shown them."""
    return PROFILES[profile_name(name)]


@dataclass
class ToolDispatcher:
    """Runs tool calls of one profile for one user (and, for include_conversation, one session).
    Reads pass the token of the last write it knows of: the LLM always reads its own writes."""

    client: EngramClient
    user_id: str
    profile_name: str
    session_id: str | None = None
    _tools: dict[str, Tool] = field(init=False, repr=False)
    _session: AgentSession = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # A user id the contracts refuse would fail every call: it is refused here, once.
        check_user_id(self.user_id)
        self.profile_name = profile_name(self.profile_name)
        self._tools = {t.spec.name: t for t in _TOOLS[self.profile_name]}
        self._session = AgentSession(self.client, self.user_id, self.session_id, channel=self.profile_name)

    @property
    def last_token(self) -> str | None:
        """The consistency token of the last write the dispatcher knows of (None before any)."""
        return self._session.last_token

    def track(self, token: str | None) -> None:
        """Let later reads see a write made through another path than these tools (a message the
        host application recorded, a note saved with the client directly)."""
        self._session.track(token)

    def specs(self) -> list[ToolSpec]:
        """The profile's tool specs."""
        return profile(self.profile_name)

    async def call(self, name: str, arguments: Mapping[str, Any] | None) -> Result:
        """Arguments are checked against the tool's schema first: what the LLM got wrong is an
        ``INVALID_PARAMETER`` it can correct; a failure past that is Engram's, and raises."""
        tool = self._tools.get(name)
        if tool is None:
            return error(
                ErrorCode.INVALID_PARAMETER,
                f"unknown tool {name!r} in profile {self.profile_name!r}; its tools are {', '.join(self._tools)}",
            )
        args = dict(arguments or {})
        problem = _invalid(tool.spec, args)
        if problem is not None:
            return error(ErrorCode.INVALID_PARAMETER, f"bad arguments for {name}: {problem}")
        try:
            return await tool.handler(self._session, args)
        except EngramError as e:
            return error(e.code, e.message)


# Draft 2020-12 as the contracts read it: a whole number is an int (not 5.0, which a contract
# refuses), and a date-time is what ``parse_time`` takes (the handlers' own reading of a time).
_Validator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)
    ),
)
_FORMATS = FormatChecker(formats=())


@_FORMATS.checks("date-time", raises=ValueError)
def _is_time(value: object) -> bool:
    if isinstance(value, str):
        datetime.fromisoformat(value)
    return True


_VALIDATORS: dict[int, Any] = {}


def _validator(spec: ToolSpec) -> Any:
    # Specs are module constants that live as long as the process: their id names them.
    if id(spec) not in _VALIDATORS:
        _VALIDATORS[id(spec)] = _Validator(spec.parameters, format_checker=_FORMATS)
    return _VALIDATORS[id(spec)]


def _invalid(spec: ToolSpec, arguments: dict[str, Any]) -> str | None:
    """Why the arguments do not fit the tool's schema, in plain words naming the tool's own
    parameter and the whole rule (an LLM reads them to correct its call), or None."""
    found = best_match(_validator(spec).iter_errors(arguments))
    if found is None:
        return None
    return _plain(spec, found)


def _plain(spec: ToolSpec, found: ValidationError) -> str:
    where = path_name(list(found.absolute_path))
    if found.validator == "required":
        missing = next(name for name in found.validator_value if name not in found.instance)
        return f"{join(where, missing)} is required"
    if found.validator == "additionalProperties":
        known = list(found.schema.get("properties", {}))
        unknown = next(name for name in found.instance if name not in known)
        if not where:
            return f"{unknown} is not a parameter of {spec.name}; its parameters are {', '.join(known)}"
        return f"{join(where, unknown)} is not allowed; {where} takes {', '.join(known)}"
    said = explain(where or "the arguments", found.schema, found.instance)
    return said if said is not None else f"{where or 'the arguments'}: {found.message}"
