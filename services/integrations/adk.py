"""A Google ADK memory service kept in Engram.

``EngramMemoryService`` is ADK's ``BaseMemoryService``: give it to a ``Runner``
(``memory_service=...``) and the ``load_memory`` and ``preload_memory`` tools search Engram:

    runner = Runner(app_name="travel", agent=agent, session_service=sessions,
                    memory_service=EngramMemoryService(engram_url()))
    await runner.memory_service.add_session_to_memory(session)   # e.g. when a session ends

- ``add_session_to_memory``: the session's events with text become the turns of an Engram
  conversation (``RecordMessages``; the conversation's id is the session's) of the app's user. A
  session may be added again as it grows: only the events not yet recorded are (each turn keeps
  its event's id), so nothing is recorded twice. ``add_events_to_memory`` records a delta the
  same way. A user's turn is ``user``, an agent's ``assistant`` with the agent's name as speaker,
  and ``sent_at`` is the event's time.
- ``add_memory``: explicit memories are saved as notes of the user (category ``adk``).
- ``search_memory``: Engram's search across every conversation of that user and their notes,
  above the service's relevance floor (``min_relevance``; the ten best by default): each hit a
  ``MemoryEntry`` with its text, author, time and ``note_id``/``session_id``/``score`` metadata.
- ``delete_memory``: forgets one entry for good (its text shredded); an id that is not there
  is nothing to do, as in ADK's own services.

Scope: ADK keys memory by app and user; the Engram user is ``<app_name>:<user_id>`` unless
``user_id_for`` says otherwise (``lambda app, user: user`` shares a user's memory across apps).
Reads wait for this service's own last write of that user (read-your-writes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType

from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.session import Session
from google.genai import types
from typing_extensions import override

from engram_ledger.contracts.commands import MessageDraft, NoteDraft
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import MAX_BATCH_MESSAGES, MAX_CONTENT_CHARS, MAX_QUERY_CHARS
from engram_ledger.contracts.queries import SearchHit
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.domain.values import printable
from engram_ledger.services.integrations.connection import AdapterClient

ADK_CATEGORY = "adk"
# ADK's own in-memory service answers at most ten memories.
DEFAULT_TOP_K = 10
# A delta recorded without a session (add_events_to_memory's session_id is optional).
NO_SESSION = "adk-events"


def engram_user(app_name: str, user_id: str) -> str:
    return f"{app_name}:{user_id}"


class EngramMemoryService(BaseMemoryService):
    """ADK's memory service over Engram conversations and notes.

    ``url_or_client``: an ``EngramClient`` (shared, left open by ``close``; an operator's, since
    ``delete_memory`` forgets at once) or a Redis URL (a client of its own, connected on first use
    and closed by ``close``). ``top_k``: how many memories a search answers.
    ``min_relevance``: the search's floor (None: the service's)."""

    def __init__(
        self,
        url_or_client: str | EngramClient,
        *,
        user_id_for: Callable[[str, str], str] = engram_user,
        top_k: int = DEFAULT_TOP_K,
        min_relevance: float | None = None,
    ) -> None:
        self.user_id_for = user_id_for
        self.top_k = top_k
        self.min_relevance = min_relevance
        self._client = AdapterClient(url_or_client)
        # Per Engram user, the token of the last write (every read of that user waits for it).
        self.tokens: dict[str, str] = {}

    async def __aenter__(self) -> EngramMemoryService:
        await self._client.ready()
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the client this service opened (a client passed in is the caller's to close)."""
        await self._client.close()

    @override
    async def add_session_to_memory(self, session: Session) -> None:
        await self._record(self.user_id_for(session.app_name, session.user_id), session.id, session.events)

    @override
    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Sequence[Event],
        session_id: str | None = None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        await self._record(self.user_id_for(app_name, user_id), session_id or NO_SESSION, events)

    @override
    async def add_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        memories: Sequence[MemoryEntry],
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        user = self.user_id_for(app_name, user_id)
        drafts = [NoteDraft(content=text, category=ADK_CATEGORY) for text in map(_text, memories) if text]
        client = await self._client.ready()
        for start in range(0, len(drafts), MAX_BATCH_MESSAGES):
            written = await client.save_many(user, drafts[start : start + MAX_BATCH_MESSAGES])
            self.tokens[user] = written.token

    @override
    async def search_memory(self, *, app_name: str, user_id: str, query: str) -> SearchMemoryResponse:
        query = query.strip()[-MAX_QUERY_CHARS:]
        if not query:
            return SearchMemoryResponse()  # nothing to search for (Engram searches words)
        user = self.user_id_for(app_name, user_id)
        client = await self._client.ready()
        reply = await client.search(
            user,
            query,
            top_k=self.top_k,
            include_conversation=True,
            min_relevance=self.min_relevance,
            after=self.tokens.get(user),
        )
        return SearchMemoryResponse(memories=[memory_entry(hit) for hit in reply.results])

    @override
    async def delete_memory(self, *, app_name: str, user_id: str, memory_id: str | None = None) -> None:
        if not memory_id:
            return
        user = self.user_id_for(app_name, user_id)
        client = await self._client.ready()
        try:
            reply = await client.forget(user, note_ids=[memory_id], confirmed=True)
        except EngramError as e:
            if e.code is ErrorCode.MEMORY_NOT_FOUND:
                return  # not there (or not this user's): nothing to delete
            raise
        if reply.token:
            self.tokens[user] = reply.token

    async def _record(self, user: str, session_id: str, events: Sequence[Event]) -> None:
        client = await self._client.ready()
        recorded = await self._recorded_events(client, user, session_id)
        drafts = [draft for event in events if event.id not in recorded and (draft := message_of(event))]
        for start in range(0, len(drafts), MAX_BATCH_MESSAGES):
            batch = drafts[start : start + MAX_BATCH_MESSAGES]
            # Two adds of the same session racing compute the same batch: under one command id
            # it is recorded once.
            written = await client.record_messages(
                user, session_id, batch, command_id=_batch_id(user, session_id, batch)
            )
            self.tokens[user] = written.token

    async def _recorded_events(self, client: EngramClient, user: str, session_id: str) -> set[str]:
        """The ids of the events already recorded in the conversation."""
        reply = await client.list_messages(user, session_id, after=self.tokens.get(user))
        return {str(m.item["adk_event_id"]) for m in reply.messages if m.item and "adk_event_id" in m.item}


