"""The fault suite's workload and its checks, shared by the worker-kill and cluster tests.

Each user is an actor issuing its commands one after another (so per-user order is defined),
retrying a command that got no reply with the same ``command_id``, as a caller must. The actors
run side by side while the test breaks things. Updates carry ``expected_version``: a duplicated
or lost write would surface as a VERSION_CONFLICT.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import AnyCommand, RequestForget, SaveNote, UpdateNote
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.queries import ForgetReply, NoteWritten
from engram_ledger.services.adapters.event_store import decode_event
from engram_ledger.services.bus.client import EngramClient

# Errors that mean "no answer": the command may or may not have been applied; retry it as it is.
RETRYABLE = {ErrorCode.TIMEOUT, ErrorCode.UNAVAILABLE}


@dataclass
class Note:
    version: int
    content: str


@dataclass
class Actor:
    """One user's scripted session and what the service answered it."""

    user: str
    rng: random.Random
    notes: dict[str, Note] = field(default_factory=dict)
    forgotten: dict[str, str] = field(default_factory=dict)  # note id -> its last content
    pending: dict[str, datetime] = field(default_factory=dict)  # note id -> deadline
    replied: dict[str, AnyCommand] = field(default_factory=dict)  # command id -> command
    replies: dict[str, Any] = field(default_factory=dict)  # command id -> the first reply
    texts: dict[str, list[str]] = field(default_factory=dict)  # note id -> every content it had
    sent: list[AnyCommand] = field(default_factory=list)
    last_token: str | None = None
    retries: int = 0

    def next_command(self, step: int) -> AnyCommand:
        roll = self.rng.random()
        cid = f"{self.user}-{step}"
        if self.pending and roll < 0.35:
            # The second call for the pending note: it is deleted.
            return RequestForget(command_id=cid, user_id=self.user, note_ids=[next(iter(self.pending))])
        if len(self.notes) >= 2 and roll < 0.45 and not self.pending:
            return RequestForget(command_id=cid, user_id=self.user, note_ids=[self.rng.choice(sorted(self.notes))])
        updatable = sorted(set(self.notes) - set(self.pending))
        if updatable and roll < 0.7:
            note_id = self.rng.choice(updatable)
            return UpdateNote(
                command_id=cid,
                user_id=self.user,
                note_id=note_id,
                content=f"{self.user} secret {step} changed {self.rng.getrandbits(40):x}",
                expected_version=self.notes[note_id].version,
            )
        return SaveNote(
            command_id=cid,
            user_id=self.user,
            content=f"{self.user} secret {step} saved {self.rng.getrandbits(40):x}",
            advise=False,
        )

    def record(self, command: AnyCommand, reply: Any) -> None:
        self.replied[command.command_id] = command
        self.replies[command.command_id] = reply
        if isinstance(command, SaveNote):
            assert isinstance(reply, NoteWritten) and reply.version == 1
            self.notes[reply.note_id] = Note(1, command.content)
            self.texts[reply.note_id] = [command.content]
        elif isinstance(command, UpdateNote):
            assert isinstance(reply, NoteWritten) and reply.version == self.notes[command.note_id].version + 1
            self.notes[command.note_id] = Note(reply.version, command.content or "")
            self.texts[command.note_id].append(command.content or "")
        elif isinstance(command, RequestForget):
            assert isinstance(reply, ForgetReply)
            note_id = command.note_ids[0]
            if reply.status == "forgotten":
                self.forgotten[note_id] = self.notes.pop(note_id).content
                self.pending.pop(note_id, None)
            else:
                assert reply.status == "confirmation_required", reply
                self.pending[note_id] = reply.pending[0].expires_at
                self.notes[note_id].version += 1  # ForgetRequested is an event of the note
        self.last_token = reply.token


async def send(client: EngramClient, actor: Actor, command: AnyCommand, deadline: float, duplicate: bool) -> Any:
    """Until a reply: the same command again after every silence. ``duplicate`` sends it twice at
    once, as a client retrying too eagerly would."""
    expect: type[Any] = ForgetReply if isinstance(command, RequestForget) else NoteWritten

    async def once() -> Any:
        if duplicate:
            first, second = await asyncio.gather(
                client.execute(command, expect), client.execute(command, expect), return_exceptions=True
            )
            if isinstance(first, BaseException) or isinstance(second, BaseException):
                raise first if isinstance(first, BaseException) else second  # type: ignore[misc]
            # One of the two is the first outcome, the other its replay: the same answer.
            same = msgspec.structs.replace(second, replayed=first.replayed)
            assert same == first, f"two copies of one command answered differently: {first} / {second}"
            return first
        return await client.execute(command, expect)

    def retried() -> None:
        actor.retries += 1

    return await answered(once, deadline, f"a reply to {command.command_id}", retried)


