"""``EngramMemoryBlock`` as LlamaIndex meets it: its own ``Memory`` flushing old turns into the
block and asking it for long-term memory, and a chat engine on LlamaIndex's ``MockLLM`` (which
answers with the prompt it was given, so the test reads what the model saw); against a real
service on real Redis."""

from __future__ import annotations

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockLLM
from llama_index.core.memory import Memory
from llama_index.core.memory.memory import BaseMemoryBlock

from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.integrations.llamaindex import EngramMemoryBlock


def small_memory(session_id: str, block: EngramMemoryBlock) -> Memory:
    """A Memory whose short-term history holds a few dozen tokens, so older turns flush to the block."""
    return Memory.from_defaults(
        session_id=session_id, token_limit=60, chat_history_token_ratio=0.5, token_flush_size=20, memory_blocks=[block]
    )


async def test_flushed_turns_are_recalled_in_a_later_session_and_reach_the_model(client: EngramClient) -> None:
    block = EngramMemoryBlock(client, user_id="alice")
    assert isinstance(block, BaseMemoryBlock)
    await client.save("alice", "Alice is vegetarian", category="food")

    first = small_memory("chat-1", block)
    await first.aput_messages(
        [
            ChatMessage(role="user", content="My sister Sarah moved to Lisbon last spring."),
            ChatMessage(role="assistant", content="Lisbon is lovely; I will remember that."),
            ChatMessage(role="user", content="I am planning to visit her in October."),
            ChatMessage(role="assistant", content="October is a good month for it."),
            ChatMessage(role="user", content="Thanks, that is all for now."),
        ]
    )
    # The older turns left the short-term history for Engram: a conversation of the session's id.
    assert block.token is not None
    recorded = await client.list_messages("alice", "chat-1", after=block.token)
    assert recorded.messages and recorded.messages[0].content == "My sister Sarah moved to Lisbon last spring."
    assert [m.role for m in recorded.messages[:2]] == ["user", "assistant"]
    assert all("session_id" not in m.additional_kwargs for m in await first.aget_all())

    # A later session: the model is shown the user's memory block and the turn it recalls.
    engine = SimpleChatEngine.from_defaults(llm=MockLLM(), memory=small_memory("chat-2", block))
    response = await engine.achat("Where does my sister live these days?")
    seen = str(response)
    assert "Alice is vegetarian" in seen
    assert "From earlier conversations:" in seen and "My sister Sarah moved to Lisbon last spring." in seen


async def test_nothing_to_recall_adds_nothing(client: EngramClient) -> None:
    block = EngramMemoryBlock(client, user_id="nobody")
    memory = small_memory("chat-1", block)
    assert await block.aget([]) == ""
    await memory.aput(ChatMessage(role="user", content="Hello there"))
    assert [m.content for m in await memory.aget()] == ["Hello there"]  # no memory block added


async def test_another_users_block_recalls_none_of_it(client: EngramClient) -> None:
    alice = EngramMemoryBlock(client, user_id="alice")
    await alice.aput([ChatMessage(role="user", content="My bank PIN hint is the cat's birthday")], session_id="s")
    bob = EngramMemoryBlock(client, user_id="bob")
    assert "PIN" not in await bob.aget([ChatMessage(role="user", content="What is my bank PIN hint?")])
    assert "PIN" in await alice.aget([ChatMessage(role="user", content="What is my bank PIN hint?")])
