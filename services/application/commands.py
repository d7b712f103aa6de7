"""The command handler's application service: decode, decide, append, reply.

Optimistic concurrency: load the notes' states, decide, append with the versions seen; if another
writer got there first, load and decide again (a command with an explicit ``expected_version``
is then refused by the decider with ``VERSION_CONFLICT``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec

from contracts import channels
from contracts.commands import (
    AnyCommand,
    RecordMessages,
    RequestForget,
    RequestForgetSession,
    RequestForgetUser,
    SaveNote,
    SaveNotes,
    SupersedeNote,
)
from contracts.errors import EngramError, ErrorCode, ErrorReply
from contracts.limits import MAX_MESSAGE_BYTES
from contracts.queries import CommandReply, NotesWritten, NoteWritten, WrittenNote
from services.adapters.event_store import Appended, ContentTaken, Outcome
from services.application.advice import SaveAdvisor
from services.application.ports import EventStore
from services.domain.decider import IdCollision, decide, first_of_each_content, note_ids_for

if TYPE_CHECKING:
    from services.application.forget import ForgetService

log = logging.getLogger("engram.commands")

# Writers racing on one note each win a round; a contender retries with a small random pause so
# that many at once (a burst of updates to one note) spread out instead of colliding again.
MAX_ATTEMPTS = 32
_command_decoder = msgspec.json.Decoder(AnyCommand)
_encoder = msgspec.json.Encoder()


def utc_now() -> datetime:
    return datetime.now(UTC)


def decode_command(body: bytes) -> AnyCommand:
    refuse_oversized(body)
    try:
        return _command_decoder.decode(body)
    except msgspec.ValidationError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"invalid command: {e}") from None
    except msgspec.DecodeError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"malformed JSON: {e}") from None


def refuse_oversized(body: bytes) -> None:
    if len(body) > MAX_MESSAGE_BYTES:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER, f"message of {len(body):,} bytes: the limit is {MAX_MESSAGE_BYTES:,}"
        )


class CommandService:
    def __init__(
        self,
        store: EventStore,
        clock: Callable[[], datetime] = utc_now,
        advisor: SaveAdvisor | None = None,
        forget: ForgetService | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._advisor = advisor
        self._forget = forget

    async def handle(self, body: bytes) -> bytes:
        """Bus entry point: raw JSON in, JSON reply out. Domain refusals become error replies;
        infrastructure failures propagate so the message stays pending and is retried."""
        try:
            command = decode_command(body)
            if isinstance(command, RequestForget | RequestForgetUser | RequestForgetSession):
                if self._forget is None:
                    raise EngramError(ErrorCode.UNAVAILABLE, "forgetting is not served here")
                if isinstance(command, RequestForget):
                    return _encoder.encode(await self._forget.request(command))
                if isinstance(command, RequestForgetSession):
                    return _encoder.encode(await self._forget.request_session(command))
                return _encoder.encode(await self._forget.request_user(command))
            reply: CommandReply = await self.execute(command)
            advise = isinstance(command, SaveNote) and command.advise
            if (
                self._advisor is not None
                and advise
                and isinstance(command, SaveNote)
                and isinstance(reply, NoteWritten)
            ):
                reply = await self._advisor.advise(reply, command.user_id, command.content, command.subject)
        except EngramError as e:
            reply = e.reply()
        return _encoder.encode(reply)

    async def execute(self, command: AnyCommand) -> NoteWritten | NotesWritten:
        store = self._store
        partition = store.partition_of(command.user_id)
        first = await store.outcome(command.user_id, command.command_id)
        if first is not None:
            return _reply(command, partition, first, replayed=True)
        salt = 0
        # Drafts of a batch whose text an existing note already holds: index -> (note id, version).
        held: dict[int, tuple[str, int]] = {}
        for attempt in range(MAX_ATTEMPTS):
            ids = note_ids_for(command, salt)
            loaded = await store.load(command.user_id, ids)
            states = {i: n.state for i, n in loaded.items()}
            try:
                appends = decide(command, states, ids, self._clock(), skip=frozenset(held))
            except IdCollision:
                salt += 1
                continue
            except EngramError:
                # A copy of this very command (a client retrying eagerly) may have just won the
                # race and caused the refusal: its outcome is the answer, as for any retry.
                if (first := await store.outcome(command.user_id, command.command_id)) is not None:
                    return _reply(command, partition, first, replayed=True)
                raise
            if not any(a.events for a in appends):
                if isinstance(command, SaveNotes):  # every draft was a duplicate
                    return await self._all_held(command, held)
                note = loaded[appends[0].note_id]
                token = channels.format_token(partition, note.position or "0-0")
                return NoteWritten(note_id=appends[0].note_id, version=note.state.version, token=token)
            extra = {"duplicates": [[i, note_id, version] for i, (note_id, version) in sorted(held.items())]}
            result = await store.append(command.user_id, command.command_id, appends, extra)
            if isinstance(result, Appended):
                return _reply(command, partition, result.outcome, replayed=result.replayed)
            if isinstance(result, ContentTaken):
                if (first := await store.outcome(command.user_id, command.command_id)) is not None:
                    return _reply(command, partition, first, replayed=True)  # a copy of it won, as above
                holder = (await store.load(command.user_id, [result.holder]))[result.holder]
                if isinstance(command, SaveNote):
                    token = channels.format_token(partition, holder.position or "0-0")
                    return NoteWritten(note_id=result.holder, version=holder.state.version, token=token, duplicate=True)
                if isinstance(command, SaveNotes):
                    held[ids.index(result.note_id)] = (result.holder, holder.state.version)
                    continue
                raise EngramError(
                    ErrorCode.INVALID_PARAMETER,
                    f"Memory {result.holder} already says this; update or supersede that one instead",
                )
            log.debug("conflict on %s (now v%d), deciding again", result.note_id, result.actual_version)
            await asyncio.sleep(random.uniform(0, 0.001 * min(attempt + 1, 10)))
        raise EngramError(ErrorCode.VERSION_CONFLICT, "the memory kept changing under this command; retry it")

    async def _all_held(self, command: SaveNotes, held: dict[int, tuple[str, int]]) -> NotesWritten:
        loaded = await self._store.load(command.user_id, [note_id for note_id, _ in held.values()])
        position = max((n.position or "0-0" for n in loaded.values()), key=channels.parse_entry_id)
        outcome = Outcome(
            position=position,
            notes=[],
            extra={"duplicates": [[i, note_id, version] for i, (note_id, version) in sorted(held.items())]},
        )
        reply = _reply(command, self._store.partition_of(command.user_id), outcome, replayed=False)
        assert isinstance(reply, NotesWritten)
        return reply


def _reply(command: AnyCommand, partition: int, outcome: Outcome, replayed: bool) -> NoteWritten | NotesWritten:
    token = channels.format_token(partition, outcome.position)
    if isinstance(command, SaveNotes):
        return NotesWritten(notes=_batch_notes(command, outcome), token=token, replayed=replayed)
    if isinstance(command, RecordMessages):  # one message per turn, in the order given
        written = [WrittenNote(note_id=note_id, version=version) for note_id, version in outcome.notes]
        return NotesWritten(notes=written, token=token, replayed=replayed)
    note_id, version = outcome.notes[0]
    superseded_by = command.superseded_by if isinstance(command, SupersedeNote) else None
    return NoteWritten(note_id=note_id, version=version, token=token, replayed=replayed, superseded_by=superseded_by)


def _batch_notes(command: SaveNotes, outcome: Outcome) -> list[WrittenNote]:
    """One entry per draft, in order: the note written for it, or the note that already held its
    text (an existing one, or an earlier draft of the same batch), marked ``duplicate``."""
    held = {int(i): (str(note_id), int(version)) for i, note_id, version in outcome.extra.get("duplicates", [])}
    written = iter(outcome.notes)
    firsts = first_of_each_content(command.notes)
    notes: list[WrittenNote] = []
    for i, first in enumerate(firsts):
        if i in held:
            notes.append(WrittenNote(note_id=held[i][0], version=held[i][1], duplicate=True))
        elif first != i:
            notes.append(msgspec.structs.replace(notes[first], duplicate=True))
        else:
            note_id, version = next(written)
            notes.append(WrittenNote(note_id=note_id, version=version))
    return notes


def error_reply(code: ErrorCode, message: str) -> bytes:
    return _encoder.encode(ErrorReply(code=code, message=message))
