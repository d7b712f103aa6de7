"""The command handler's application service: decode, decide, append, reply.

Optimistic concurrency (``unit_of_work``): load the notes' states, decide, append with the
versions seen; if another writer got there first, load and decide again (a command with an
explicit ``expected_version`` is then refused by the decider with ``VERSION_CONFLICT``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import (
    AnyCommand,
    ExpireNote,
    PutNote,
    RecordMessages,
    RequestForget,
    RequestForgetSession,
    RequestForgetUser,
    SaveNote,
    SaveNotes,
    SupersedeNote,
)
from engram_ledger.contracts.errors import EngramError, ErrorCode, ErrorReply
from engram_ledger.contracts.model import NoteStatus
from engram_ledger.contracts.queries import CommandReply, NotesWritten, NoteWritten, WrittenNote
from engram_ledger.services.application import unit_of_work
from engram_ledger.services.application.advice import SaveAdvisor
from engram_ledger.services.application.decoding import decode_request
from engram_ledger.services.application.fair_share import FairShare, turn_in
from engram_ledger.services.application.ports import (
    ContentTaken,
    EventStore,
    HeldDraft,
    LoadedNote,
    Outcome,
    OutcomeDetail,
)
from engram_ledger.services.application.unit_of_work import Decision, Work
from engram_ledger.services.domain.decider import (
    RULES,
    IdCollision,
    creates_notes,
    decide,
    decide_put,
    expired,
    expiry_command_id,
    first_of_each_content,
    note_ids_for,
)
from engram_ledger.services.domain.ids import new_note_id
from engram_ledger.services.domain.note import ABSENT
from engram_ledger.services.domain.values import key_claim

if TYPE_CHECKING:
    from engram_ledger.services.application.forget import ForgetService

_command_decoder = msgspec.json.Decoder(AnyCommand)
_encoder = msgspec.json.Encoder()


def utc_now() -> datetime:
    return datetime.now(UTC)


def decode_command(body: bytes) -> AnyCommand:
    return decode_request(body, _command_decoder, "command")


Handler = Callable[[Any], Awaitable[CommandReply]]

# The forget commands: the forget service's (their events come with the saga's deadlines and
# the scrub of what a forget leaves); a deployment without it answers them UNAVAILABLE.
FORGETTING = (RequestForget, RequestForgetUser, RequestForgetSession, ExpireNote)
# The confirmed ones delete at once: only an operator's stream takes them.
CONFIRMABLE = (RequestForget, RequestForgetUser, RequestForgetSession)


class CommandService:
    """Bus entry point of the command handler: decode, check who may ask it, answer through the
    handler of the command's type (the table ``command_handlers`` builds, in the composition
    root), reply. Domain refusals become error replies; infrastructure failures propagate so the
    message stays pending and is retried."""

    def __init__(self, handlers: Mapping[type, Handler]) -> None:
        self._handlers = handlers

    async def handle(self, body: bytes, operator: bool = False, share: FairShare | None = None) -> bytes:
        """``operator``: the command came on the operators' stream, the one place a confirmed
        forget (no second call) is taken from. ``share``: the handlers this command waits its
        user's turn for (an operator's commands do not wait: an erasure of a flooding user must
        not queue behind the flood)."""
        try:
            command = decode_command(body)
            if isinstance(command, CONFIRMABLE) and command.confirmed and not operator:
                raise EngramError(
                    ErrorCode.INVALID_PARAMETER,
                    "confirmed deletes at once, without the second call: only an operator may ask that "
                    "(engram forget --yes, or EngramClient(..., operator=True)); ask without it and "
                    "confirm with the same request again",
                )
            async with turn_in(share, command.user_id):
                reply = await self.execute(command)
        except EngramError as e:
            reply = e.reply()
        return _encoder.encode(reply)

    async def execute(self, command: AnyCommand) -> CommandReply:
        handler = self._handlers.get(type(command))
        if handler is None:
            served = "forgetting is" if isinstance(command, FORGETTING) else f"{type(command).__name__} is"
            raise EngramError(ErrorCode.UNAVAILABLE, f"{served} not served here")
        return await handler(command)


def command_handlers(
    store: EventStore,
    clock: Callable[[], datetime] = utc_now,
    *,
    advisor: SaveAdvisor | None = None,
    forget: ForgetService | None = None,
) -> dict[type, Handler]:
    """Which handler answers each command: the decider's commands and puts as units of work over
    the store, the forget commands by the forget service, and a save that asks for advice
    followed by the advisor."""
    writer = Writer(store, clock, expire=forget.expire if forget is not None else None)
    handlers: dict[type, Handler] = {command: writer.write for command in RULES if command not in FORGETTING}
    handlers[PutNote] = writer.put
    if forget is not None:
        handlers |= {
            RequestForget: forget.request,
            RequestForgetSession: forget.request_session,
            RequestForgetUser: forget.request_user,
            ExpireNote: forget.expire,
        }
    if advisor is not None:
        handlers[SaveNote] = _advised(writer.write, advisor)
    return handlers


def _advised(write: Handler, advisor: SaveAdvisor) -> Handler:
    async def save(command: SaveNote) -> CommandReply:
        reply = await write(command)
        if command.advise and isinstance(reply, NoteWritten):
            reply = await advisor.advise(reply, command.user_id, command.content, command.subject)
        return reply

    return save


class Writer:
    """The decider's commands, and puts by key, each as one unit of work over the event store."""

    def __init__(
        self,
        store: EventStore,
        clock: Callable[[], datetime] = utc_now,
        expire: Callable[[ExpireNote], Awaitable[NoteWritten]] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self._expire = expire

    async def write(self, command: AnyCommand) -> NoteWritten | NotesWritten:
        return await unit_of_work.run(self.store, command, _Write(self, command))

    async def put(self, command: PutNote) -> NoteWritten | NotesWritten:
        return await unit_of_work.run(self.store, command, _Put(self, command))

    async def expire(self, command: ExpireNote) -> NoteWritten:
        """A note whose time ran out, forgotten as the saga's timer would (a put meeting it)."""
        if self._expire is None:
            raise EngramError(ErrorCode.UNAVAILABLE, "forgetting is not served here")
        return await self._expire(command)


class _Write(Work[NoteWritten | NotesWritten]):
    """Any command the decider's table handles, as one unit of work."""

    def __init__(self, writer: Writer, command: AnyCommand) -> None:
        self._store = writer.store
        self._clock = writer.clock
        self._command = command
        self._partition = self._store.partition_of(command.user_id)
        self._salt = 0
        self._ids: list[str] = []
        # A first attempt of a command that creates its notes reads nothing: one round trip
        # less on nearly every save. Should its ids name notes after all, the append refuses
        # (they are not at version 0) and the next attempt loads them.
        self._presume_new = creates_notes(command)
        # Drafts of a batch whose text an existing note already holds.
        self._held: dict[int, HeldDraft] = {}

    async def decide(self) -> Decision | NoteWritten | NotesWritten:
        command, store = self._command, self._store
        while True:
            self._ids = note_ids_for(command, self._salt)
            if self._presume_new:
                self._presume_new = False
                loaded = dict.fromkeys(self._ids, LoadedNote(state=ABSENT, position=None))
            else:
                loaded = await store.load(command.user_id, self._ids)
            states = {i: n.state for i, n in loaded.items()}
            try:
                appends = decide(command, states, self._ids, self._clock(), skip=frozenset(self._held))
                break
            except IdCollision:
                self._salt += 1  # a derived id is taken: derive the next ones
        held = OutcomeDetail(duplicates=[self._held[i] for i in sorted(self._held)])
        if any(a.events for a in appends):
            return Decision(appends=appends, detail=held)
        if isinstance(command, SaveNotes):  # every draft was a duplicate
            return await self._all_held(command, held)
        # Nothing changes (an update to the values it has): the note as it is.
        note = loaded[appends[0].note_id]
        token = channels.format_token(self._partition, note.position or "0-0")
        return NoteWritten(note_id=appends[0].note_id, version=note.state.version, token=token)

    async def accepted(self, outcome: Outcome, decision: Decision) -> NoteWritten | NotesWritten:
        return _reply(self._command, self._partition, outcome, replayed=False)

    async def replay(self, first: Outcome) -> NoteWritten | NotesWritten:
        return _reply(self._command, self._partition, first, replayed=True)

    async def taken(self, refusal: ContentTaken) -> NoteWritten | None:
        command = self._command
        holder = (await self._store.load(command.user_id, [refusal.holder]))[refusal.holder]
        if isinstance(command, SaveNote):
            token = channels.format_token(self._partition, holder.position or "0-0")
            return NoteWritten(note_id=refusal.holder, version=holder.state.version, token=token, duplicate=True)
        if isinstance(command, SaveNotes):  # leave that draft out and decide again
            index = self._ids.index(refusal.note_id)
            self._held[index] = HeldDraft(index=index, note_id=refusal.holder, version=holder.state.version)
            return None
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"Memory {refusal.holder} already says this; update or supersede that one instead",
        )

    async def _all_held(self, command: SaveNotes, held: OutcomeDetail) -> NotesWritten:
        loaded = await self._store.load(command.user_id, [h.note_id for h in held.duplicates])
        position = max((n.position or "0-0" for n in loaded.values()), key=channels.parse_entry_id)
        reply = _reply(command, self._partition, Outcome(position=position, notes=[], detail=held), replayed=False)
        assert isinstance(reply, NotesWritten)
        return reply


