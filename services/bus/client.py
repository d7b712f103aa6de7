"""``EngramClient``: the thin async Python client of the bus. One method per command and query;
returns reply Structs and raises ``EngramError`` for error replies, time-outs and an unreachable bus."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeVar

import msgspec
from redis.exceptions import ClusterDownError, NoPermissionError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import (
    AnyCommand,
    MessageDraft,
    NoteDraft,
    PutNote,
    RecordMessage,
    RecordMessages,
    RenewNote,
    RequestForget,
    RequestForgetSession,
    RequestForgetUser,
    RetractMessage,
    RevertNote,
    SaveNote,
    SaveNotes,
    SupersedeNote,
    UpdateNote,
)
from engram_ledger.contracts.errors import EngramError, ErrorCode, ErrorReply
from engram_ledger.contracts.model import NoteKind, NoteSource, NoteView, Origin
from engram_ledger.contracts.queries import (
    AnyQuery,
    AnyReply,
    BuildContext,
    CategoriesReply,
    ContextReply,
    DiffNotes,
    DiffReply,
    ForgetReply,
    GetHistory,
    GetNote,
    GetNoteByKey,
    HistoryReply,
    ListCategories,
    ListMessages,
    ListNotes,
    ListRecalls,
    ListRecent,
    MessagesReply,
    NoteReply,
    NotesReply,
    NotesWritten,
    NoteWritten,
    RecallsReply,
    SearchNotes,
    SearchReply,
)
from engram_ledger.services.adapters.crypto import MasterKey
from engram_ledger.services.adapters.redis_conn import open_redis, redact_url
from engram_ledger.services.bus.admission import DEFAULT_USER_IN_FLIGHT
from engram_ledger.services.bus.read_your_writes import ReadYourWrites
from engram_ledger.services.bus.requester import BusRequester, client_name_for
from engram_ledger.services.bus.subscription import CLAIM_IDLE_MS, DEFAULT_CONSUMER, Subscription

__all__ = ["EngramClient", "ReadYourWrites", "new_command_id"]

R = TypeVar("R")
_reply_decoder = msgspec.json.Decoder(AnyReply)
_encoder = msgspec.json.Encoder()


# Redis down, restarting, or a cluster failing over: the request may be retried as it is.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError, OSError)


class EngramClient:
    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        cluster: bool = False,
        operator: bool = False,
        client_name: str | None = None,
        user_in_flight: int = DEFAULT_USER_IN_FLIGHT,
    ) -> None:
        """``user_in_flight``: how many requests of one user this client sends at once; more wait
        their turn. The service bounds each user's requests in flight across every client
        (``ENGRAM_USER_IN_FLIGHT``): while other clients hold them, a request is sent again until
        the timeout, then refused ``RATE_LIMITED`` (0: no bound here).
        ``cluster``: ``url`` names a node of a Redis Cluster (as ENGRAM_REDIS_CLUSTER=on).
        ``operator``: commands go to the operators' stream, where a confirmed forget (deleting
        without the second call) is accepted; an agent's client is never one.
        ``client_name``: replies come on channels ``engram:replies:<client_name>:*``, which a
        Redis ACL grants to this client's user alone (services/ops/acl.py); by default the URL's
        user name when it is a valid name (letters, digits, '.', '_', '-'), else none."""
        self.url = url
        self.operator = operator
        self.timeout = timeout
        self.client_name = client_name_for(url, client_name)
        self._redis = open_redis(url, cluster)
        self._bus = BusRequester(self._redis, client_name=self.client_name, user_in_flight=user_in_flight)
        self.partitions = 1

    async def __aenter__(self) -> EngramClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType] | Any) -> None:
        await self.close()

    async def connect(self) -> None:
        try:
            try:
                stored = await self._redis.get(channels.PARTITIONS_KEY)
            except NoPermissionError as e:
                raise self._refused(f"read {channels.PARTITIONS_KEY}", e) from None
            try:
                await self._bus.start()
            except NoPermissionError as e:
                raise self._refused(
                    f"subscribe to its reply channel {self._bus.reply_channel} (a role's user may subscribe to "
                    f"{channels.client_reply_channels('<its name>')} alone: name the client after its ACL user)",
                    e,
                ) from None
        except EngramError:
            await self.close()
            raise
        except UNREACHABLE as e:
            await self.close()
            raise EngramError(
                ErrorCode.UNAVAILABLE, f"cannot reach the Engram bus at {redact_url(self.url)}: {e}"
            ) from None
        if stored is None:
            await self._bus.stop()  # a later connect starts it afresh
            raise EngramError(
                ErrorCode.UNAVAILABLE, f"no Engram service has ever run on {redact_url(self.url)}; start `engram serve`"
            )
        self.partitions = int(stored)

    @property
    def connected(self) -> bool:
        """Whether ``connect`` has succeeded (and ``close`` not been called since)."""
        return self._bus.running

    async def close(self) -> None:
        await self._bus.stop()
        await self._redis.aclose()

    def events(
        self,
        group: str,
        *,
        from_start: bool = False,
        users: Sequence[str] | None = None,
        kinds: Sequence[str | type] | None = None,
        key: MasterKey | None = None,
        consumer: str = DEFAULT_CONSUMER,
        partitions: Sequence[int] | None = None,
        claim_idle_ms: int = CLAIM_IDLE_MS,
    ) -> Subscription:
        """The memory events, typed, through consumer group ``group`` (created on first use, at
        the log's start with ``from_start``): ``async with client.events(...) as events: async for
        delivery in events: ...; await delivery.ack()``. Content only with ``key`` (the master
        key). See ``services/bus/subscription.py``."""
        return Subscription(
            self._redis,
            group,
            from_start=from_start,
            users=users,
            kinds=kinds,
            key=key,
            consumer=consumer,
            partitions=partitions,
            partition_count=self.partitions if self.connected else None,
            claim_idle_ms=claim_idle_ms,
            url=self.url,
        )

    # Commands -------------------------------------------------------------------------------

    async def save(
        self,
        user_id: str,
        content: str,
        *,
        kind: NoteKind | None = None,
        category: str | None = None,
        subject: str | None = None,
        confidence: float | None = None,
        source: NoteSource | None = None,
        importance: float | None = None,
        command_id: str | None = None,
        origin: Origin | None = None,
        advise: bool = True,
        valid_from: datetime | None = None,
        valid_until: datetime | None = None,
        **episode_or_procedure: Any,
    ) -> NoteWritten:
        """Save a note. A field left at None takes the contract's default (``NoteDraft``).
        ``valid_from``/``valid_until``: when what it says held in the world."""
        given: dict[str, Any] = {
            "kind": kind,
            "category": category,
            "confidence": confidence,
            "source": source,
            "importance": importance,
            "valid_from": valid_from,
            "valid_until": valid_until,
        }
        command = SaveNote(
            advise=advise,
            command_id=command_id or new_command_id(),
            user_id=user_id,
            content=content,
            subject=subject,
            origin=origin,
            **{field: value for field, value in given.items() if value is not None},
            **episode_or_procedure,
        )
        return await self.execute(command, NoteWritten)

    async def save_many(
        self, user_id: str, notes: list[NoteDraft], *, command_id: str | None = None, origin: Origin | None = None
    ) -> NotesWritten:
        command = SaveNotes(command_id=command_id or new_command_id(), user_id=user_id, notes=notes, origin=origin)
        return await self.execute(command, NotesWritten)

    async def put(
        self,
        user_id: str,
        category: str,
        key: str,
        value: dict[str, Any],
        *,
        index: list[str] | None = None,
        ttl_seconds: float | None = None,
        expected_version: int | None = None,
        command_id: str | None = None,
        origin: Origin | None = None,
        valid_from: datetime | None = None,
        valid_until: datetime | None = None,
    ) -> NoteWritten:
        """Put ``value`` under ``key`` in ``category``: a new note the first time, an update of
        it after (the same value again changes nothing). ``index``: the fields whose text is
        searched (dotted paths), the whole value by default. ``ttl_seconds``: forget it this
        long after (renewed by ``renew``); None: it never expires."""
        command = PutNote(
            valid_from=valid_from,
            valid_until=valid_until,
            command_id=command_id or new_command_id(),
            user_id=user_id,
            category=category,
            key=key,
            value=value,
            index=index,
            ttl_seconds=ttl_seconds,
            expected_version=expected_version,
            origin=origin,
        )
        return await self.execute(command, NoteWritten)

    async def update(
        self,
        user_id: str,
        note_id: str,
        *,
        content: str | None = None,
        category: str | None = None,
        subject: str | None = None,
        confidence: float | None = None,
        importance: float | None = None,
        expected_version: int | None = None,
        command_id: str | None = None,
        origin: Origin | None = None,
        valid_from: datetime | None = None,
        valid_until: datetime | None = None,
    ) -> NoteWritten:
        command = UpdateNote(
            valid_from=valid_from,
            valid_until=valid_until,
            command_id=command_id or new_command_id(),
            user_id=user_id,
            note_id=note_id,
            content=content,
            category=category,
            subject=subject,
            confidence=confidence,
            importance=importance,
            expected_version=expected_version,
            origin=origin,
        )
        return await self.execute(command, NoteWritten)

    async def supersede(
        self,
        user_id: str,
        note_id: str,
        superseded_by: str,
        *,
        expected_version: int | None = None,
        command_id: str | None = None,
        origin: Origin | None = None,
        close_validity: bool = True,
    ) -> NoteWritten:
        """``close_validity``: what the old note says stops holding where the new one begins."""
        command = SupersedeNote(
            close_validity=close_validity,
            command_id=command_id or new_command_id(),
            user_id=user_id,
            note_id=note_id,
            superseded_by=superseded_by,
            expected_version=expected_version,
            origin=origin,
        )
        return await self.execute(command, NoteWritten)

    async def revert(
        self,
        user_id: str,
        note_id: str,
        to_version: int,
        *,
        expected_version: int | None = None,
        command_id: str | None = None,
        origin: Origin | None = None,
    ) -> NoteWritten:
        """A new version of the note with the content and fields it had at ``to_version``."""
        command = RevertNote(
            command_id=command_id or new_command_id(),
            user_id=user_id,
            note_id=note_id,
            to_version=to_version,
            expected_version=expected_version,
            origin=origin,
        )
        return await self.execute(command, NoteWritten)

    async def record_message(
        self,
        user_id: str,
        session_id: str,
        content: str,
        *,
        role: str = "user",
        speaker: str | None = None,
        sent_at: datetime | None = None,
        item: dict[str, Any] | None = None,
        command_id: str | None = None,
        origin: Origin | None = None,
    ) -> NoteWritten:
        command = RecordMessage(
            item=item,
            command_id=command_id or new_command_id(),
            user_id=user_id,
            session_id=session_id,
            role=role,
            content=content,
            speaker=speaker,
            sent_at=sent_at,
            origin=origin,
        )
        return await self.execute(command, NoteWritten)

    async def record_messages(
        self,
        user_id: str,
        session_id: str,
        messages: Sequence[MessageDraft],
        *,
        command_id: str | None = None,
        origin: Origin | None = None,
    ) -> NotesWritten:
        """Import a transcript of up to 100 turns; the reply's ``notes`` are the new message ids
        in the order given."""
        command = RecordMessages(
            command_id=command_id or new_command_id(),
            user_id=user_id,
            session_id=session_id,
            messages=list(messages),
            origin=origin,
        )
        return await self.execute(command, NotesWritten)

    async def renew(self, user_id: str, note_id: str, *, command_id: str | None = None) -> NoteWritten:
        """Start a note's time to live again from now (nothing for a note without one)."""
        command = RenewNote(command_id=command_id or new_command_id(), user_id=user_id, note_id=note_id)
        return await self.execute(command, NoteWritten)

    async def retract_message(self, user_id: str, message_id: str, *, command_id: str | None = None) -> NoteWritten:
        """Take back a recorded turn: it leaves its conversation's listing and searches."""
        command = RetractMessage(command_id=command_id or new_command_id(), user_id=user_id, message_id=message_id)
        return await self.execute(command, NoteWritten)

    # Queries --------------------------------------------------------------------------------

    async def forget(
        self,
        user_id: str,
        *,
        query: str | None = None,
        note_ids: Sequence[str] = (),
        confirmed: bool = False,
        top_k: int = 5,
        command_id: str | None = None,
        after: str | None = None,
    ) -> ForgetReply:
        """Requirements §1's two calls: a query answers candidates; ids answer ``confirmation_required``
        the first time and ``forgotten`` the second (or at once with ``confirmed``)."""
        command = RequestForget(
            command_id=command_id or new_command_id(),
            user_id=user_id,
            query=query,
            note_ids=list(note_ids),
            confirmed=confirmed,
            top_k=top_k,
            after=after,
        )
        return await self.execute(command, ForgetReply)

    async def forget_user(self, user_id: str, *, confirmed: bool = False, command_id: str | None = None) -> ForgetReply:
        """Erase all of a user's memory: ``confirmation_required`` first, then ``forgotten``
        with the receipt (``forgotten`` ids, ``erased_at``)."""
        command = RequestForgetUser(command_id=command_id or new_command_id(), user_id=user_id, confirmed=confirmed)
        return await self.execute(command, ForgetReply)

    async def forget_session(
        self, user_id: str, session_id: str, *, confirmed: bool = False, command_id: str | None = None
    ) -> ForgetReply:
        """Erase one conversation (every message of ``session_id``): ``confirmation_required``
        first, then ``forgotten`` with the erased message ids."""
        command = RequestForgetSession(
            command_id=command_id or new_command_id(), user_id=user_id, session_id=session_id, confirmed=confirmed
        )
        return await self.execute(command, ForgetReply)

    async def context(
        self,
        user_id: str,
        *,
        format: str = "markdown",
        query: str | None = None,
        max_tokens: int | None = None,
        after: str | None = None,
        update_tool: str | None = "update_memory",
        min_relevance: float | None = None,
        as_of: str | datetime | None = None,
        origin: Origin | None = None,
    ) -> ContextReply:
        """``update_tool``: the tool the agent reading the block changes a memory with (None: it
        has none, and the block names none). ``min_relevance``: as ``search``'s, for ``query``.
        ``as_of``: the block as the memory was then."""
        request = BuildContext(
            origin=origin,
            as_of=_moment(as_of),
            min_relevance=min_relevance,
            user_id=user_id,
            format=format,  # type: ignore[arg-type]
            query=query,
            max_tokens=max_tokens,
            after=after,
            update_tool=update_tool,
        )
        return await self.ask(request, ContextReply)

    async def get_note(
        self, user_id: str, note_id: str, *, after: str | None = None, as_of: str | datetime | None = None
    ) -> NoteView:
        """``as_of``: the note as it was then (a time, or a token a command returned)."""
        query = GetNote(user_id=user_id, note_id=note_id, after=after, as_of=_moment(as_of))
        reply = await self.ask(query, NoteReply)
        return reply.note

    async def recalls(
        self,
        user_id: str,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        session_id: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> RecallsReply:
        """What searches and memory blocks showed the user's agents, newest first (where audited)."""
        query = ListRecalls(user_id=user_id, since=since, until=until, session_id=session_id, limit=limit, after=after)
        return await self.ask(query, RecallsReply)

    async def diff(
        self,
        user_id: str,
        since: str | datetime,
        until: str | datetime | None = None,
        *,
        limit: int = 200,
        after: str | None = None,
    ) -> DiffReply:
        """What changed in the user's notes after ``since`` and up to ``until`` (None: now)."""
        since_ = _moment(since)
        assert since_ is not None
        query = DiffNotes(user_id=user_id, since=since_, until=_moment(until), limit=limit, after=after)
        return await self.ask(query, DiffReply)

    async def get_by_key(self, user_id: str, category: str, key: str, *, after: str | None = None) -> NoteView | None:
        """The active note put under ``key`` in ``category``, or None."""
        try:
            reply = await self.ask(GetNoteByKey(user_id=user_id, category=category, key=key, after=after), NoteReply)
        except EngramError as e:
            if e.code is ErrorCode.MEMORY_NOT_FOUND:
                return None
            raise
        return reply.note

    async def list_categories(
        self, user_id: str, *, prefix: str | None = None, keyed_only: bool = False, after: str | None = None
    ) -> CategoriesReply:
        """The categories holding the user's active notes (``prefix``: it and those under it;
        ``keyed_only``: holding notes put by key)."""
        query = ListCategories(user_id=user_id, prefix=prefix, keyed_only=keyed_only, after=after)
        return await self.ask(query, CategoriesReply)

    async def list_messages(
        self, user_id: str, session_id: str, *, limit: int | None = None, after: str | None = None
    ) -> MessagesReply:
        """A conversation's turns, oldest first (with ``limit``, its latest ``limit``)."""
        return await self.ask(
            ListMessages(user_id=user_id, session_id=session_id, limit=limit, after=after), MessagesReply
        )

    async def history(self, user_id: str, note_id: str, *, after: str | None = None) -> HistoryReply:
        return await self.ask(GetHistory(user_id=user_id, note_id=note_id, after=after), HistoryReply)

    async def list_notes(
        self,
        user_id: str,
        *,
        category: str | None = None,
        category_prefix: str | None = None,
        include_superseded: bool = False,
        where: dict[str, Any] | None = None,
        keyed_only: bool = False,
        offset: int = 0,
        limit: int | None = None,
        after: str | None = None,
        as_of: str | datetime | None = None,
        valid_at: datetime | None = None,
    ) -> NotesReply:
        """``as_of``: the listing as it was then (a time, or a token a command returned);
        ``valid_at``: only notes whose content held in the world then."""
        query = ListNotes(
            valid_at=valid_at,
            as_of=_moment(as_of),
            user_id=user_id,
            category=category,
            category_prefix=category_prefix,
            include_superseded=include_superseded,
            where=where,
            keyed_only=keyed_only,
            offset=offset,
            limit=limit,
            after=after,
        )
        return await self.ask(query, NotesReply)

    async def list_recent(self, user_id: str, *, limit: int = 10, after: str | None = None) -> NotesReply:
        return await self.ask(ListRecent(user_id=user_id, limit=limit, after=after), NotesReply)

    async def search(
        self,
        user_id: str,
        query: str,
        *,
        top_k: int = 5,
        offset: int = 0,
        category: str | None = None,
        category_prefix: str | None = None,
        where: dict[str, Any] | None = None,
        keyed_only: bool = False,
        kind: NoteKind | None = None,
        subject: str | None = None,
        include_superseded: bool = False,
        include_conversation: bool = False,
        session_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        after: str | None = None,
        ranking: str = "relevance",
        min_relevance: float | None = None,
        as_of: str | datetime | None = None,
        valid_at: datetime | None = None,
        origin: Origin | None = None,
    ) -> SearchReply:
        """``min_relevance``: hits below it are left out (None: the service's floor; 0: none).
        ``as_of``: search the memory as it was then (a time, or a token a command returned)."""
        request = SearchNotes(
            origin=origin,
            valid_at=valid_at,
            as_of=_moment(as_of),
            min_relevance=min_relevance,
            since=since,
            until=until,
            ranking=ranking,  # type: ignore[arg-type]
            include_conversation=include_conversation,
            session_id=session_id,
            user_id=user_id,
            query=query,
            top_k=top_k,
            offset=offset,
            category=category,
            category_prefix=category_prefix,
            where=where,
            keyed_only=keyed_only,
            kind=kind,
            subject=subject,
            include_superseded=include_superseded,
            after=after,
        )
        return await self.ask(request, SearchReply)

    # Plumbing -------------------------------------------------------------------------------

    async def execute(self, command: AnyCommand, expect: type[R]) -> R:
        """Send a command. A ``TIMEOUT`` or ``UNAVAILABLE`` error carries its ``command_id``:
        the command may have been applied, and sent again under that id it is applied once."""
        partition = channels.partition_of(command.user_id, self.partitions)
        stream = channels.operator_stream(partition) if self.operator else channels.command_stream(partition)
        try:
            # An operator's commands take no place of the user's: erasing a user who holds all
            # of its places must not wait for them.
            user = None if self.operator else command.user_id
            raw = await self.request_raw(stream, _encoder.encode(command), user=user)
        except EngramError as e:
            if e.code is ErrorCode.TIMEOUT:
                raise EngramError(
                    e.code,
                    f"no reply within {self.timeout:g} s; the command may still be applied: send it again with "
                    f"command_id {command.command_id} (it is applied once, whatever happened)",
                    command_id=command.command_id,
                ) from None
            if e.code is ErrorCode.UNAVAILABLE:
                raise EngramError(e.code, e.message, command_id=command.command_id) from None
            raise
        return _expect(raw, expect)

    async def ask(self, query: AnyQuery, expect: type[R]) -> R:
        partition = channels.partition_of(query.user_id, self.partitions)
        stream = channels.query_stream(partition)
        return _expect(await self.request_raw(stream, _encoder.encode(query), user=query.user_id), expect)

    async def request_raw(self, stream: str, body: bytes, user: str | None = None) -> bytes:
        """Send any bytes to a request stream (through its inbox) and return the raw reply
        (tests send bad input here). ``user``: the user the request is of, whose turn it takes."""
        try:
            return await self._bus.request(stream, body, self.timeout, user)
        except TimeoutError:
            raise EngramError(
                ErrorCode.TIMEOUT,
                f"no reply within {self.timeout:g} s; nothing was changed (is `engram serve` running?)",
            ) from None
        except UNREACHABLE as e:
            raise EngramError(
                ErrorCode.UNAVAILABLE, f"cannot reach the Engram bus at {redact_url(self.url)}: {e}"
            ) from None
        except NoPermissionError as e:
            raise self._refused(f"send to {channels.inbox(stream)}", e) from None

    def _refused(self, what: str, e: NoPermissionError) -> EngramError:
        return EngramError(
            ErrorCode.PERMISSION_DENIED,
            f"the Redis user of {redact_url(self.url)} may not {what}: {e}. See `engram acl` for what each role may do",
        )


def new_command_id() -> str:
    return uuid.uuid4().hex


def _expect(raw: bytes, expect: type[R]) -> R:
    reply = _reply_decoder.decode(raw)
    if isinstance(reply, ErrorReply):
        raise EngramError.from_reply(reply)
    if not isinstance(reply, expect):
        raise EngramError(ErrorCode.STORAGE_ERROR, f"unexpected reply {type(reply).__name__}")
    return reply


def iso(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt else None


def _moment(at: str | datetime | None) -> str | None:
    """An ``as_of`` as the query carries it: a time in ISO 8601 (one without a zone is UTC)."""
    if isinstance(at, datetime):
        return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).isoformat()
    return at
