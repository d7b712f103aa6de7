"""``EngramMemory`` as AutoGen meets it: the ``Memory`` methods on autogen-core's own model
context, and an autogen-agentchat ``AssistantAgent`` with a scripted model client (no network),
against one running ``engram serve``."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import pytest
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import MemoryQueryEvent
from autogen_core import CancellationToken
from autogen_core.memory import Memory, MemoryContent, MemoryMimeType
from autogen_core.model_context import BufferedChatCompletionContext
from autogen_core.models import (
    ChatCompletionClient,
    CreateResult,
    LLMMessage,
    ModelInfo,
    RequestUsage,
    SystemMessage,
    UserMessage,
)

from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.integrations.autogen import EngramMemory

pytestmark = pytest.mark.e2e


class ScriptedClient(ChatCompletionClient):
    """Answers each call with the next scripted text and keeps the messages it was given."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls: list[list[LLMMessage]] = []

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:  # type: ignore[override]
        self.calls.append(list(messages))
        return CreateResult(finish_reason="stop", content=self.answers.pop(0), usage=RequestUsage(0, 0), cached=False)

    async def create_stream(
        self, messages: Sequence[LLMMessage], **kwargs: Any
    ) -> AsyncGenerator[str | CreateResult, None]:  # type: ignore[override]
        yield await self.create(messages)

    async def close(self) -> None:
        pass

    def actual_usage(self) -> RequestUsage:
        return RequestUsage(0, 0)

    def total_usage(self) -> RequestUsage:
        return RequestUsage(0, 0)

    def count_tokens(self, messages: Sequence[LLMMessage], **kwargs: Any) -> int:  # type: ignore[override]
        return 0

    def remaining_tokens(self, messages: Sequence[LLMMessage], **kwargs: Any) -> int:  # type: ignore[override]
        return 100_000

    @property
    def capabilities(self) -> Mapping[str, Any]:  # type: ignore[override]
        return self.model_info

    @property
    def model_info(self) -> ModelInfo:
        return ModelInfo(
            vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False
        )


def text(content: str) -> MemoryContent:
    return MemoryContent(content=content, mime_type=MemoryMimeType.TEXT)


async def test_added_text_and_json_are_found_by_a_query_of_the_category(engram: EngramClient, user: str) -> None:
    memory = EngramMemory(engram, user_id=user, category="preferences")
    assert isinstance(memory, Memory)
    await memory.add(text("Alice drinks green tea every morning"))
    await memory.add(MemoryContent(content="**Alice** hates *cilantro*", mime_type=MemoryMimeType.MARKDOWN))
    await memory.add(MemoryContent(content={"food": "ramen", "city": "Osaka"}, mime_type=MemoryMimeType.JSON))
    await memory.add(MemoryContent(content='{"sport": "climbing"}', mime_type="application/json"))

    found = await memory.query("What does Alice drink in the morning?")
    best = found.results[0]
    assert best.content == "Alice drinks green tea every morning" and best.mime_type == MemoryMimeType.TEXT
    assert best.metadata is not None and len(best.metadata["note_id"]) == 8 and best.metadata["score"] > 0
    by_content = await memory.query(text("cilantro"), top_k=1)
    assert [hit.content for hit in by_content.results] == ["**Alice** hates *cilantro*"]
    ramen = await memory.query("ramen in Osaka")
    assert ramen.results[0].content == {"food": "ramen", "city": "Osaka"}  # the object, as it was added
    assert ramen.results[0].mime_type == MemoryMimeType.JSON

    # JSON is a structured note under a fresh key, its value the object added.
    listed = await engram.list_notes(user, category="preferences", after=memory.token)
    values = [note.value for note in listed.notes if note.value is not None]
    assert values == [{"food": "ramen", "city": "Osaka"}, {"sport": "climbing"}]
    assert all(note.key for note in listed.notes if note.value is not None)
    assert (await memory.query("   ")).results == []

    # Another category of the same user is another memory.
    other = EngramMemory(engram, user_id=user, category="work")
    assert (await other.query("green tea")).results == []


