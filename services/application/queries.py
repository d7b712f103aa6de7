"""The query responders' application service: decode, wait for the caller's token, read the
history read model, reply. Another user's note answers MEMORY_NOT_FOUND, exactly like a missing one."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import LIST_NOTES_MAX
from engram_ledger.contracts.model import NoteStatus
from engram_ledger.contracts.queries import (
    AnyQuery,
    BuildContext,
    CategoriesReply,
    ContextReply,
    GetHistory,
    GetNote,
    GetNoteByKey,
    HistoryReply,
    ListCategories,
    ListMessages,
    ListNotes,
    ListRecent,
    MessagesReply,
    NoteReply,
    NotesReply,
    QueryReply,
    SearchNotes,
    SearchReply,
)
from engram_ledger.services.application.context import ContextService
from engram_ledger.services.application.decoding import decode_request
from engram_ledger.services.application.ports import AccessStats, NoteHistory
from engram_ledger.services.application.search import SearchService, lapsed
from engram_ledger.services.domain.values import check_where, matches

_query_decoder = msgspec.json.Decoder(AnyQuery)
_encoder = msgspec.json.Encoder()


def decode_query(body: bytes) -> AnyQuery:
    return decode_request(body, _query_decoder, "query")


def _not_found(note_id: str) -> EngramError:
    return EngramError(ErrorCode.MEMORY_NOT_FOUND, f"Memory with ID {note_id} not found")


class QueryService:
    def __init__(
        self,
        history: NoteHistory,
        read_wait_seconds: float,
        search: SearchService | None = None,
        context: ContextService | None = None,
        access: AccessStats | None = None,
    ) -> None:
        self._access = access
        self._history = history
        self._wait = read_wait_seconds
        self._search = search
        self._context = context

    async def handle(self, body: bytes) -> bytes:
        try:
            reply: QueryReply = await self.ask(decode_query(body))
        except EngramError as e:
            reply = e.reply()
        return _encoder.encode(reply)

    async def ask(
        self, query: AnyQuery
    ) -> NoteReply | HistoryReply | NotesReply | CategoriesReply | MessagesReply | SearchReply | ContextReply:
        if isinstance(query, ListNotes | SearchNotes) and query.where:
            check_where(query.where)
        if isinstance(query, SearchNotes):
            if self._search is None:
                raise EngramError(ErrorCode.UNAVAILABLE, "search is off in this deployment (ENGRAM_INDEX=off)")
            return await self._search.search(query)
        if query.after is not None and not await self._history.wait_for(query.after, self._wait):
            raise EngramError(
                ErrorCode.TIMEOUT,
                f"the read model has not reached token {query.after} within {self._wait:g} s; retry later",
            )
        history = self._history
        if isinstance(query, GetNote | GetNoteByKey):
            if isinstance(query, GetNote):
                view = await history.get_note(query.user_id, query.note_id)
                if view is None:
                    raise _not_found(query.note_id)
            else:
                view = await history.get_by_key(query.user_id, query.category, query.key)
                if view is None or lapsed(view, datetime.now(UTC)):
                    raise EngramError(
                        ErrorCode.MEMORY_NOT_FOUND, f"No memory holds key {query.key!r} in category {query.category}"
                    )
            if self._access is not None and view.status is not NoteStatus.FORGOTTEN:
                (view,) = await self._access.annotate(query.user_id, [view])
                await self._access.touch(query.user_id, [view.id], datetime.now(UTC))
            return NoteReply(note=view)
        if isinstance(query, GetHistory):
            found = await history.history(query.user_id, query.note_id)
            if found is None:
                raise _not_found(query.note_id)
            view, versions = found
            return HistoryReply(note_id=view.id, status=view.status.value, versions=versions)
        if isinstance(query, ListNotes):
            # A page, never the whole listing: without a limit, the largest one a query may ask for.
            limit = query.limit if query.limit is not None else LIST_NOTES_MAX
            now = datetime.now(UTC)
            if not query.where and not query.keyed_only:
                # Only the page is read when the listing alone says which notes are on it.
                page = await history.list_page(
                    query.user_id,
                    query.category,
                    query.include_superseded,
                    query.category_prefix,
                    query.offset,
                    limit,
                    now,
                )
                if page is not None:
                    return NotesReply(notes=page[0], total=page[1])
            notes = await history.list_notes(
                query.user_id, query.category, query.include_superseded, query.category_prefix
            )
            notes = [n for n in notes if not lapsed(n, now)]
            if query.keyed_only:
                notes = [n for n in notes if n.key is not None]
            if query.where:
                notes = [n for n in notes if matches(n.value, query.where)]
            return NotesReply(notes=notes[query.offset : query.offset + limit], total=len(notes))
        if isinstance(query, ListCategories):
            return CategoriesReply(categories=await history.categories(query.user_id, query.prefix, query.keyed_only))
        if isinstance(query, ListMessages):
            messages, total = await history.messages(query.user_id, query.session_id, query.limit)
            return MessagesReply(messages=messages, total=total)
        if isinstance(query, ListRecent):
            notes, total = await history.list_recent(query.user_id, query.limit)
            now = datetime.now(UTC)
            live = [n for n in notes if not lapsed(n, now)]
            return NotesReply(notes=live, total=total - (len(notes) - len(live)))
        if isinstance(query, BuildContext):
            if self._context is None:
                raise EngramError(ErrorCode.UNAVAILABLE, "this service builds no memory blocks")
            return await self._context.build(query)
        raise TypeError(f"unknown query {type(query).__name__}")