async def run_actor(
    client: EngramClient,
    actor: Actor,
    steps: int,
    deadline: float,
    progress: Callable[[], None],
    pause: float = 0.0,
) -> None:
    """``pause``: the mean think time between two commands, so that a load lasts long enough
    for the faults to land in the middle of it."""
    for step in range(steps):
        await asyncio.sleep(actor.rng.uniform(0, 2 * pause))  # think time: paces the load
        command = actor.next_command(step)
        actor.sent.append(command)
        reply = await send(client, actor, command, deadline, duplicate=actor.rng.random() < 0.1)
        actor.record(command, reply)
        progress()
        if actor.rng.random() < 0.2 and actor.notes:
            # Read-your-writes through the faults: the token names the write just made.
            note_id = actor.rng.choice(sorted(actor.notes))
            view = await retry_read(
                lambda n=note_id: client.get_note(actor.user, n, after=actor.last_token),  # type: ignore[misc]
                deadline,
            )
            assert (view.version, view.content) == (actor.notes[note_id].version, actor.notes[note_id].content), (
                view,
                actor.notes[note_id],
            )


async def retry_read(read: Callable[[], Awaitable[Any]], deadline: float) -> Any:
    return await answered(read, deadline, "an answer to a read")


async def answered(
    ask: Callable[[], Awaitable[Any]], deadline: float, what: str, retried: Callable[[], None] = lambda: None
) -> Any:
    """``ask``'s answer, asked again after every silence (a RETRYABLE error: the command may or
    may not have been applied, and the same one again is applied once) until ``deadline`` (the
    event loop's time); then the silence itself, saying for how long it lasted."""
    loop = asyncio.get_running_loop()
    since = loop.time()
    while True:
        try:
            return await ask()
        except EngramError as e:
            if e.code not in RETRYABLE:
                raise
            if loop.time() > deadline:
                e.add_note(f"{what}: asked for {loop.time() - since:.1f} s without an answer")
                raise
            retried()
        await asyncio.sleep(0.1)  # a caller's pause before it asks again


async def log_events(redis: aioredis.Redis, partitions: int) -> list[Any]:
    events = []
    for p in range(partitions):
        events += [decode_event(fields[b"e"]) for _, fields in await redis.xrange(channels.event_log(p))]
    return events


async def check_log(redis: aioredis.Redis, partitions: int, actors: list[Actor]) -> None:
    """Every replied command exactly once in the log, nothing unsent, per-note versions gapless."""
    events = await log_events(redis, partitions)
    by_command = Counter(e.command_id for e in events)
    sent = {c.command_id for a in actors for c in a.sent}
    replied = {cid for a in actors for cid in a.replied}
    wrong = {cid: by_command[cid] for cid in replied if by_command[cid] != 1}
    details = [(type(e).__name__, e.note_id, e.version) for e in events if e.command_id in wrong]
    assert wrong == {}, f"replied commands not exactly once in the log: {wrong} {details[:6]}"
    unknown = {cid for cid in by_command if cid not in sent and not cid.startswith("expire-forget-")}
    assert unknown == set(), f"events of commands nobody sent: {sorted(unknown)[:5]}"
    versions: dict[tuple[str, str], list[int]] = {}
    for e in events:
        versions.setdefault((e.user_id, e.note_id), []).append(e.version)
    gaps = {k: v for k, v in versions.items() if v != list(range(1, len(v) + 1))}
    assert gaps == {}, f"per-note versions not gapless and increasing: {list(gaps.items())[:3]}"


async def check_read_model(client: EngramClient, actors: list[Actor]) -> None:
    """What each actor was told is what the read model holds: no lost, duplicate or stray note."""
    for actor in actors:
        listing = await client.list_notes(actor.user, include_superseded=True, after=actor.last_token)
        ids = [n.id for n in listing.notes]
        assert len(ids) == len(set(ids)), "a note listed twice"
        assert set(ids) == set(actor.notes), (actor.user, sorted(ids), sorted(actor.notes))
        for view in listing.notes:
            assert (view.version, view.content) == (actor.notes[view.id].version, actor.notes[view.id].content)
        for note_id in actor.forgotten:
            gone = await client.get_note(actor.user, note_id)
            assert gone.status == "forgotten" and not gone.content
