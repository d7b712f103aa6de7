"""The bus handlers with FastStream's TestRedisBroker and the real command and query services over
the in-memory store and history: a request travels broker -> subscription -> service -> reply,
raw bytes in and out, refusals as typed error replies, without Redis."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
from faststream.redis import TestRedisBroker

from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import AnyCommand
from engram_ledger.contracts.queries import NotesWritten, NoteWritten
from engram_ledger.services.application.commands import CommandService, command_handlers
from engram_ledger.services.application.queries import QueryService, query_handlers
from engram_ledger.services.bootstrap import _subscribe, make_broker
from engram_ledger.services.config import Settings
from tests.fakes import InMemoryEventStore, InMemoryHistory

NOW = datetime(2026, 3, 1, tzinfo=UTC)


async def test_command_handler_replies_and_maps_errors() -> None:
    # given the real services over in-memory adapters, subscribed as bootstrap subscribes them
    broker = make_broker("redis://unused")
    store = InMemoryEventStore(partitions=2)
    commands = CommandService(command_handlers(store, clock=lambda: NOW))
    seen: list[object] = []
    execute = commands.execute

    async def recording(command: AnyCommand) -> NoteWritten | NotesWritten:
        seen.append(command)
        return await execute(command)

    commands.execute = recording  # type: ignore[method-assign]
    _subscribe(broker, Settings(partitions=2), commands, QueryService(query_handlers(InMemoryHistory(store), 1.0)))
    async with TestRedisBroker(broker) as br:
        # when
        body = b'{"type": "save_note", "command_id": "c", "user_id": "u", "content": "hello"}'
        reply = await br.request(body, stream=channels.command_stream(1))
        # then
        decoded = msgspec.json.decode(reply.body)
        (written,) = await store.note_ids("u")
        head, length = await store.log_head(store.partition_of("u"))
        assert length == 1 and head is not None
        assert {k: decoded[k] for k in ("type", "schema_version", "note_id", "version", "token", "replayed")} == {
            "type": "note_written",
            "schema_version": 1,
            "note_id": written,
            "version": 1,
            "token": channels.format_token(store.partition_of("u"), head),
            "replayed": False,
        }
        again = msgspec.json.decode((await br.request(body, stream=channels.command_stream(1))).body)
        assert again["replayed"] and again["note_id"] == written, "a retry gets its first outcome"
        missing = await br.request(
            b'{"type": "update_note", "command_id": "d", "user_id": "nobody", "note_id": "AAAAAAAA", "content": "x"}',
            stream=channels.command_stream(0),
        )
        assert msgspec.json.decode(missing.body)["code"] == "MEMORY_NOT_FOUND"
        bad = await br.request(b"{oops", stream=channels.command_stream(0))
        assert msgspec.json.decode(bad.body)["code"] == "INVALID_PARAMETER"
    assert len(seen) == 3  # the malformed one never reached the service
    assert sum([(await store.log_head(p))[1] for p in range(2)]) == 1, "only the save wrote an event"


async def test_query_handler_reads_what_a_command_wrote() -> None:
    # given
    broker = make_broker("redis://unused")
    store = InMemoryEventStore(partitions=2)
    _subscribe(
        broker,
        Settings(partitions=2),
        CommandService(command_handlers(store)),
        QueryService(query_handlers(InMemoryHistory(store), 1.0)),
    )
    async with TestRedisBroker(broker) as br:
        save = b'{"type": "save_note", "command_id": "c", "user_id": "u", "content": "hello"}'
        written = msgspec.json.decode((await br.request(save, stream=channels.command_stream(0))).body)
        # when
        get = msgspec.json.encode(
            {"type": "get_note", "user_id": "u", "note_id": written["note_id"], "after": written["token"]}
        )
        note = msgspec.json.decode((await br.request(get, stream=channels.query_stream(1))).body)
        theirs = msgspec.json.decode(
            (await br.request(get.replace(b'"u"', b'"v"'), stream=channels.query_stream(1))).body
        )
        bad = msgspec.json.decode((await br.request(b"[1, 2", stream=channels.query_stream(0))).body)
    # then
    assert note["type"] == "note" and note["note"]["content"] == "hello" and note["note"]["id"] == written["note_id"]
    assert (theirs["type"], theirs["code"]) == ("error", "MEMORY_NOT_FOUND")
    assert (bad["type"], bad["code"]) == ("error", "INVALID_PARAMETER")
