"""Tool calls are checked against their schemas before anything runs: what the LLM got wrong is
an INVALID_PARAMETER it can correct; Engram's own failure is not dressed up as one. A valid call
passes on only what the LLM gave: the contract defaults the rest."""

from __future__ import annotations

from typing import Any

import pytest

from contracts.model import NoteKind
from contracts.queries import NoteWritten
from services.agents.tools import ToolDispatcher


class NoBus:
    """A client that must not be reached: every call here is refused before it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the bus was reached ({name}) for a call that should have been refused")


@pytest.mark.parametrize(
    ("tool", "arguments", "says"),
    [
        ("search", {}, "'query' is a required property"),
        ("search", {"query": "x", "top_k": 50}, "top_k"),
        ("search", {"query": "x", "colour": "red"}, "colour"),
        ("search", {"query": 7}, "query"),
        ("save", {"content": "x", "kind": "dream"}, "kind"),
        ("update", {"note_id": "short", "content": "x"}, "note_id"),
    ],
)
async def test_arguments_that_do_not_fit_the_schema_are_refused_with_the_reason(
    tool: str, arguments: dict[str, Any], says: str
) -> None:
    reply = await ToolDispatcher(NoBus(), "alice", "engram").call(tool, arguments)  # type: ignore[arg-type]
    assert reply["error"]["code"] == "INVALID_PARAMETER"
    assert says in reply["error"]["message"] and reply["error"]["message"].startswith(f"bad arguments for {tool}")


async def test_a_bug_behind_a_valid_call_is_an_internal_error_not_bad_arguments() -> None:
    tools = ToolDispatcher(NoBus(), "alice", "engram")  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match="the bus was reached"):
        await tools.call("search", {"query": "who is my manager?"})


async def test_an_old_profile_name_is_the_new_profile() -> None:
    assert ToolDispatcher(NoBus(), "alice", "prd29").profile_name == "versioned"  # type: ignore[arg-type]


class Saves:
    """A client that records what each save was given besides the user and the content."""

    def __init__(self) -> None:
        self.given: list[dict[str, Any]] = []

    async def save(self, user_id: str, content: str, **fields: Any) -> NoteWritten:
        self.given.append(fields)
        return NoteWritten(note_id="AAAAAAAA", version=1, token=f"0:1-{len(self.given)}")


async def test_a_save_passes_what_the_llm_gave_and_leaves_the_rest_to_the_contracts_defaults() -> None:
    client = Saves()
    tools = ToolDispatcher(client, "alice", "engram")  # type: ignore[arg-type]
    assert tools.last_token is None
    await tools.call("save", {"content": "Alec is my boss", "subject": "Alec"})
    await tools.call("save", {"content": "Water the plants", "kind": "procedure", "importance": 0.9})
    assert client.given == [{"subject": "Alec"}, {"kind": NoteKind.PROCEDURE, "importance": 0.9}]
    assert tools.last_token == "0:1-2", "reads after a write wait for it"
    tools.track(None)
    assert tools.last_token == "0:1-2", "a write without a token leaves the last one"
