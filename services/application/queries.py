"""The query responders' application service: decode, wait for the caller's token, read the
history read model, reply. Another user's note answers MEMORY_NOT_FOUND, exactly like a missing one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec

from engram_ledger.contracts.channels import parse_entry_id
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import LIST_NOTES_MAX
from engram_ledger.contracts.model import NoteChange, NoteStatus, NoteView
from engram_ledger.contracts.queries import (
    AnyQuery,
    BuildContext,
    CategoriesReply,
    DiffNotes,
    DiffReply,
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
    QueryReply,
    RecallsReply,
    SearchNotes,
)
from engram_ledger.services.application.as_of import Moment, changes_between, holds_at, in_categories
from engram_ledger.services.application.context import ContextService
from engram_ledger.services.application.decoding import decode_request
from engram_ledger.services.application.fair_share import FairShare, turn_in
from engram_ledger.services.application.past import listing_then, moment_of, page_then, reads_past
from engram_ledger.services.application.ports import AccessStats, ListingPage, NoteHistory, PastReader
from engram_ledger.services.application.reads import counted, read_at
from engram_ledger.services.application.search import SearchService, lapsed
from engram_ledger.services.common.stages import profiled, stage
from engram_ledger.services.domain.values import check_where, matches

_query_decoder = msgspec.json.Decoder(AnyQuery)
_encoder = msgspec.json.Encoder()


def decode_query(body: bytes) -> AnyQuery:
    return decode_request(body, _query_decoder, "query")


def _not_found(note_id: str) -> EngramError:
    return EngramError(ErrorCode.MEMORY_NOT_FOUND, f"Memory with ID {note_id} not found")


Handler = Callable[[Any], Awaitable[QueryReply]]


class QueryService:
    """Bus entry point of the query responders: decode, answer through the handler of the
    query's type (the table ``query_handlers`` builds, in the composition root), reply."""

    def __init__(self, handlers: Mapping[type, Handler]) -> None:
        self._handlers = handlers

    async def handle(self, body: bytes, share: FairShare | None = None) -> bytes:
        """``share``: the handlers this query waits its user's turn for."""
        with profiled():
            try:
                with stage("request decode"):
                    query = decode_query(body)
                async with turn_in(share, query.user_id):
                    reply: QueryReply = await self.ask(query)
            except EngramError as e:
                reply = e.reply()
            with stage("reply encode"):
                return _encoder.encode(reply)

    async def ask(self, query: AnyQuery) -> QueryReply:
        handler = self._handlers.get(type(query))
        if handler is None:
            raise EngramError(ErrorCode.UNAVAILABLE, f"{type(query).__name__} is not served here")
        return await handler(query)


def query_handlers(
    history: NoteHistory,
    read_wait_seconds: float,
    search: SearchService | None = None,
    context: ContextService | None = None,
    access: AccessStats | None = None,
    recall_queries: Callable[[str, list[str]], Awaitable[dict[str, str | None]]] | None = None,
    past: PastReader | None = None,
) -> dict[type, Handler]:
    """Which handler answers each query. The read model's queries (and the memory block) first
    wait for the caller's token; a search waits for the index and the read model itself.
    ``past``: what readings of the past (``as_of``, diffs) read (None: they are refused)."""
    reads = ReadModelQueries(history, read_wait_seconds, access, recall_queries, past)
    handlers: dict[type, Handler] = {
        GetNote: reads.caught_up(reads.get_note),
        GetNoteByKey: reads.caught_up(reads.get_by_key),
        GetHistory: reads.caught_up(reads.history),
        ListNotes: _checked_where(reads.caught_up(reads.list_notes)),
        ListCategories: reads.caught_up(reads.list_categories),
        ListMessages: reads.caught_up(reads.list_messages),
        ListRecent: reads.caught_up(reads.list_recent),
        DiffNotes: reads.caught_up(reads.diff),
        ListRecalls: reads.caught_up(reads.recalls),
    }
    off = "search is off in this deployment (ENGRAM_INDEX=off)"
    handlers[SearchNotes] = _checked_where(search.search if search is not None else _refused(off))
    refused = _refused("this service builds no memory blocks")
    handlers[BuildContext] = reads.caught_up(context.build if context is not None else refused)
    return handlers


