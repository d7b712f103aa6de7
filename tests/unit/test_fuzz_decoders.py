"""The bus decoders under arbitrary input (hypothesis): every body either decodes to a contract
or becomes a typed INVALID_PARAMETER error reply; nothing raises past the handler."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

from engram_ledger.services.adapters.minilm import count_tokens_many
from engram_ledger.services.application.commands import CommandService, command_handlers
from engram_ledger.services.application.context import ContextService
from engram_ledger.services.application.queries import QueryService, query_handlers
from tests.builders import bodies
from tests.fakes import InMemoryEventStore, InMemoryHistory

pytestmark = pytest.mark.unit


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
async def test_any_command_body_gets_a_reply_not_an_exception(body: bytes) -> None:
    service = CommandService(command_handlers(InMemoryEventStore()))
    raw = await service.handle(body)
    reply = msgspec.json.decode(raw)
    assert isinstance(reply, dict)
    if reply.get("type") == "error":
        assert reply["code"] in {"INVALID_PARAMETER", "MEMORY_NOT_FOUND", "UNAVAILABLE"} and reply["message"]


@settings(max_examples=200, deadline=None)
@given(body=bodies)
async def test_any_query_body_gets_a_reply_not_an_exception(body: bytes) -> None:
    history = InMemoryHistory(InMemoryEventStore())
    service = QueryService(query_handlers(history, 0.01, context=ContextService(history, None, count_tokens_many)))
    reply = msgspec.json.decode(await service.handle(body))
    assert isinstance(reply, dict) and reply.get("type") in {"error", "notes", "context"}
    if reply["type"] == "error":
        assert reply["code"] in {"INVALID_PARAMETER", "MEMORY_NOT_FOUND", "UNAVAILABLE"} and reply["message"]


async def test_an_oversized_body_is_refused_before_it_is_parsed() -> None:
    from engram_ledger.contracts.limits import MAX_MESSAGE_BYTES

    content = "x" * (MAX_MESSAGE_BYTES + 1)
    body = json.dumps({"type": "save_note", "command_id": "c1", "user_id": "u", "content": content}).encode()
    for service in (
        CommandService(command_handlers(InMemoryEventStore())),
        QueryService(query_handlers(InMemoryHistory(InMemoryEventStore()), 0.1)),
    ):
        reply = msgspec.json.decode(await service.handle(body))
        assert reply["code"] == "INVALID_PARAMETER" and "limit" in reply["message"]


async def test_a_body_nested_past_the_decoders_depth_gets_a_typed_refusal() -> None:
    deep = b"[" * 1000 + b"]" * 1000
    history = InMemoryHistory(InMemoryEventStore())
    for service, body in (
        (CommandService(command_handlers(InMemoryEventStore())), deep),
        (CommandService(command_handlers(InMemoryEventStore())), b'{"type": "save_note", "links": ' + deep + b"}"),
        (QueryService(query_handlers(history, 0.1)), b'{"type": "list_notes", "where": ' + deep + b"}"),
    ):
        reply = msgspec.json.decode(await service.handle(body))
        assert reply["code"] == "INVALID_PARAMETER" and "nested too deeply" in reply["message"], reply
