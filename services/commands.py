"""The command handler's application service: decode, decide, append, reply.

Optimistic concurrency: load the notes' states, decide, append with the versions seen; if another
writer got there first, load and decide again (a command with an explicit ``expected_version``
is then refused by the decider with ``VERSION_CONFLICT``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

import msgspec

from contracts import channels
from contracts.commands import AnyCommand, SaveNotes, SupersedeNote
from contracts.errors import EngramError, ErrorCode, ErrorReply
from contracts.queries import CommandReply, NotesWritten, NoteWritten, WrittenNote
from services.domain.decider import IdCollision, decide, note_ids_for
from services.event_store import Appended, Outcome
from services.ports import EventStore

log = logging.getLogger("engram.commands")

MAX_ATTEMPTS = 8
_command_decoder = msgspec.json.Decoder(AnyCommand)
_encoder = msgspec.json.Encoder()


def utc_now() -> datetime:
    return datetime.now(UTC)


def decode_command(body: bytes) -> AnyCommand:
    try:
        return _command_decoder.decode(body)
    except msgspec.ValidationError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"invalid command: {e}") from None
    except msgspec.DecodeError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"malformed JSON: {e}") from None


class CommandService:
    def __init__(self, store: EventStore, clock: Callable[[], datetime] = utc_now) -> None:
        self._store = store
        self._clock = clock

    async def handle(self, body: bytes) -> bytes:
        """Bus entry point: raw JSON in, JSON reply out. Domain refusals become error replies;
        infrastructure failures propagate so the message stays pending and is retried."""
        try:
            reply: CommandReply = await self.execute(decode_command(body))
        except EngramError as e:
            reply = e.reply()
        return _encoder.encode(reply)

    async def execute(self, command: AnyCommand) -> NoteWritten | NotesWritten:
        store = self._store
        first = await store.outcome(command.user_id, command.command_id)
        if first is not None:
            return _reply(command, store.partition_of(command.user_id), first, replayed=True)
        salt = 0
        for _ in range(MAX_ATTEMPTS):
            ids = note_ids_for(command, salt)
            loaded = await store.load(command.user_id, ids)
            try:
                appends = decide(command, {i: n.state for i, n in loaded.items()}, ids, self._clock())
            except IdCollision:
                salt += 1
                continue
            if not any(a.events for a in appends):
                note = loaded[appends[0].note_id]
                position = note.position or "0-0"
                token = channels.format_token(store.partition_of(command.user_id), position)
                return NoteWritten(note_id=appends[0].note_id, version=note.state.version, token=token)
            result = await store.append(command.user_id, command.command_id, appends)
            if isinstance(result, Appended):
                return _reply(command, store.partition_of(command.user_id), result.outcome, replayed=result.replayed)
            log.debug("conflict on %s (now v%d), deciding again", result.note_id, result.actual_version)
        raise EngramError(ErrorCode.VERSION_CONFLICT, "the memory kept changing under this command; retry it")


def _reply(command: AnyCommand, partition: int, outcome: Outcome, replayed: bool) -> NoteWritten | NotesWritten:
    token = channels.format_token(partition, outcome.position)
    if isinstance(command, SaveNotes):
        return NotesWritten(
            notes=[WrittenNote(note_id=n, version=v) for n, v in outcome.notes], token=token, replayed=replayed
        )
    note_id, version = outcome.notes[0]
    superseded_by = command.superseded_by if isinstance(command, SupersedeNote) else None
    return NoteWritten(note_id=note_id, version=version, token=token, replayed=replayed, superseded_by=superseded_by)


def error_reply(code: ErrorCode, message: str) -> bytes:
    return _encoder.encode(ErrorReply(code=code, message=message))
