"""An OpenAI Agents SDK ``Session`` kept in Engram's conversation memory.

``EngramSession`` stores each item the SDK hands it as one message of an Engram conversation
(``session_id``, of one Engram user): the item itself is kept whole and sealed beside the
message, and the message's text is what the item says, so the conversation is searchable like
any other (``search(include_conversation=True)``) and erasable with it (``forget --session``).

    session = EngramSession("chat-42", "redis://127.0.0.1:6379/0", user_id="alice")
    result = await Runner.run(agent, "Hi", session=session)
    await session.close()

Semantics the SDK leaves to a backend, as chosen here:

- ``pop_item`` retracts the latest message (``MessageRetracted``): it leaves the conversation and
  its searches, the event log stays append-only.
- ``clear_session`` erases the conversation for good (``forget_session``, every message's data
  key destroyed); the session id can be written to again afterwards.
- ``add_items`` writes in batches of at most 100 items, each batch atomically and in order; a
  longer list is several batches, so a failure part-way leaves the earlier batches written.
- A message recorded without an item (by ``engram`` or another client, in the same session id)
  reads back as a plain message of its role, a ``tool`` turn as an assistant message: the
  Responses API has no tool role without a call id.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from types import TracebackType
from typing import Any, TypeVar, cast

from agents.items import TResponseInputItem
from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit

from engram_ledger.contracts.commands import MessageDraft
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import LIST_NOTES_MAX, MAX_BATCH_MESSAGES, MAX_CONTENT_CHARS
from engram_ledger.contracts.model import MessageView
from engram_ledger.services.bus.client import EngramClient, new_command_id
from engram_ledger.services.domain.values import printable
from engram_ledger.services.integrations.connection import AdapterClient

R = TypeVar("R")

# Engram's roles are user, assistant, system and tool; the Responses API's developer role is a
# system instruction, and an item without a role (a call, its output, reasoning) is tool traffic.
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# A pop that loses a race to another popper looks again; the read model trails the decider by
# milliseconds, so a few short waits are enough before giving up.
_POP_ATTEMPTS = 20
_POP_BACKOFF_SECONDS = 0.02


class EngramSession:
    """The SDK's ``Session`` protocol over one Engram conversation.

    ``url_or_client``: an ``EngramClient`` (shared, left open by ``close``) or a Redis URL (a
    client of its own, connected on first use and closed by ``close``). ``session_settings``:
    the SDK's ``SessionSettings`` (its ``limit`` is the default of ``get_items``)."""

    def __init__(
        self,
        session_id: str,
        url_or_client: str | EngramClient,
        *,
        user_id: str,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        self.session_id = session_id
        self.user_id = user_id
        self.session_settings: SessionSettings | None = (
            coerce_session_settings(session_settings) if session_settings is not None else SessionSettings()
        )
        # The consistency token of this session's last write: every read waits for it, so the
        # runner always sees the items it has just added (read-your-writes).
        self.token: str | None = None
        self._client = AdapterClient(url_or_client)
        # One write at a time per session object: two add_items must not interleave their
        # batches, and a pop must not retract what a concurrent pop is returning.
        self._writing = asyncio.Lock()

    async def __aenter__(self) -> EngramSession:
        await self._ready()
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the client this session opened (a client passed in is the caller's to close)."""
        await self._client.close()

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation's items, oldest first; with ``limit`` (or the settings' limit) the
        latest ``limit`` of them."""
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted is not None and wanted <= 0:
            return []
        client = await self._ready()
        # A listing's limit is bounded; a larger one is the whole conversation, cut here.
        asked = wanted if wanted is not None and wanted <= LIST_NOTES_MAX else None
        reply = await client.list_messages(self.user_id, self.session_id, limit=asked, after=self.token)
        messages = reply.messages if wanted is None else reply.messages[-wanted:]
        return [as_item(message) for message in messages]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if not items:
            return
        drafts = [draft_of(item) for item in items]
        client = await self._ready()
        async with self._writing:
            for start in range(0, len(drafts), MAX_BATCH_MESSAGES):
                batch = drafts[start : start + MAX_BATCH_MESSAGES]
                record = partial(client.record_messages, self.user_id, self.session_id, batch)
                written = await _retrying_a_timeout(record)
                self.token = written.token

    async def pop_item(self) -> TResponseInputItem | None:
        """Retract the latest item and return it; None when the conversation is empty."""
        client = await self._ready()
        async with self._writing:
            for attempt in range(_POP_ATTEMPTS):
                reply = await client.list_messages(self.user_id, self.session_id, limit=1, after=self.token)
                if not reply.messages:
                    return None
                latest = reply.messages[-1]
                try:
                    written = await _retrying_a_timeout(partial(client.retract_message, self.user_id, latest.id))
                except EngramError as e:
                    # Another popper (another process on the same session) retracted it first.
                    if e.code is not ErrorCode.MEMORY_NOT_FOUND or attempt == _POP_ATTEMPTS - 1:
                        raise
                    await asyncio.sleep(_POP_BACKOFF_SECONDS * (attempt + 1))
                    continue
                self.token = written.token
                return as_item(latest)
        return None  # unreachable: the last attempt returns or raises

    async def clear_session(self) -> None:
        """Erase every message of the conversation (``forget_session``, operator-confirmed)."""
        client = await self._ready()
        async with self._writing:
            try:
                reply = await client.forget_session(self.user_id, self.session_id, confirmed=True)
            except EngramError as e:
                if e.code is ErrorCode.MEMORY_NOT_FOUND:
                    return  # no message left in the session: nothing to clear
                raise
            self.token = reply.token or self.token

    async def _ready(self) -> EngramClient:
        return await self._client.ready()


def draft_of(item: TResponseInputItem | Mapping[str, Any]) -> MessageDraft:
    """The message that stores ``item``: its role, its searchable text, and the item whole."""
    whole = _as_dict(item)
    role = whole.get("role")
    return MessageDraft(
        role=_ROLES.get(role, "tool") if isinstance(role, str) else "tool",
        content=searchable_text(whole),
        item=whole,
    )


def searchable_text(item: Mapping[str, Any]) -> str:
    """What an item says, for search: a message's text, a call's name and arguments, a tool's
    output; the item's JSON when it says nothing in words (reasoning, an image, a screenshot)."""
    kind = item.get("type")
    text = ""
    if "role" in item and kind in (None, "message"):
        text = _text_of(item.get("content"))
    elif kind in ("function_call", "custom_tool_call"):
        text = f"{item.get('name') or ''} {item.get('arguments') or item.get('input') or ''}"
    elif isinstance(kind, str) and kind.endswith("_call_output"):
        text = _text_of(item.get("output"))
    # A message's text is printable (a tool's output may carry terminal escapes) and bounded
    # (16,384 characters); the item itself is kept whole.
    text = printable(text).strip() or printable(json.dumps(item, ensure_ascii=False, default=str))
    return text[:MAX_CONTENT_CHARS]


def as_item(message: MessageView) -> TResponseInputItem:
    if message.item is not None:
        return cast(TResponseInputItem, message.item)
    role = message.role if message.role in ("user", "assistant", "system") else "assistant"
    return cast(TResponseInputItem, {"type": "message", "role": role, "content": message.content})


def _text_of(content: object) -> str:
    """A string, or the text of a list of content parts (input/output text, refusals)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping):
                said = part.get("text", part.get("refusal"))
                if isinstance(said, str):
                    texts.append(said)
        return "\n".join(texts)
    return ""


def _as_dict(item: object) -> dict[str, Any]:
    if isinstance(item, Mapping):
        return dict(item)
    # The runner hands over dicts; an SDK output model given directly is stored as its input form.
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        return cast(dict[str, Any], dump(mode="json", exclude_unset=True))
    raise TypeError(f"a session item is a dict, not {type(item).__name__}")


async def _retrying_a_timeout(call: Callable[..., Awaitable[R]]) -> R:
    """A write that timed out may still have been applied: the one safe retry is the same
    command id, which answers the first outcome instead of writing twice."""
    command_id = new_command_id()
    try:
        return await call(command_id=command_id)
    except EngramError as e:
        if e.code is not ErrorCode.TIMEOUT:
            raise
    return await call(command_id=command_id)
