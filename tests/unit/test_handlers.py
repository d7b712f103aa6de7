"""The bus handlers with FastStream's TestRedisBroker and an in-memory fake of the command
service: the subscription wiring, raw-bytes replies and error replies, without Redis."""

from __future__ import annotations

import msgspec
from faststream.redis import TestRedisBroker

from contracts import channels
from contracts.errors import EngramError, ErrorCode
from contracts.queries import NoteWritten
from services.application.commands import CommandService
from services.application.queries import QueryService
from services.bootstrap import _subscribe, make_broker
from services.config import Settings


class FakeCommands(CommandService):
    def __init__(self) -> None:
        self.seen: list[object] = []
        self._advisor = None

    async def execute(self, command):  # type: ignore[no-untyped-def,override]
        self.seen.append(command)
        if command.user_id == "nobody":
            raise EngramError(ErrorCode.MEMORY_NOT_FOUND, "Memory with ID AAAAAAAA not found")
        return NoteWritten(note_id="AAAAAAAA", version=1, token="0:1-0")


class FakeQueries(QueryService):
    def __init__(self) -> None:
        pass


async def test_command_handler_replies_and_maps_errors() -> None:
    broker = make_broker("redis://unused")
    commands = FakeCommands()
    _subscribe(broker, Settings(partitions=2), commands, FakeQueries())
    async with TestRedisBroker(broker) as br:
        body = b'{"type": "save_note", "command_id": "c", "user_id": "u", "content": "hello"}'
        reply = await br.request(body, stream=channels.command_stream(1))
        decoded = msgspec.json.decode(reply.body)
        assert {k: decoded[k] for k in ("type", "schema_version", "note_id", "version", "token", "replayed")} == {
            "type": "note_written",
            "schema_version": 1,
            "note_id": "AAAAAAAA",
            "version": 1,
            "token": "0:1-0",
            "replayed": False,
        }
        missing = await br.request(body.replace(b'"u"', b'"nobody"'), stream=channels.command_stream(0))
        assert msgspec.json.decode(missing.body)["code"] == "MEMORY_NOT_FOUND"
        bad = await br.request(b"{oops", stream=channels.command_stream(0))
        assert msgspec.json.decode(bad.body)["code"] == "INVALID_PARAMETER"
    assert len(commands.seen) == 2  # the malformed one never reached the service
