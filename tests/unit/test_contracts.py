"""The wire format: explicit tags, schema versions, validation limits, JSON Schema export."""

from __future__ import annotations

import typing

import msgspec
import pytest

from engram_ledger.contracts.commands import AnyCommand
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import AnyEvent
from engram_ledger.contracts.limits import MAX_CONTENT_CHARS
from engram_ledger.contracts.queries import AnyQuery, AnyReply
from engram_ledger.contracts.schema import json_schema
from engram_ledger.services.application.commands import decode_command
from engram_ledger.services.application.queries import decode_query

ALL = [t for union in (AnyCommand, AnyEvent, AnyQuery, AnyReply) for t in typing.get_args(union)]


def test_every_message_has_an_explicit_snake_case_tag_and_a_schema_version() -> None:
    tags = []
    for cls in ALL:
        config = cls.__struct_config__
        assert config.tag_field == "type"
        assert isinstance(config.tag, str) and config.tag != cls.__name__ and config.tag.islower(), cls
        assert "schema_version" in cls.__struct_fields__
        assert config.frozen and cls.__doc__, cls
        tags.append(config.tag)
    assert len(tags) == len(set(tags))


def test_every_event_carries_the_identity_fields() -> None:
    for cls in typing.get_args(AnyEvent):
        assert {"event_id", "note_id", "user_id", "version", "command_id", "at"} <= set(cls.__struct_fields__)


def save(**fields: object) -> bytes:
    body: dict[str, object] = {"type": "save_note", "command_id": "c1", "user_id": "alice", "content": "hello"}
    body.update(fields)
    return msgspec.json.encode({k: v for k, v in body.items() if v is not ...})


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "malformed JSON"),
        (b"", "malformed JSON"),
        (b"[]", "a command must be a JSON object"),
        (b'{"type": "drop_database"}', "type must be one of save_note"),
        (b'{"command_id": "c", "user_id": "u", "content": "x"}', "type is required"),
        (save(content=...), "content is required"),
        (save(content=""), "content must not be blank"),
        (save(content="   \n\t"), "content must not be blank"),
        (save(content="x" * (MAX_CONTENT_CHARS + 1)), "content must be at most 16,384 characters"),
        (save(content=42), "content must be text"),
        (save(user_id="a b"), "user_id may contain only ASCII letters, digits"),
        (save(user_id=""), "user_id must not be empty"),
        (save(command_id="x" * 129), "command_id must be at most 128 characters"),
        (save(confidence=1.5), "confidence must be a number from 0 to 1"),
        (save(kind="dream"), "kind must be one of"),
        (save(category="Person!"), "category must be a lower-case word"),
        (save(subject="s" * 201), "subject must be at most 200 characters"),
        (
            b'{"type": "update_note", "command_id": "c", "user_id": "u", "note_id": "short"}',
            "note_id must be a memory id",
        ),
        (b'{"type": "save_notes", "command_id": "c", "user_id": "u", "notes": []}', "notes must have 1 to 100 items"),
    ],
)
def test_bad_commands_are_invalid_parameter_with_a_clear_message(body: bytes, fragment: str) -> None:
    with pytest.raises(EngramError) as info:
        decode_command(body)
    assert info.value.code is ErrorCode.INVALID_PARAMETER
    assert fragment in info.value.message


def test_bad_queries_are_invalid_parameter() -> None:
    for body in (
        b'{"type": "list_recent", "user_id": "u", "limit": 0}',
        b'{"type": "list_recent", "user_id": "u", "limit": 51}',
        b'{"type": "get_note", "user_id": "u", "note_id": "x"}',
        b'{"type": "get_note", "user_id": "u", "note_id": "AAAAAAAA", "after": "nonsense"}',
    ):
        with pytest.raises(EngramError) as info:
            decode_query(body)
        assert info.value.code is ErrorCode.INVALID_PARAMETER


def test_unicode_content_round_trips() -> None:
    text = "Zoë likes 寿司 🍣 and ‮right-to-left‬ text, e\u0301 combining, zero\u200bwidth"
    assert decode_command(save(content=text)).content == text  # type: ignore[union-attr]


def test_json_schema_covers_every_contract() -> None:
    schema = json_schema()
    names = set(schema["$defs"])
    assert {cls.__name__ for cls in ALL} <= names
    save_note = schema["$defs"]["SaveNote"]
    assert save_note["properties"]["type"] == {"enum": ["save_note"]}
    assert save_note["properties"]["content"]["maxLength"] == MAX_CONTENT_CHARS
    assert "content" in save_note["required"]


def test_blended_ranking_mixes_relevance_recency_and_importance() -> None:
    from datetime import UTC, datetime, timedelta

    from engram_ledger.contracts.model import NoteKind, NoteSource, NoteStatus, NoteView
    from engram_ledger.services.application.search import BlendPolicy

    now = datetime(2026, 6, 1, tzinfo=UTC)

    def view(updated: datetime, importance: float, accessed: datetime | None = None) -> NoteView:
        return NoteView(
            id="AAAAAAAA", user_id="u", kind=NoteKind.FACT, content="x", category="general", subject=None,
            confidence=1.0, source=NoteSource.EXPLICIT, importance=importance, created_at=updated,
            updated_at=updated, last_accessed_at=accessed, version=1, status=NoteStatus.ACTIVE,
            supersedes=[], superseded_by=None,
        )  # fmt: skip

    policy = BlendPolicy(relevance=0.5, recency=0.25, importance=0.25, half_life_days=10)
    assert policy.score(1.0, view(now, 1.0), now) == pytest.approx(1.0)
    assert policy.score(1.0, view(now - timedelta(days=10), 0.0), now) == pytest.approx(0.5 + 0.125)
    used = view(now - timedelta(days=100), 0.0, accessed=now)
    assert policy.score(0.0, used, now) == pytest.approx(0.25), "a recent read keeps an old note fresh"


def test_the_asyncapi_document_names_every_channel_and_message() -> None:
    from typing import get_args

    from engram_ledger.contracts.asyncapi import asyncapi
    from engram_ledger.contracts.commands import AnyCommand
    from engram_ledger.contracts.events import AnyEvent
    from engram_ledger.contracts.queries import AnyQuery, AnyReply

    doc = asyncapi()
    assert doc["asyncapi"] == "3.0.0"
    messages = doc["components"]["messages"]
    for union in (AnyCommand, AnyEvent, AnyQuery, AnyReply):
        for cls in get_args(union):
            message = messages[cls.__name__]
            assert message["name"] == cls.__struct_config__.tag and message["summary"], cls
            assert message["payload"]["$ref"].split("/")[-1] in doc["components"]["schemas"]
    for channel in doc["channels"].values():
        for ref in channel["messages"].values():
            assert ref["$ref"].split("/")[-1] in messages
    assert {c["address"] for c in doc["channels"].values()} >= {"engram:{p}:commands:inbox", "engram:{p}:log"}
