"""What ``EngramClient`` reads: one method per query, each a typed call that builds the query
and sends it through ``ask``. ``after``: a write's token, so that the read sees that write;
``as_of``: the memory as it was at a time (ISO 8601, or a ``datetime``) or a token."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

from engram_ledger.contracts import queries
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.model import NoteKind, NoteView, Origin

R = TypeVar("R")


class Reads:
    """The queries; ``ask`` is the client's (``EngramClient``)."""

    async def ask(self, query: queries.AnyQuery, expect: type[R]) -> R:
        raise NotImplementedError

    async def _ask(self, kind: type[queries.AnyQuery], expect: type[R], fields: dict[str, Any]) -> R:
        """``kind`` made of ``fields``, the calling method's parameters (its ``locals()``): each
        parameter is the query's field of that name, ``as_of`` as the query carries it."""
        given = {name: value for name, value in fields.items() if name != "self"}
        if "as_of" in given:
            given["as_of"] = _moment(given["as_of"])
        return await self.ask(kind(**given), expect)

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
    ) -> queries.ContextReply:
        """``update_tool``: the tool the agent reading the block changes a memory with (None: it
        has none, and the block names none). ``min_relevance``: as ``search``'s, for ``query``.
        ``as_of``: the block as the memory was then."""
        return await self._ask(queries.BuildContext, queries.ContextReply, locals())

    async def get_note(
        self, user_id: str, note_id: str, *, after: str | None = None, as_of: str | datetime | None = None
    ) -> NoteView:
        """``as_of``: the note as it was then (a time, or a token a command returned)."""
        query = queries.GetNote(user_id=user_id, note_id=note_id, after=after, as_of=_moment(as_of))
        reply = await self.ask(query, queries.NoteReply)
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
    ) -> queries.RecallsReply:
        """What searches and memory blocks showed the user's agents, newest first (where audited)."""
        query = queries.ListRecalls(
            user_id=user_id, since=since, until=until, session_id=session_id, limit=limit, after=after
        )
        return await self.ask(query, queries.RecallsReply)

    async def diff(
        self,
        user_id: str,
        since: str | datetime,
        until: str | datetime | None = None,
        *,
        limit: int = 200,
        after: str | None = None,
    ) -> queries.DiffReply:
        """What changed in the user's notes after ``since`` and up to ``until`` (None: now)."""
        since_ = _moment(since)
        assert since_ is not None
        query = queries.DiffNotes(user_id=user_id, since=since_, until=_moment(until), limit=limit, after=after)
        return await self.ask(query, queries.DiffReply)

    async def get_by_key(self, user_id: str, category: str, key: str, *, after: str | None = None) -> NoteView | None:
        """The active note put under ``key`` in ``category``, or None."""
        try:
            reply = await self.ask(
                queries.GetNoteByKey(user_id=user_id, category=category, key=key, after=after), queries.NoteReply
            )
        except EngramError as e:
            if e.code is ErrorCode.MEMORY_NOT_FOUND:
                return None
            raise
        return reply.note

    async def list_categories(
        self, user_id: str, *, prefix: str | None = None, keyed_only: bool = False, after: str | None = None
    ) -> queries.CategoriesReply:
        """The categories holding the user's active notes (``prefix``: it and those under it;
        ``keyed_only``: holding notes put by key)."""
        query = queries.ListCategories(user_id=user_id, prefix=prefix, keyed_only=keyed_only, after=after)
        return await self.ask(query, queries.CategoriesReply)

    async def list_messages(
        self, user_id: str, session_id: str, *, limit: int | None = None, after: str | None = None
    ) -> queries.MessagesReply:
        """A conversation's turns, oldest first (with ``limit``, its latest ``limit``)."""
        return await self.ask(
            queries.ListMessages(user_id=user_id, session_id=session_id, limit=limit, after=after),
            queries.MessagesReply,
        )

    async def history(self, user_id: str, note_id: str, *, after: str | None = None) -> queries.HistoryReply:
        return await self.ask(queries.GetHistory(user_id=user_id, note_id=note_id, after=after), queries.HistoryReply)

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
    ) -> queries.NotesReply:
        """``as_of``: the listing as it was then (a time, or a token a command returned);
        ``valid_at``: only notes whose content held in the world then."""
        return await self._ask(queries.ListNotes, queries.NotesReply, locals())

    async def list_recent(self, user_id: str, *, limit: int = 10, after: str | None = None) -> queries.NotesReply:
        return await self.ask(queries.ListRecent(user_id=user_id, limit=limit, after=after), queries.NotesReply)

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
    ) -> queries.SearchReply:
        """``min_relevance``: hits below it are left out (None: the service's floor; 0: none).
        ``as_of``: search the memory as it was then (a time, or a token a command returned)."""
        return await self._ask(queries.SearchNotes, queries.SearchReply, locals())


def iso(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt else None


def _moment(at: str | datetime | None) -> str | None:
    """An ``as_of`` as the query carries it: a time in ISO 8601 (one without a zone is UTC)."""
    if isinstance(at, datetime):
        return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).isoformat()
    return at
