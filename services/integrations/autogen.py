"""An AutoGen ``Memory`` (autogen-core) kept in Engram.

``EngramMemory`` is one category of one Engram user's notes, as an AutoGen agent's memory; by
default the category ``autogen``, its own, apart from what the user saves some other way:

    memory = EngramMemory(engram_url(), user_id="alice", category="autogen-preferences")
    await memory.add(MemoryContent(content="Alice likes her tea green", mime_type=MemoryMimeType.TEXT))
    agent = AssistantAgent("assistant", model_client=..., memory=[memory])

- ``add``: text (plain or markdown) is saved as a note of the category; a JSON object (a dict, or
  JSON text with the JSON mime type) is put as a structured note under a fresh key. Bytes and
  images are refused: Engram stores text.
- ``query``: a search of the category; each hit is the note's text (a JSON object added comes
  back as that object) with ``note_id`` and ``score`` in its metadata. A blank query finds nothing (search needs words).
- ``update_context``: before each inference the agent calls it; it asks Engram for the user's
  memory block (``BuildContext``, about the last user message) and appends it to the model
  context as a system message, as AutoGen's own ``ListMemory`` does. The block covers the whole
  user's memory, every category (the profile included); the ``memories`` it returns are the
  category's search hits for that message, which is what the agent reports as its memory query.
- ``clear``: forgets every note of the category (operator-confirmed: gone for good). It refuses
  the category the CLI and the tools save to by default (``general``): it would erase notes this
  memory never wrote.

Read-your-writes: the memory keeps the token of its last write and every read waits for it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any, Self, TypeVar

from autogen_core import CancellationToken, Component
from autogen_core.memory import Memory, MemoryContent, MemoryMimeType, MemoryQueryResult, UpdateContextResult
from autogen_core.model_context import ChatCompletionContext
from autogen_core.models import LLMMessage, SystemMessage, UserMessage
from pydantic import BaseModel

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import DEFAULT_CATEGORY, MAX_FORGET_IDS, MAX_QUERY_CHARS
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.integrations.connection import AdapterClient

R = TypeVar("R")

# The memory's own category unless told otherwise: what it clears is what it wrote.
AUTOGEN_CATEGORY = "autogen"


class EngramMemoryConfig(BaseModel):
    """What ``dump_component`` records: enough to reconnect to the same memory (not a client)."""

    url: str
    user_id: str
    category: str = AUTOGEN_CATEGORY
    name: str | None = None
    top_k: int = 5
    max_tokens: int | None = None


class EngramMemory(Memory, Component[EngramMemoryConfig]):
    """One category of one Engram user's memory, as an AutoGen ``Memory``.

    ``url_or_client``: an ``EngramClient`` (shared, left open by ``close``) or a Redis URL (a
    client of its own, connected on first use and closed by ``close``). ``top_k``: how many
    hits ``query`` and ``update_context`` return by default. ``max_tokens``: the budget of the
    memory block ``update_context`` adds (None: the whole block)."""

    component_type = "memory"
    component_config_schema = EngramMemoryConfig
    component_provider_override = "engram_ledger.services.integrations.autogen.EngramMemory"

    def __init__(
        self,
        url_or_client: str | EngramClient,
        *,
        user_id: str,
        category: str = AUTOGEN_CATEGORY,
        name: str | None = None,
        top_k: int = 5,
        max_tokens: int | None = None,
    ) -> None:
        self.user_id = user_id
        self.category = category
        self.top_k = top_k
        self.max_tokens = max_tokens
        self._name = name or "engram_memory"
        self.token: str | None = None
        self._client = AdapterClient(url_or_client)

    @property
    def name(self) -> str:
        return self._name

    async def add(self, content: MemoryContent, cancellation_token: CancellationToken | None = None) -> None:
        client = await self._ready()
        body = content.content
        if isinstance(body, dict) or _mime(content.mime_type) == MemoryMimeType.JSON.value:
            value = _json_object(body)
            # Each add is a new item, as in a list memory: a fresh key, never an overwrite.
            write: Awaitable[Any] = client.put(self.user_id, self.category, uuid.uuid4().hex, value)
        elif isinstance(body, str):
            # advise=False: nothing reads the save's advice (similar notes), so do not wait for it.
            write = client.save(self.user_id, body, category=self.category, advise=False)
        else:
            raise ValueError(f"EngramMemory stores text and JSON objects, not {type(body).__name__}")
        written = await _linked(write, cancellation_token)
        self.token = written.token

    async def query(
        self,
        query: str | MemoryContent = "",
        cancellation_token: CancellationToken | None = None,
        **kwargs: Any,
    ) -> MemoryQueryResult:
        """Search the category. ``top_k`` (keyword) overrides the memory's default."""
        text = query if isinstance(query, str) else _text_of(query)
        top_k = int(kwargs.get("top_k", self.top_k))
        return await _linked(self._search(text, top_k), cancellation_token)

    async def update_context(self, model_context: ChatCompletionContext) -> UpdateContextResult:
        query = _last_user_text(await model_context.get_messages())
        client = await self._ready()
        block, found = await asyncio.gather(
            # An AutoGen agent changes its memory through this class, not through a tool.
            client.context(
                self.user_id, query=query or None, max_tokens=self.max_tokens, after=self.token, update_tool=None
            ),
            self._search(query, self.top_k),
        )
        if block.text.strip():
            await model_context.add_message(SystemMessage(content=block.text))
        return UpdateContextResult(memories=found)

    async def clear(self) -> None:
        """Forget every note of the category, superseded ones included. Refused for the shared
        default category, which holds what the user saved through the CLI and the tools."""
        if self.category == DEFAULT_CATEGORY:
            raise ValueError(
                f"EngramMemory.clear() would forget every note of the category {DEFAULT_CATEGORY!r}, which the CLI "
                "and the tools save to as well; give the memory a category of its own (the default is "
                f"{AUTOGEN_CATEGORY!r})"
            )
        client = await self._ready()
        tried: set[str] = set()
        # Listed again until empty: a listing may be capped, and forgetting one chunk may race
        # another writer. A pass that finds only notes already tried has nothing left it can do.
        while True:
            listed = await client.list_notes(
                self.user_id, category=self.category, include_superseded=True, after=self.token
            )
            ids = [note.id for note in listed.notes if note.id not in tried]
            if not ids:
                return
            tried.update(ids)
            for start in range(0, len(ids), MAX_FORGET_IDS):
                await self._forget(ids[start : start + MAX_FORGET_IDS])

    async def close(self) -> None:
        """Close the client this memory opened (a client passed in is the caller's to close)."""
        await self._client.close()

    async def _search(self, text: str, top_k: int) -> MemoryQueryResult:
        text = text.strip()[-MAX_QUERY_CHARS:]
        if not text:
            return MemoryQueryResult(results=[])
        client = await self._ready()
        reply = await client.search(self.user_id, text, top_k=top_k, category=self.category, after=self.token)
        return MemoryQueryResult(
            results=[
                # A JSON object added comes back as the object it was.
                MemoryContent(
                    content=hit.note.value,
                    mime_type=MemoryMimeType.JSON,
                    metadata={"note_id": hit.note_id, "score": hit.score},
                )
                if hit.note is not None and hit.note.value is not None
                else MemoryContent(
                    content=hit.content,
                    mime_type=MemoryMimeType.TEXT,
                    metadata={"note_id": hit.note_id, "score": hit.score},
                )
                for hit in reply.results
            ]
        )

    async def _forget(self, note_ids: list[str]) -> None:
        client = await self._ready()
        try:
            reply = await client.forget(self.user_id, note_ids=note_ids, confirmed=True)
        except EngramError as e:
            if e.code is not ErrorCode.MEMORY_NOT_FOUND:
                raise
            # One of them went meanwhile (another clear, a forget): the rest one at a time.
            if len(note_ids) > 1:
                for note_id in note_ids:
                    await self._forget([note_id])
            return
        self.token = reply.token or self.token

    async def _ready(self) -> EngramClient:
        return await self._client.ready()

    def _to_config(self) -> EngramMemoryConfig:
        return EngramMemoryConfig(
            url=self._client.url,
            user_id=self.user_id,
            category=self.category,
            name=self._name,
            top_k=self.top_k,
            max_tokens=self.max_tokens,
        )

    @classmethod
    def _from_config(cls, config: EngramMemoryConfig) -> Self:
        return cls(
            config.url,
            user_id=config.user_id,
            category=config.category,
            name=config.name,
            top_k=config.top_k,
            max_tokens=config.max_tokens,
        )


