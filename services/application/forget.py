"""Forgetting (requirements §1): the two-call ``RequestForget``, and the scrubbing that makes a forget
physical beyond the crypto-shredding.

A query finds candidates and deletes nothing. Ids go through the pure decider: the first request
makes a note pending (``ForgetRequested``, with its deadline), the same id again while pending
forgets it (``NoteForgotten``, which destroys its data key in the same atomic append), and a
request after the deadline starts over. The forget saga (``projections/forget_saga.py``) expires
what nobody confirmed.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from contracts import channels
from contracts.commands import RequestForget, RequestForgetSession, RequestForgetUser
from contracts.errors import EngramError, ErrorCode
from contracts.events import (
    ACCOUNT,
    ForgetExpired,
    ForgetRequested,
    NoteForgotten,
    SessionForgotten,
    UserForgotten,
    session_stream,
)
from contracts.queries import ForgetCandidate, ForgetReply, PendingForget, SearchNotes
from projections.access import AccessLog
from projections.forget_saga import pending_notes
from projections.history import HistoryReader
from services.adapters.event_store import Appended, Outcome, RedisEventStore
from services.adapters.redis_conn import servers
from services.application.search import SearchService
from services.bus.reclaimer import group_info
from services.domain.decider import (
    decide,
    decide_forget_session,
    decide_forget_user,
    erasable,
    forgettable,
    note_ids_for,
    session_messages,
)
from services.ops.periodic import every

log = logging.getLogger("engram.forget")

MAX_ATTEMPTS = 32
PREVIEW_CHARS = 120
SCRUB_WAIT_SECONDS = 5.0
# A counter of forgets whose scrub has not yet been made in a quiet moment (see Scrubber).
SCRUB_OWED_KEY = "engram:scrub:owed"
_CLEAR_DEBT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def preview(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


class ForgetService:
    def __init__(
        self,
        redis: Redis,
        store: RedisEventStore,
        history: HistoryReader,
        search: SearchService | None,
        scrubber: Scrubber,
        clock: Callable[[], datetime],
        ttl: timedelta,
        confirmation: bool = True,
        access: AccessLog | None = None,
    ) -> None:
        self._access = access
        self._redis = redis
        self._store = store
        self._history = history
        self._search = search
        self._scrubber = scrubber
        self._clock = clock
        self._ttl = ttl
        self._scrubbing: set[asyncio.Task[None]] = set()
        self._confirmation = confirmation

    async def request(self, command: RequestForget) -> ForgetReply:
        if not self._confirmation and not command.confirmed:
            # ENGRAM_FORGET_CONFIRMATION=off: this deployment asked for one-call deletion.
            command = msgspec.structs.replace(command, confirmed=True)
        if command.query is not None and command.note_ids:
            raise EngramError(ErrorCode.INVALID_PARAMETER, "give either a query or note_ids, not both")
        if command.query is not None:
            return await self._candidates(command)
        if not command.note_ids:
            raise EngramError(ErrorCode.INVALID_PARAMETER, "give a query to find memories, or note_ids to forget")
        store = self._store
        partition = store.partition_of(command.user_id)
        first = await store.outcome(command.user_id, command.command_id)
        if first is not None:
            return await self._replay(command.user_id, first, partition)
        ids = note_ids_for(command)
        for _ in range(MAX_ATTEMPTS):
            # Other pending deletions of this user, as the saga knows them (they lapse).
            others = [i for i in await pending_notes(self._redis, partition, command.user_id) if i not in ids]
            loaded = await store.load(command.user_id, [*ids, *others])
            states = {i: loaded[i].state for i in ids}
            missing = [i for i in ids if not forgettable(states[i])]
            if missing:
                # A copy of this very request may have just forgotten them: answer its outcome.
                if (first := await store.outcome(command.user_id, command.command_id)) is not None:
                    return await self._replay(command.user_id, first, partition)
                raise EngramError(ErrorCode.MEMORY_NOT_FOUND, await self._not_found_message(command.user_id, missing))
            appends = decide(
                command,
                states,
                ids,
                self._clock(),
                forget_ttl=self._ttl,
                pending_elsewhere={i: loaded[i].state for i in others},
            )
            summary = []
            for item in appends:
                last = item.events[-1]
                if isinstance(last, ForgetExpired):
                    summary.append([item.note_id, "lapsed", 0, None])
                elif isinstance(last, NoteForgotten):
                    summary.append([item.note_id, "forgotten", last.request_count, None])
                elif isinstance(last, ForgetRequested):
                    summary.append([item.note_id, "pending", last.request_count, last.expires_at.isoformat()])
            result = await store.append(command.user_id, command.command_id, appends, {"forget": summary})
            if isinstance(result, Appended) and result.replayed:
                # A copy of this request got there first, deciding on the state before it: this
                # decision (say, a confirmation of the pending note it made) never happened.
                return await self._replay(command.user_id, result.outcome, partition)
            if isinstance(result, Appended):
                token = channels.format_token(partition, result.outcome.position)
                reply = _reply(summary, {i: states[i].content for i in ids}, token)
                if reply.forgotten and self._access is not None:
                    await self._access.forget(command.user_id, reply.forgotten)
                if reply.forgotten:
                    await self._scrub_after(token)
                return reply
            await asyncio.sleep(random.uniform(0, 0.005))  # lost a race: spread the retries
        raise EngramError(ErrorCode.VERSION_CONFLICT, "the memory kept changing under this request; retry it")

    async def _replay(self, user_id: str, first: Outcome, partition: int) -> ForgetReply:
        """The first outcome again. No previews are stored with it (they would outlive a forget):
        a pending note's preview is read from the note as it is now."""
        summary = first.extra.get("forget", [])
        pending = [note_id for note_id, status, _, _ in summary if status == "pending"]
        loaded = await self._store.load(user_id, pending) if pending else {}
        contents = {note_id: note.state.content for note_id, note in loaded.items()}
        reply = _reply(summary, contents, channels.format_token(partition, first.position))
        if reply.forgotten:
            await self._scrub_after(reply.token or "")  # the first attempt may have died before its scrub
        return msgspec.structs.replace(reply, replayed=True)

    async def request_user(self, command: RequestForgetUser) -> ForgetReply:
        """Erase a whole user: pending on the account stream first, then every note at once.
        (Always two calls, whatever ENGRAM_FORGET_CONFIRMATION says.)"""
        user = command.user_id
        return await self._erase(
            command, ACCOUNT, lambda count: f"ALL {count} memories (notes and conversation messages) of {user}"
        )

    async def request_session(self, command: RequestForgetSession) -> ForgetReply:
        """Erase one conversation: pending on the session's stream first, then every message of
        the session at once, with a receipt. (Always two calls, as for a user.)"""
        user, session = command.user_id, command.session_id
        return await self._erase(
            command, session_stream(session), lambda count: f"all {count} messages of conversation {session} of {user}"
        )

    async def _erase(
        self, command: RequestForgetUser | RequestForgetSession, control_id: str, what: Callable[[int], str]
    ) -> ForgetReply:
        store = self._store
        partition = store.partition_of(command.user_id)
        first = await store.outcome(command.user_id, command.command_id)
        if first is not None:
            return await self._replay_erase(first, partition, control_id, what)
        for _ in range(MAX_ATTEMPTS):
            ids = await store.note_ids(command.user_id)
            loaded = await store.load(command.user_id, [control_id, *ids])
            notes = {i: loaded[i].state for i in ids}
            control = loaded[control_id].state
            try:
                if isinstance(command, RequestForgetSession):
                    targets = session_messages(command.session_id, notes)
                    appends = decide_forget_session(command, control, notes, self._clock(), self._ttl)
                else:
                    targets = notes
                    appends = decide_forget_user(command, control, notes, self._clock(), self._ttl)
            except EngramError:
                # A copy of this very request may have just erased the session: its outcome answers.
                if (first := await store.outcome(command.user_id, command.command_id)) is not None:
                    return await self._replay_erase(first, partition, control_id, what)
                raise
            last = appends[-1].events[-1]
            summary: dict[str, Any]
            if isinstance(last, UserForgotten | SessionForgotten):
                summary = {"status": "forgotten", "erased": last.erased, "at": last.at.isoformat()}
            else:
                assert isinstance(last, ForgetRequested)
                summary = {
                    "status": "pending",
                    "count": last.request_count,
                    "expires": last.expires_at.isoformat(),
                    "notes": len(erasable(targets)),
                }
            result = await store.append(command.user_id, command.command_id, appends, {"user": summary})
            if isinstance(result, Appended) and result.replayed:
                return await self._replay_erase(result.outcome, partition, control_id, what)  # a copy won
            if isinstance(result, Appended):
                token = channels.format_token(partition, result.outcome.position)
                reply = _erase_reply(control_id, what, summary, token, False)
                if reply.status == "forgotten":
                    if self._access is not None and control_id == ACCOUNT:
                        await self._access.forget(command.user_id)
                    await self._scrub_after(reply.token or "")
                return reply
            await asyncio.sleep(random.uniform(0, 0.005))  # lost a race: spread the retries
        raise EngramError(ErrorCode.VERSION_CONFLICT, "the memory kept changing under this request; retry it")

    async def _replay_erase(
        self, first: Outcome, partition: int, control_id: str, what: Callable[[int], str]
    ) -> ForgetReply:
        token = channels.format_token(partition, first.position)
        reply = _erase_reply(control_id, what, first.extra.get("user", {}), token, True)
        if reply.status == "forgotten":
            await self._scrub_after(reply.token or "")  # the first attempt may have died before its scrub
        return reply

    async def _scrub_after(self, token: str) -> None:
        await self._scrubber.owe()
        task = asyncio.create_task(self._scrub_later(token))
        self._scrubbing.add(task)
        task.add_done_callback(self._scrubbing.discard)

    async def _scrub_later(self, token: str) -> None:
        """After the reply: the read model holds the plaintext until it applies the tombstone,
        and this very request stays pending (sharing a stream node with the handled ones) until
        it is acknowledged; a trim or a rewrite before either would keep old bytes."""
        if not await self._history.wait_for(token, SCRUB_WAIT_SECONDS):
            log.warning("the history had not applied %s after %s s; scrubbing anyway", token, SCRUB_WAIT_SECONDS)
        await self._scrubber.wait_until_acknowledged(SCRUB_WAIT_SECONDS)
        await self._scrubber.scrub()

    async def _candidates(self, command: RequestForget) -> ForgetReply:
        if self._search is None:
            raise EngramError(ErrorCode.UNAVAILABLE, "search is off (ENGRAM_INDEX=off): forget by id")
        assert command.query is not None
        found = await self._search.search(
            SearchNotes(user_id=command.user_id, query=command.query, top_k=command.top_k, after=command.after)
        )
        candidates = [
            ForgetCandidate(note_id=h.note_id, preview=preview(h.content), similarity=h.similarity)
            for h in found.results
        ]
        if not candidates:
            message = f"No memories match {command.query!r}; nothing was deleted."
        else:
            message = (
                f"Found {len(candidates)} memories; nothing was deleted. Ask the user which to delete, "
                "then call forget with its memory_id (twice: the first call asks for confirmation)."
            )
        return ForgetReply(status="candidates", message=message, candidates=candidates)

    async def _not_found_message(self, user_id: str, missing: list[str]) -> str:
        """Requirements §1: an unknown id is 'Memory not found' with suggestions (ids close in spelling,
        else the most recent notes), so the caller can correct a mistyped or made-up id."""
        notes = await self._history.list_notes(user_id, None, True)
        by_id = {n.id: n for n in notes}
        close: list[str] = []
        for note_id in missing:
            close += [i for i in difflib.get_close_matches(note_id, list(by_id), n=3, cutoff=0.5) if i not in close]
        if not close:
            close = [n.id for n in sorted(notes, key=lambda n: n.created_at, reverse=True)[:3]]
        message = f"Memory with ID {', '.join(missing)} not found"
        if close:
            hints = "; ".join(f"{i}: {preview(by_id[i].content)!r}" for i in close)
            message += f". Did you mean: {hints}? Or forget with a query to find the right id."
        return message