async def test_what_engram_cannot_store_is_refused(engram: EngramClient, user: str) -> None:
    memory = EngramMemory(engram, user_id=user)
    with pytest.raises(ValueError, match="bytes"):
        await memory.add(MemoryContent(content=b"\x00\x01", mime_type=MemoryMimeType.BINARY))
    with pytest.raises(ValueError, match="JSON object"):
        await memory.add(MemoryContent(content="[1, 2]", mime_type=MemoryMimeType.JSON))


async def test_update_context_adds_the_memory_block_for_the_last_user_message(engram: EngramClient, user: str) -> None:
    memory = EngramMemory(engram, user_id=user, category="preferences")
    await memory.add(text("Alice drinks green tea every morning"))
    context = BufferedChatCompletionContext(buffer_size=10)
    await context.add_message(UserMessage(content="Hello", source="user"))
    await context.add_message(UserMessage(content="What should I drink tomorrow morning?", source="user"))

    result = await memory.update_context(context)
    messages = await context.get_messages()
    assert len(messages) == 3 and isinstance(messages[-1], SystemMessage)
    assert "Alice drinks green tea every morning" in messages[-1].content
    assert [hit.content for hit in result.memories.results][:1] == ["Alice drinks green tea every morning"]


async def test_update_context_leaves_the_context_alone_when_there_is_no_memory(engram_url: str, user: str) -> None:
    memory = EngramMemory(engram_url, user_id=user)
    context = BufferedChatCompletionContext(buffer_size=10)
    await context.add_message(UserMessage(content="Anything about me?", source="user"))
    result = await memory.update_context(context)
    assert len(await context.get_messages()) == 1 and result.memories.results == []
    await memory.close()


async def test_clear_forgets_every_note_of_the_category_and_nothing_else(engram: EngramClient, user: str) -> None:
    memory = EngramMemory(engram, user_id=user, category="scratch")
    for i in range(23):  # more than one forget request holds (20 ids)
        await memory.add(text(f"Scratch note number {i} about the lighthouse"))
    await memory.add(MemoryContent(content={"n": 99, "about": "lighthouse"}, mime_type=MemoryMimeType.JSON))
    keep = EngramMemory(engram, user_id=user, category="keep")
    await keep.add(text("The lighthouse keeper is called Morag"))

    await memory.clear()
    assert (await engram.list_notes(user, category="scratch", after=memory.token)).notes == []
    assert (await memory.query("lighthouse")).results == []
    kept = await keep.query("lighthouse keeper")
    assert [hit.content for hit in kept.results] == ["The lighthouse keeper is called Morag"]
    await memory.clear()  # nothing left: not an error


async def test_an_assistant_agent_answers_with_engram_memory_in_its_prompt(engram_url: str, user: str) -> None:
    memory = EngramMemory(engram_url, user_id=user, category="preferences", name="alice_memory")
    await memory.add(text("Alice drinks green tea every morning"))
    model = ScriptedClient(["Green tea, as every morning."])
    agent = AssistantAgent("assistant", model_client=model, memory=[memory])

    result = await agent.run(task="What should I drink tomorrow morning?", cancellation_token=CancellationToken())
    assert result.messages[-1].to_text() == "Green tea, as every morning."
    prompt = model.calls[0]
    assert any(isinstance(m, SystemMessage) and "Alice drinks green tea" in m.content for m in prompt)
    events = [m for m in result.messages if isinstance(m, MemoryQueryEvent)]
    assert events and events[0].content[0].content == "Alice drinks green tea every morning"

    # The agent's configuration names the memory by its URL, user and category, never a client.
    dumped = memory.dump_component()
    assert dumped.provider == "engram_ledger.services.integrations.autogen.EngramMemory"
    again = EngramMemory.load_component(dumped)
    assert (again.user_id, again.category, again.name) == (user, "preferences", "alice_memory")
    assert [hit.content for hit in (await again.query("green tea")).results] == ["Alice drinks green tea every morning"]
    await again.close()
    await memory.close()
