"""Tool calls are checked against their schemas before anything runs: what the LLM got wrong is
an INVALID_PARAMETER it can correct; Engram's own failure is not dressed up as one. A valid call
passes on only what the LLM gave: the contract defaults the rest."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import NOTE_ID_PATTERN
from engram_ledger.contracts.model import NoteKind
from engram_ledger.contracts.queries import NoteWritten
from engram_ledger.services.agents.tools import PROFILES, ToolDispatcher


class NoBus:
    """A client that must not be reached: every call here is refused before it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the bus was reached ({name}) for a call that should have been refused")


@pytest.mark.parametrize(
    ("profile", "tool", "arguments", "says"),
    [
        ("engram", "search", {}, "query is required"),
        ("engram", "search", {"query": "x", "top_k": 50}, "top_k must be a whole number from 1 to 20; you gave 50"),
        ("engram", "search", {"query": "x", "colour": "red"}, "colour is not a parameter of search; its parameters"),
        ("engram", "search", {"query": 7}, "query must be text of at most 2,000 characters; you gave 7"),
        ("engram", "search", {"query": "  "}, "query must not be blank"),
        ("engram", "search", {"query": "x", "since": "yesterday"}, "since must be a time"),
        ("engram", "search", {"query": "x", "since": "yesterday"}, "you gave 'yesterday'"),
        ("engram", "save", {"content": "x", "kind": "dream"}, "kind must be one of fact, episode or procedure"),
        ("engram", "save", {"content": ""}, "content must not be blank"),
        ("engram", "save", {"content": " \n "}, "content must not be blank"),
        ("engram", "save", {"content": "x" * 16_385}, "content must be at most 16,384 characters; you gave 16,385"),
        ("engram", "save", {"content": "x", "subject": "s" * 201}, "subject must be at most 200 characters"),
        ("engram", "save", {"content": "x", "category": "Bad Cat"}, "category must be a lower-case word"),
        ("engram", "save", {"content": "x", "links": ["nope"]}, "links[0] must be a memory id: 8 letters or digits"),
        ("engram", "update", {"note_id": "short", "content": "x"}, "note_id must be a memory id"),
        ("engram", "context", {"max_tokens": 10**9}, "max_tokens must be a whole number from 1 to 200,000"),
        (
            "memento",
            "search_memories",
            {"query": "x", "limit": 1000},
            "limit must be a whole number from 1 to 20; you gave 1000",
        ),
        (
            "memento",
            "search_memories",
            {"query": "x", "limit": None},
            "limit must be a whole number from 1 to 20; you gave null",
        ),
        ("memento", "search_memories", {"query": None}, "query must be text"),
        (
            "memento",
            "supersede_memory",
            {"old_memory_id": "nope", "new_memory_id": "AAAAAAAA"},
            "old_memory_id must be a memory id: 8 letters or digits",
        ),
        ("memento", "supersede_memory", {"old_memory_id": "nope", "new_memory_id": "AAAAAAAA"}, "you gave 'nope'"),
        (
            "memento",
            "store_memory",
            {"content": "x", "confidence": 2},
            "confidence must be a number from 0 to 1; you gave 2",
        ),
        ("memento", "list_recent_memories", {"limit": 0}, "limit must be a whole number from 1 to 50; you gave 0"),
        (
            "versioned",
            "add_to_memory",
            {"content": "hey", "category": "person"},
            "content must be 5 to 500 characters; you gave 3",
        ),
        ("versioned", "add_to_memory", {"content": "      ", "category": "person"}, "content must not be blank"),
        (
            "versioned",
            "update_memory",
            {"memory_id": "nope", "content": "Sarah moved"},
            "memory_id must be a memory id",
        ),
        ("assistant", "extract_memory", {"facts": []}, "facts must have 1 to 100 items; you gave 0"),
        (
            "assistant",
            "extract_memory",
            {"facts": [{"content": "x", "category": "Bad"}]},
            "facts[0].category must be a lower-case word",
        ),
        ("assistant", "extract_memory", {"facts": [{"category": "person"}]}, "facts[0].content is required"),
        (
            "assistant",
            "remove_memory",
            {"fact_ids": ["AAAAAAAA"] * 21},
            "fact_ids must have 1 to 20 items; you gave 21",
        ),
        ("runtime", "memory_delete", {"note_id": 12345678}, "note_id must be a memory id"),
        (
            "runtime",
            "memory_search",
            {"query": "x", "include_conversation": "yes"},
            "include_conversation must be true or false; you gave 'yes'",
        ),
        ("forget", "forget", {"memory_ids": ["nope"]}, "memory_ids[0] must be a memory id"),
    ],
)
async def test_arguments_that_do_not_fit_the_schema_are_refused_in_plain_words(
    profile: str, tool: str, arguments: dict[str, Any], says: str
) -> None:
    """The message names the tool's own parameter and the whole rule (an LLM reads it to correct
    the call), never a contract's field or a validator's jargon."""
    reply = await ToolDispatcher(NoBus(), "alice", profile).call(tool, arguments)  # type: ignore[arg-type]
    assert reply["error"]["code"] == "INVALID_PARAMETER"
    message = reply["error"]["message"]
    assert message.startswith(f"bad arguments for {tool}: ") and says in message, message
    assert "$." not in message and "Expected" not in message and "None" not in message


def _strings(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if node.get("type") == "string":
            yield where, node
        for key, value in node.items():
            yield from _strings(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _strings(value, f"{where}[{i}]")


def test_every_tool_schema_carries_the_contracts_limits() -> None:
    """What passes a tool's schema is not refused by the contract for its shape: every text has a
    length limit (or is a choice, a time), every memory id the contract's pattern, and nothing
    takes null."""
    for name, specs in PROFILES.items():
        for spec in specs:
            for where, node in _strings(spec.parameters, f"{name}.{spec.name}"):
                bounded = node.keys() & {"enum", "format", "maxLength"} or node.get("pattern") == NOTE_ID_PATTERN
                assert bounded, where
                parameter = where.rsplit(".properties.", 1)[-1].split(".")[0]
                if parameter.endswith(("_id", "_ids")) or parameter == "links":
                    assert node.get("pattern") == NOTE_ID_PATTERN, where
            assert "null" not in json.dumps(spec.parameters), spec.name


async def test_a_dispatcher_for_a_user_id_the_contract_refuses_is_not_made() -> None:
    with pytest.raises(EngramError) as info:
        ToolDispatcher(NoBus(), "bad user", "memento")  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.INVALID_PARAMETER
    assert "may contain only ASCII letters, digits and . _ : @ + / = | - (no spaces); you gave 'bad user'" in (
        info.value.message
    )


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