def _last_user_text(messages: Sequence[LLMMessage]) -> str:
    """The text of the latest user message, cut to what a query may be (its end: a long
    message usually ends with what it asks)."""
    for message in reversed(messages):
        if isinstance(message, UserMessage):
            content = message.content
            text = content if isinstance(content, str) else "\n".join(p for p in content if isinstance(p, str))
            return text.strip()[-MAX_QUERY_CHARS:]
    return ""


def _text_of(content: MemoryContent) -> str:
    body = content.content
    if isinstance(body, str):
        return body
    if isinstance(body, dict):
        return json.dumps(body, ensure_ascii=False)
    raise ValueError(f"EngramMemory queries are text, not {type(body).__name__}")


def _json_object(body: object) -> dict[str, Any]:
    value = json.loads(body) if isinstance(body, str | bytes) else body
    if not isinstance(value, dict):
        raise ValueError("EngramMemory stores a JSON object (a dict), not a JSON " + type(value).__name__)
    return value


def _mime(mime_type: MemoryMimeType | str) -> str:
    return mime_type.value if isinstance(mime_type, MemoryMimeType) else mime_type


async def _linked(call: Awaitable[R], cancellation_token: CancellationToken | None) -> R:
    """Run ``call`` so that cancelling the AutoGen token cancels it (a write may still land)."""
    task = asyncio.ensure_future(call)
    if cancellation_token is not None:
        cancellation_token.link_future(task)
    return await task