def message_of(event: Event) -> MessageDraft | None:
    """The conversation turn an event is, or None when it says nothing in words (a function
    call, a state change)."""
    text = _text(event)
    if not text:
        return None
    is_user = event.author == "user" or (event.content is not None and event.content.role == "user")
    return MessageDraft(
        role="user" if is_user else "assistant",
        content=text,
        speaker=None if is_user or not event.author else event.author[:128],
        sent_at=datetime.fromtimestamp(event.timestamp, UTC),
        item={"adk_event_id": event.id, "author": event.author, "invocation_id": event.invocation_id},
    )


def memory_entry(hit: SearchHit) -> MemoryEntry:
    message = hit.message
    role = "user" if message is not None and message.role == "user" else "model"
    author = (message.speaker or message.role) if message is not None else None
    at = message.sent_at if message is not None else (hit.note.created_at if hit.note is not None else None)
    metadata: dict[str, object] = {"note_id": hit.note_id, "score": hit.score, "found_in": hit.found_in}
    if message is not None:
        metadata["session_id"] = message.session_id
    return MemoryEntry(
        id=hit.note_id,
        content=types.Content(role=role, parts=[types.Part(text=hit.content)]),
        author=author,
        timestamp=at.isoformat() if at is not None else None,
        custom_metadata=metadata,
    )


def _text(event_or_memory: Event | MemoryEntry) -> str:
    content = event_or_memory.content
    if content is None or not content.parts:
        return ""
    text = "\n".join(part.text for part in content.parts if part.text and not part.thought)
    return printable(text).strip()[:MAX_CONTENT_CHARS]


def _batch_id(user: str, session_id: str, batch: Sequence[MessageDraft]) -> str:
    ids = "\n".join(str((draft.item or {}).get("adk_event_id")) for draft in batch)
    return hashlib.sha256(f"{user}\n{session_id}\n{ids}".encode()).hexdigest()[:32]
