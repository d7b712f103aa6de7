"""A LlamaIndex long-term memory block kept in Engram.

LlamaIndex's ``Memory`` keeps a short-term chat history and hands the messages it flushes out of
it to its memory blocks; before each model call it asks every block for what to add to the
prompt. ``EngramMemoryBlock`` is such a block (``BaseMemoryBlock[str]``) on one Engram user:

    block = EngramMemoryBlock(engram_url(), user_id="alice")
    memory = Memory.from_defaults(session_id="chat-1", token_limit=40_000, memory_blocks=[block])
    agent_response = await agent.run("...", memory=memory)

- ``aput`` (the messages flushed from the short-term memory): each becomes a turn of an Engram
  conversation, the Memory's session id as the conversation's, so that later searches find it.
- ``aget`` (the chat history and the new input): the user's Engram memory block about the
  latest messages (``BuildContext``: the notes the user's agents saved, ranked by relevance to
  them and fitted to ``max_tokens``), followed by the turns of earlier conversations that Engram's
  search finds relevant to them (above the service's relevance floor, ``top_k`` of them).

Each read waits for the block's own last write (read-your-writes). Use the Memory's async
methods (``aget``, ``aput``), as LlamaIndex's agents do: the client lives on the event loop that
first uses it. Engram's refusals and an unreachable service are raised as ``EngramError``.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.memory.memory import BaseMemoryBlock

from engram_ledger.contracts.commands import MessageDraft
from engram_ledger.contracts.limits import MAX_BATCH_MESSAGES, MAX_CONTENT_CHARS, MAX_QUERY_CHARS
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.domain.values import printable
from engram_ledger.services.integrations.connection import AdapterClient

# The conversation a message is recorded in when LlamaIndex names none.
DEFAULT_SESSION = "llamaindex"
_ROLES = {
    MessageRole.USER: "user",
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.TOOL: "tool",
    MessageRole.FUNCTION: "tool",
}


class EngramMemoryBlock(BaseMemoryBlock[str]):
    """Long-term memory for LlamaIndex's ``Memory``, from one Engram user's memory.

    ``url_or_client``: an ``EngramClient`` (shared, left open by ``close``) or a Redis URL (a
    client of its own, connected on first use and closed by ``close``)."""

    name: str = Field(default="engram_memory", description="The name of the memory block.")
    user_id: str = Field(description="The Engram user whose memory this is.")
    top_k: int = Field(default=5, description="How many turns of earlier conversations to recall.")
    max_tokens: int | None = Field(default=None, description="The budget of Engram's memory block (None: whole).")
    context_window: int = Field(default=5, description="How many of the latest messages the recall is about.")
    min_relevance: float | None = Field(default=None, description="The recall's floor (None: the service's).")
    token: str | None = Field(default=None, description="The consistency token of the block's last write.")
    _client: AdapterClient = PrivateAttr()

    def __init__(self, url_or_client: str | EngramClient, **fields: Any) -> None:
        super().__init__(**fields)
        self._client = AdapterClient(url_or_client)

    async def close(self) -> None:
        """Close the client this block opened (a client passed in is the caller's to close)."""
        await self._client.close()

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        query = _text_of(messages[-self.context_window :] if messages else [])[-MAX_QUERY_CHARS:].strip()
        client = await self._client.ready()
        # The block names no tool: a LlamaIndex agent changes its memory through its messages.
        block = await client.context(
            self.user_id, query=query or None, max_tokens=self.max_tokens, after=self.token, update_tool=None
        )
        parts = [block.text.strip()] if block.note_ids else []
        if query:
            found = await client.search(
                self.user_id,
                query,
                top_k=self.top_k,
                include_conversation=True,
                min_relevance=self.min_relevance,
                after=self.token,
            )
            turns = [hit.message for hit in found.results if hit.message is not None]
            if turns:
                lines = [f"- {turn.speaker or turn.role}: {turn.content}" for turn in turns]
                parts.append("From earlier conversations:\n" + "\n".join(lines))
        return "\n\n".join(parts)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        by_session: dict[str, list[MessageDraft]] = {}
        for message in messages:
            # BaseMemoryBlock.aput lends the session id to each message; it goes back.
            session = str(message.additional_kwargs.pop("session_id", None) or DEFAULT_SESSION)
            text = printable(_text_of([message])).strip()[:MAX_CONTENT_CHARS]
            if text:
                by_session.setdefault(session, []).append(
                    MessageDraft(role=_ROLES.get(message.role, "assistant"), content=text)
                )
        if not by_session:
            return
        client = await self._client.ready()
        for session, drafts in by_session.items():
            for start in range(0, len(drafts), MAX_BATCH_MESSAGES):
                written = await client.record_messages(
                    self.user_id, session, drafts[start : start + MAX_BATCH_MESSAGES]
                )
                self.token = written.token


def _text_of(messages: list[ChatMessage]) -> str:
    return "\n".join(block.text for message in messages for block in message.blocks if isinstance(block, TextBlock))