def _filtered_page(query: ListNotes, notes: list[NoteView], limit: int) -> NotesReply:
    """A page of a listing read whole, after the filters only its notes can answer (keys,
    values, when they held)."""
    if query.keyed_only:
        notes = [n for n in notes if n.key is not None]
    if query.where:
        notes = [n for n in notes if matches(n.value, query.where)]
    if query.valid_at is not None:
        notes = [n for n in notes if holds_at(n, query.valid_at)]
    return NotesReply(notes=notes[query.offset : query.offset + limit], total=len(notes))


def _place(change: NoteChange) -> tuple[int, int]:
    """A change's log position (a forget's is not kept: first among changes at its time)."""
    position = change.after.position if change.after is not None else None
    return parse_entry_id(position) if position else (0, 0)


def _refused(message: str) -> Handler:
    """The handler of a query this deployment does not serve."""

    async def refuse(query: Any) -> QueryReply:
        raise EngramError(ErrorCode.UNAVAILABLE, message)

    return refuse


def _checked_where(handler: Handler) -> Handler:
    async def checked(query: ListNotes | SearchNotes) -> QueryReply:
        if query.where:
            check_where(query.where)
        return await handler(query)

    return checked


class ReadModelQueries:
    """The queries the history read model answers. Another user's note answers
    MEMORY_NOT_FOUND, exactly like a missing one."""

    def __init__(
        self,
        history: NoteHistory,
        read_wait_seconds: float,
        access: AccessStats | None = None,
        recall_queries: Callable[[str, list[str]], Awaitable[dict[str, str | None]]] | None = None,
        past: PastReader | None = None,
    ) -> None:
        """``recall_queries``: opens recalls' queries (the event store's; None: none shown);
        ``past``: what readings of the past read (None: they are refused)."""
        self._history = history
        self._past = past
        self._wait = read_wait_seconds
        self._access = access
        self._recall_queries = recall_queries

    def caught_up(self, handler: Handler) -> Handler:
        """``handler``, once the read model has reached the query's ``after`` token."""

        async def after_token(query: Any) -> QueryReply:
            if query.after is not None and not await self._history.wait_for(query.after, self._wait):
                raise EngramError(
                    ErrorCode.TIMEOUT,
                    f"the read model has not reached token {query.after} within {self._wait:g} s; retry later",
                )
            return await handler(query)

        return after_token

    async def get_note(self, query: GetNote) -> NoteReply:
        if query.as_of is not None:
            return NoteReply(note=await self._note_as_of(query.user_id, query.note_id, query.as_of))
        view = await self._history.get_note(query.user_id, query.note_id)
        if view is None:
            raise _not_found(query.note_id)
        return await self._seen(query, view)

    def _moment(self, user_id: str, text: str, name: str = "as_of") -> Moment:
        return moment_of(reads_past(self._past), user_id, text, name)

    async def _note_as_of(self, user_id: str, note_id: str, as_of: str) -> NoteView:
        moment = self._moment(user_id, as_of)
        view = (await reads_past(self._past).notes_at(user_id, [note_id], moment)).get(note_id)
        if view is None:
            raise EngramError(ErrorCode.MEMORY_NOT_FOUND, f"Memory with ID {note_id} did not exist at {as_of}")
        return view

    async def _listing_as_of(self, query: ListNotes, limit: int) -> NotesReply:
        """The listing as it was at ``query.as_of``; only the page's notes are read, unless a
        filter on values needs them all."""
        assert query.as_of is not None
        moment, past = self._moment(query.user_id, query.as_of), reads_past(self._past)
        filtered = query.category or query.category_prefix or query.where or query.keyed_only or query.valid_at
        if not filtered:
            # The whole listing: a page, read without the rest.
            shown = await page_then(past, query.user_id, moment, query.include_superseded, query.offset, limit)
            return NotesReply(notes=shown.notes, total=shown.total)
        then = await listing_then(past, query.user_id, moment, query.include_superseded)
        order = [e for e in then.order if in_categories(e.category, query.category, query.category_prefix)]
        if not (query.where or query.keyed_only or query.valid_at):
            page = order[query.offset : query.offset + limit]
            return NotesReply(notes=await then.views(past, query.user_id, page), total=len(order))
        return _filtered_page(query, await then.views(past, query.user_id, order), limit)

    async def recalls(self, query: ListRecalls) -> RecallsReply:
        if query.since is not None and query.until is not None and query.until < query.since:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER,
                f"until ({query.until.isoformat()}) is before since ({query.since.isoformat()})",
            )
        found = await self._history.recalls(query.user_id, query.since, query.until, query.session_id, query.limit)
        if self._recall_queries is not None and found:
            queries = await self._recall_queries(query.user_id, [r.recall_id for r in found])
            found = [msgspec.structs.replace(r, query=queries.get(r.recall_id)) for r in found]
        return RecallsReply(recalls=found)

    async def diff(self, query: DiffNotes) -> DiffReply:
        past, user_id = reads_past(self._past), query.user_id
        since = self._moment(user_id, query.since, "since")
        until = self._moment(user_id, query.until, "until") if query.until is not None else None
        if until is not None and until.at < since.at:
            raise EngramError(ErrorCode.INVALID_PARAMETER, f"until ({query.until}) is before since ({query.since})")
        found = await past.histories(user_id, await past.changed_since(user_id, since.ms))
        changes = [c for view, versions in found.values() for c in changes_between(view, versions, since, until)]
        changes.sort(key=lambda c: (c.at, _place(c), c.note_id, c.version))
        return DiffReply(changes=changes[: query.limit], truncated=len(changes) > query.limit)

    async def get_by_key(self, query: GetNoteByKey) -> NoteReply:
        view = await self._history.get_by_key(query.user_id, query.category, query.key)
        if view is None or lapsed(view, datetime.now(UTC)):
            raise EngramError(
                ErrorCode.MEMORY_NOT_FOUND, f"No memory holds key {query.key!r} in category {query.category}"
            )
        return await self._seen(query, view)

    async def _seen(self, query: GetNote | GetNoteByKey, view: NoteView) -> NoteReply:
        """A note read now: with its reads, this one counted (unless the console is looking)."""
        if self._access is None or view.status is NoteStatus.FORGOTTEN:
            return NoteReply(note=view)
        (view,) = await self._access.annotate(query.user_id, [view])
        if counted(query.origin):
            now = datetime.now(UTC)
            await self._access.touch(query.user_id, [view.id], now)
            view = read_at(view, now)
        return NoteReply(note=view)

    async def _with_reads(self, user_id: str, reply: NotesReply) -> NotesReply:
        """A listing of the present shows each note's reads, and counts none."""
        if self._access is None:
            return reply
        return NotesReply(notes=await self._access.annotate(user_id, reply.notes), total=reply.total)

    async def history(self, query: GetHistory) -> HistoryReply:
        found = await self._history.history(query.user_id, query.note_id)
        if found is None:
            raise _not_found(query.note_id)
        view, versions = found
        return HistoryReply(note_id=view.id, status=view.status.value, versions=versions)

    async def list_notes(self, query: ListNotes) -> NotesReply:
        if query.as_of is not None:
            return await self._listing(query)
        return await self._with_reads(query.user_id, await self._listing(query))

    async def _listing(self, query: ListNotes) -> NotesReply:
        history = self._history
        # A page, never the whole listing: without a limit, the largest one a query may ask for.
        limit = query.limit if query.limit is not None else LIST_NOTES_MAX
        now = datetime.now(UTC)
        if query.valid_at is not None:
            # What held at a time may have been superseded since: it is listed too.
            query = msgspec.structs.replace(query, include_superseded=True)
        if query.as_of is not None:
            return await self._listing_as_of(query, limit)
        if not query.where and not query.keyed_only and query.valid_at is None:
            # Only the page is read when the listing alone says which notes are on it.
            asked = ListingPage(
                category=query.category,
                include_superseded=query.include_superseded,
                category_prefix=query.category_prefix,
                offset=query.offset,
                limit=limit,
                now=now,
            )
            page = await history.list_page(query.user_id, asked)
            if page is not None:
                return NotesReply(notes=page[0], total=page[1])
        notes = await history.list_notes(query.user_id, query.category, query.include_superseded, query.category_prefix)
        return _filtered_page(query, [n for n in notes if not lapsed(n, now)], limit)

    async def list_categories(self, query: ListCategories) -> CategoriesReply:
        return CategoriesReply(categories=await self._history.categories(query.user_id, query.prefix, query.keyed_only))

    async def list_messages(self, query: ListMessages) -> MessagesReply:
        messages, total = await self._history.messages(query.user_id, query.session_id, query.limit)
        return MessagesReply(messages=messages, total=total)

    async def list_recent(self, query: ListRecent) -> NotesReply:
        notes, total = await self._history.list_recent(query.user_id, query.limit)
        now = datetime.now(UTC)
        live = [n for n in notes if not lapsed(n, now)]
        return await self._with_reads(query.user_id, NotesReply(notes=live, total=total - (len(notes) - len(live))))