def _reply(summary: list[list], contents: dict[str, str], token: str) -> ForgetReply:  # type: ignore[type-arg]
    pending = [
        PendingForget(
            note_id=note_id,
            preview=preview(contents.get(note_id, "")),
            request_count=count,
            expires_at=datetime.fromisoformat(expires),
        )
        for note_id, status, count, expires in summary
        if status == "pending"
    ]
    forgotten = [note_id for note_id, status, _, _ in summary if status == "forgotten"]
    lapsed = [note_id for note_id, status, _, _ in summary if status == "lapsed"]
    if pending:
        asks = "; ".join(f"Delete {p.preview!r} ({p.note_id})?" for p in pending)
        message = f"Please confirm: {asks} Call forget again with the same memory_id to delete it."
        if forgotten:
            message = f"Deleted {', '.join(forgotten)}. " + message
        if lapsed:
            message += f" The earlier request for {', '.join(lapsed)} is withdrawn."
        status = "confirmation_required"
    else:
        message = f"Deleted successfully: {', '.join(forgotten)}. The content cannot be recovered."
        if lapsed:
            message += f" The earlier request for {', '.join(lapsed)} is withdrawn."
        status = "forgotten"
    return ForgetReply(status=status, message=message, pending=pending, forgotten=forgotten, token=token)  # type: ignore[arg-type]