# How often a put reads who holds its key before giving up: each read after the first follows a
# note that expired or was forgotten meanwhile (which gave the key back).
HOLDER_READS = 8


class _Put(Work[NoteWritten | NotesWritten]):
    """A put by key: the note holding the key is found by its claim in the event store (the
    authority, not a read model), then updated; with none, a new note claims the key. Two puts
    racing on a new key: one claim wins, the other decides again and updates the winner."""

    replay_first = True  # it forgets an expired holder before deciding

    def __init__(self, writer: Writer, command: PutNote) -> None:
        self._writer = writer
        self._store = writer.store
        self._clock = writer.clock
        self._command = command
        self._partition = self._store.partition_of(command.user_id)
        self._salt = 0

    async def decide(self) -> Decision | NoteWritten:
        command, store = self._command, self._store
        user_id, now = command.user_id, self._clock()
        claim = key_claim(command.category, command.key)
        for _ in range(HOLDER_READS):
            holder = await store.content_holder(user_id, claim)
            if holder is None:
                break
            held = (await store.load(user_id, [holder]))[holder]
            if expired(held.state, now):
                # Its time ran out and the saga's timer has not come by yet: forget it as the
                # timer would, so this put makes a new note instead of reviving the old one.
                expire = ExpireNote(command_id=expiry_command_id(holder, held.state), user_id=user_id, note_id=holder)
                await self._writer.expire(expire)
                continue
            if held.state.status is NoteStatus.ACTIVE and held.state.key == command.key:
                return self._decided(holder, held)
            # Forgotten or superseded between the two reads: its append gave the key back.
        else:
            raise EngramError(ErrorCode.VERSION_CONFLICT, f"key {command.key!r} kept changing hands; retry the put")
        while True:
            note_id = new_note_id(user_id, command.command_id, 0, self._salt)
            loaded = (await store.load(user_id, [note_id]))[note_id]
            if not loaded.state.exists:
                return self._decided(note_id, loaded)
            self._salt += 1  # a derived id is taken: derive the next one

    def _decided(self, note_id: str, loaded: LoadedNote) -> Decision | NoteWritten:
        appends = decide_put(self._command, note_id, loaded.state, self._clock())
        if appends[0].events:
            return Decision(appends=appends)
        token = channels.format_token(self._partition, loaded.position or "0-0")
        return NoteWritten(note_id=note_id, version=loaded.state.version, token=token)

    async def accepted(self, outcome: Outcome, decision: Decision) -> NoteWritten:
        return _one(outcome, self._partition, replayed=False)

    async def replay(self, first: Outcome) -> NoteWritten:
        return _one(first, self._partition, replayed=True)

    async def taken(self, refusal: ContentTaken) -> None:
        return None  # another put claimed the key first: decide again, as an update of it


def _one(outcome: Outcome, partition: int, replayed: bool) -> NoteWritten:
    note_id, version = outcome.notes[0]
    return NoteWritten(
        note_id=note_id, version=version, token=channels.format_token(partition, outcome.position), replayed=replayed
    )


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
    held = {h.index: h for h in outcome.detail.duplicates}
    written = iter(outcome.notes)
    firsts = first_of_each_content(command.notes)
    notes: list[WrittenNote] = []
    for i, first in enumerate(firsts):
        if i in held:
            notes.append(WrittenNote(note_id=held[i].note_id, version=held[i].version, duplicate=True))
        elif first != i:
            notes.append(msgspec.structs.replace(notes[first], duplicate=True))
        else:
            note_id, version = next(written)
            notes.append(WrittenNote(note_id=note_id, version=version))
    return notes


def error_reply(code: ErrorCode, message: str) -> bytes:
    return _encoder.encode(ErrorReply(code=code, message=message))
