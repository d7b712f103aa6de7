"""A request the contracts refuse is answered in plain words: the field as the caller sent it and
the whole rule it broke, never msgspec's ``Expected `str` ... - at `$.content```. A person or an
LLM reads these messages to correct the request."""

from __future__ import annotations

import msgspec
import pytest

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.application.commands import decode_command
from engram_ledger.services.application.decoding import check_user_id
from engram_ledger.services.application.queries import decode_query


def save(**fields: object) -> bytes:
    body: dict[str, object] = {"type": "save_note", "command_id": "c1", "user_id": "alice", "content": "hello"}
    body.update(fields)
    return msgspec.json.encode({k: v for k, v in body.items() if v is not ...})


def command(kind: str, **fields: object) -> bytes:
    return msgspec.json.encode({"type": kind, "command_id": "c1", "user_id": "alice", **fields})


def query(kind: str, **fields: object) -> bytes:
    return msgspec.json.encode({"type": kind, "user_id": "alice", **fields})


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (save(content=""), "content must not be blank"),
        (save(content="  \n\t "), "content must not be blank"),
        (save(content="x" * 20_000), "content must be at most 16,384 characters; you gave 20,000"),
        (save(content=42), "content must be text of at most 16,384 characters; you gave 42"),
        (save(content=None), "content must be text of at most 16,384 characters; you gave null"),
        (save(content=...), "content is required"),
        (
            save(user_id="bad user"),
            "user_id may contain only ASCII letters, digits and . _ : @ + / = | - (no spaces); you gave 'bad user'",
        ),
        (save(user_id=""), "user_id must not be empty"),
        (save(command_id="x" * 129), "command_id must be at most 128 characters; you gave 129"),
        (save(confidence=1.5), "confidence must be a number from 0 to 1; you gave 1.5"),
        (save(confidence="high"), "confidence must be a number from 0 to 1; you gave 'high'"),
        (save(kind="dream"), "kind must be one of fact, episode or procedure; you gave 'dream'"),
        (save(category="Person!"), "category must be a lower-case word of a-z, 0-9, _ and -"),
        (save(links=["nope"]), "links[0] must be a memory id: 8 letters or digits"),
        (save(occurred_at="yesterday"), "occurred_at must be a time"),
        (save(expected_version=-1), "expected_version must be a whole number of at least 0; you gave -1"),
        (save(origin=3), "origin must be a JSON object; you gave 3"),
        (command("update_note", note_id="nope"), "note_id must be a memory id: 8 letters or digits"),
        (command("update_note", note_id="nope"), "you gave 'nope'"),
        (command("update_note", note_id=None), "note_id must be a memory id"),
        (command("save_notes", notes=[]), "notes must have 1 to 100 items; you gave 0"),
        (command("save_notes", notes=[{"content": " "}]), "notes[0].content must not be blank"),
        (command("save_notes", notes=[{}]), "notes[0].content is required"),
        (
            command("record_message", session_id="s", content="x", role="bot"),
            "role must be one of user, assistant, system or tool; you gave 'bot'",
        ),
        (
            command("record_message", session_id="s", content="x", sent_at="2024-05-01T09:00:00"),
            "sent_at must be a time with its zone",
        ),
        (b'{"type": "drop_database"}', "type must be one of save_note, "),
        (b'{"command_id": "c", "user_id": "u", "content": "x"}', "type is required; one of save_note, "),
        (b"[]", "a command must be a JSON object; you gave a list"),
    ],
)
def test_a_refused_command_says_which_field_and_what_it_must_be(body: bytes, says: str) -> None:
    with pytest.raises(EngramError) as info:
        decode_command(body)
    assert info.value.code is ErrorCode.INVALID_PARAMETER
    assert says in info.value.message, info.value.message
    assert "$." not in info.value.message and "Expected" not in info.value.message


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (query("list_recent", limit=500), "limit must be a whole number from 1 to 50; you gave 500"),
        (query("search_notes", query="x", top_k=0), "top_k must be a whole number from 1 to 20; you gave 0"),
        (query("search_notes", query="x", top_k=1.5), "top_k must be a whole number from 1 to 20; you gave 1.5"),
        (query("search_notes", query="x", top_k=True), "top_k must be a whole number from 1 to 20; you gave true"),
        (query("search_notes", query=" "), "query must not be blank"),
        (
            query("search_notes", query="x", ranking="best"),
            "ranking must be one of blended or relevance; you gave 'best'",
        ),
        (query("search_notes", query="x", after="zz"), "after must be a consistency token"),
        (query("build_context", format="html"), "format must be one of markdown or xml; you gave 'html'"),
        (query("get_note", note_id="x"), "note_id must be a memory id: 8 letters or digits"),
    ],
)
def test_a_refused_query_says_which_field_and_what_it_must_be(body: bytes, says: str) -> None:
    with pytest.raises(EngramError) as info:
        decode_query(body)
    assert info.value.code is ErrorCode.INVALID_PARAMETER
    assert says in info.value.message, info.value.message
    assert "$." not in info.value.message and "Expected" not in info.value.message


def test_a_user_id_is_checked_against_the_contract_under_the_name_the_caller_knows() -> None:
    check_user_id("alice@example.com", "--user")
    with pytest.raises(EngramError) as info:
        check_user_id("bad user", "--user")
    assert info.value.code is ErrorCode.INVALID_PARAMETER
    assert info.value.message == (
        "--user may contain only ASCII letters, digits and . _ : @ + / = | - (no spaces); you gave 'bad user'"
    )
    with pytest.raises(EngramError, match="at most 128 characters"):
        check_user_id("u" * 129, "--user")


def test_a_number_too_large_for_json_is_named_not_called_malformed() -> None:
    body = b'{"type":"save_note","command_id":"c1","user_id":"alice","content":"x","confidence":1e400}'
    with pytest.raises(EngramError) as info:
        decode_command(body)
    assert info.value.code is ErrorCode.INVALID_PARAMETER
    assert "confidence" in info.value.message and "malformed" not in info.value.message