def _erase_reply(control_id: str, what: Callable[[int], str], summary: dict, token: str, replayed: bool) -> ForgetReply:  # type: ignore[type-arg]
    """The reply to erasing a user or a session: the receipt, or the confirmation to ask for.
    ``what`` names what is erased, given how many."""
    if summary.get("status") == "forgotten":
        erased = list(summary["erased"])
        return ForgetReply(
            status="forgotten",
            message=f"Erased {what(len(erased))}. This cannot be undone.",
            forgotten=erased,
            erased_at=datetime.fromisoformat(summary["at"]),
            token=token,
            replayed=replayed,
        )
    described = what(int(summary.get("notes", 0)))
    pending = PendingForget(
        note_id=control_id,
        preview=described,
        request_count=int(summary.get("count", 1)),
        expires_at=datetime.fromisoformat(summary["expires"]),
    )
    return ForgetReply(
        status="confirmation_required",
        message=(f"Please confirm: erase {described}? Send the same request again to erase them for good."),
        pending=[pending],
        token=token,
        replayed=replayed,
    )


class Scrubber:
    """After a forget, removes copies of plaintext the crypto-shredding cannot reach: handled
    request entries (a SaveNote's text sits in the command stream until trimmed; a search's in
    the query stream) and, when Redis keeps an append-only file, its history of old values (a
    rewrite keeps only the current data). Redis frees a stream's entries by whole nodes (up to
    100 entries): a handled entry that shares its node with one still pending keeps its bytes
    until that node goes, and a rewrite before the history applied the tombstone would keep the
    old view. So every forget records a debt (``SCRUB_OWED_KEY``), scrubs at once as well as it
    can, and the debt is settled only by a scrub made in a quiet moment: no command pending and
    the history caught up with the log. Settling runs in every command worker, and a worker
    that starts owes one, since a crash may have cut a scrub short."""

    def __init__(self, redis: Redis, partitions: int, history: HistoryReader, store: RedisEventStore) -> None:
        self._redis = redis
        self._partitions = partitions
        self._history = history
        self._store = store
        self._clear = redis.register_script(_CLEAR_DEBT)

    async def owe(self) -> None:
        await self._redis.incr(SCRUB_OWED_KEY)

    async def wait_until_acknowledged(self, timeout: float) -> None:
        """Until no command is pending (bounded: under load there always is one)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if not await self._commands_pending():
                return
            await asyncio.sleep(0.02)

    async def _commands_pending(self) -> bool:
        for p in range(self._partitions):
            if (await self._redis.xpending(channels.command_stream(p), channels.COMMAND_GROUP))["pending"]:
                return True
        return False

    async def _quiet(self) -> bool:
        if await self._commands_pending():
            return False
        for p in range(self._partitions):
            head, _ = await self._store.log_head(p)
            if head is not None and await self._history.checkpoint(p) < channels.parse_entry_id(head):
                return False
        return True

    async def settle(self) -> bool:
        """Scrub if a scrub is owed and the moment is quiet. True when nothing is owed any more."""
        owed = await self._redis.get(SCRUB_OWED_KEY)
        if owed is None:
            return True
        if not await self._quiet() or not await self.scrub():
            return False
        # Cleared only if no forget added to the debt since it was read.
        return bool(await self._clear(keys=[SCRUB_OWED_KEY], args=[owed]))

    async def run(self, stop: asyncio.Event, interval: float = 1.0) -> None:
        await self.owe()
        await every(interval, stop, self.settle, "settling the scrub after a forget", log)

    async def scrub(self) -> bool:
        """Trim handled request entries and rewrite the AOF. False when it could not finish."""
        try:
            for p in range(self._partitions):
                await trim_handled(self._redis, channels.command_stream(p), channels.COMMAND_GROUP)
                await trim_handled(self._redis, channels.query_stream(p), channels.QUERY_GROUP)
            for server in await servers(self._redis):
                aof = await server("CONFIG GET", "appendonly")
                if aof.get("appendonly") in ("yes", b"yes"):
                    await server("BGREWRITEAOF")
        except ResponseError as e:  # a rewrite already running, CONFIG disabled by ACL: say so
            log.warning("scrubbing after a forget incomplete: %s", e)
            return False
        return True


async def trim_handled(redis: Redis, stream: str, group: str) -> int:
    """Delete the entries every consumer of ``group`` has handled: older than the oldest pending
    one, and not after the last delivered one."""
    info = await group_info(redis, stream, group)
    if info is None:
        return 0
    last = channels.parse_entry_id(info["last-delivered-id"])
    bound = (last[0], last[1] + 1)
    pending = await redis.xpending(stream, group)
    if pending["pending"]:
        oldest = channels.parse_entry_id(pending["min"])
        bound = min(bound, oldest)
    return int(await redis.xtrim(stream, minid=f"{bound[0]}-{bound[1]}", approximate=False))
