"""Read-your-writes for one user over an ``EngramClient`` (imported from ``client`` too)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from engram_ledger.contracts.commands import MessageDraft
from engram_ledger.contracts.model import NoteView
from engram_ledger.contracts.queries import NotesReply, NotesWritten, NoteWritten, SearchReply

if TYPE_CHECKING:
    from engram_ledger.services.bus.client import EngramClient

R = TypeVar("R")


class ReadYourWrites:
    """Read-your-writes for one user: remembers the token of the last write and passes it to
    every query, so a read never misses this session's own writes."""

    def __init__(self, client: EngramClient, user_id: str) -> None:
        self.client = client
        self.user_id = user_id
        self.token: str | None = None

    def _track(self, reply: R) -> R:
        self.token = getattr(reply, "token", self.token)
        return reply

    async def save(self, content: str, **kwargs: Any) -> NoteWritten:
        return self._track(await self.client.save(self.user_id, content, **kwargs))

    async def update(self, note_id: str, **kwargs: Any) -> NoteWritten:
        return self._track(await self.client.update(self.user_id, note_id, **kwargs))

    async def supersede(self, note_id: str, superseded_by: str, **kwargs: Any) -> NoteWritten:
        return self._track(await self.client.supersede(self.user_id, note_id, superseded_by, **kwargs))

    async def record_messages(self, session_id: str, messages: Sequence[MessageDraft], **kwargs: Any) -> NotesWritten:
        return self._track(await self.client.record_messages(self.user_id, session_id, messages, **kwargs))

    async def get_note(self, note_id: str) -> NoteView:
        return await self.client.get_note(self.user_id, note_id, after=self.token)

    async def list_notes(self, **kwargs: Any) -> NotesReply:
        return await self.client.list_notes(self.user_id, after=self.token, **kwargs)

    async def list_recent(self, limit: int = 10) -> NotesReply:
        return await self.client.list_recent(self.user_id, limit=limit, after=self.token)

    async def search(self, query: str, **kwargs: Any) -> SearchReply:
        return await self.client.search(self.user_id, query, after=self.token, **kwargs)
