"""``EngramSession`` as the OpenAI Agents SDK meets it: the SDK's own ``Runner.run`` with a
scripted model (no network), and the ``Session`` methods called directly, against one running
``engram serve``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.memory import Session
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.integrations.openai_agents import EngramSession, draft_of

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def no_tracing() -> None:
    set_tracing_disabled(True)


class ScriptedModel(Model):
    """Answers each call with the next scripted output and keeps the input it was given."""

    def __init__(self, outputs: list[list[Any]]) -> None:
        self.outputs = list(outputs)
        self.inputs: list[list[TResponseInputItem]] = []

    async def get_response(self, system_instructions, input, *args, **kwargs) -> ModelResponse:  # type: ignore[no-untyped-def, override]
        self.inputs.append([{"role": "user", "content": input}] if isinstance(input, str) else list(input))
        return ModelResponse(output=self.outputs.pop(0), usage=Usage(), response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:  # type: ignore[override]
        raise NotImplementedError("the tests run the agent without streaming")
        yield


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=f"msg_{uuid.uuid4().hex[:8]}",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def call(name: str, arguments: str, call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{uuid.uuid4().hex[:8]}", type="function_call", call_id=call_id, name=name, arguments=arguments
    )


def text_of(item: Any) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return " ".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def conversation(n: int) -> list[TResponseInputItem]:
    """Turns of both kinds: messages, a function call and its output."""
    items: list[Any] = []
    for i in range(n):
        if i % 4 == 2:
            items.append(
                {"type": "function_call", "call_id": f"call_{i}", "name": "lookup", "arguments": f'{{"n": {i}}}'}
            )
        elif i % 4 == 3:
            items.append({"type": "function_call_output", "call_id": f"call_{i - 1}", "output": f"result {i}"})
        else:
            items.append({"role": "user" if i % 4 == 0 else "assistant", "content": f"turn {i}"})
    return items


async def test_the_runner_keeps_a_conversation_across_turns_in_engram(engram_url: str, user: str) -> None:
    model = ScriptedModel([[say("Nice to meet you, Ada.")], [say("Your name is Ada.")]])
    agent = Agent(name="assistant", instructions="Be brief.", model=model)
    first = EngramSession("chat-1", engram_url, user_id=user)
    assert isinstance(first, Session)
    one = await Runner.run(agent, "Hello, my name is Ada.", session=first)
    assert one.final_output == "Nice to meet you, Ada."
    await first.close()

    # Another session object (as after a restart): the history comes from Engram, not memory.
    async with EngramSession("chat-1", engram_url, user_id=user) as second:
        # The application kept the last write's token: the first read waits for it (without it,
        # a read of a busy store may come before the read model has the reply just written).
        second.token = first.token
        two = await Runner.run(agent, "What is my name?", session=second)
        assert two.final_output == "Your name is Ada."
        seen = [(item.get("role"), text_of(item)) for item in model.inputs[1]]
        assert seen == [
            ("user", "Hello, my name is Ada."),
            ("assistant", "Nice to meet you, Ada."),
            ("user", "What is my name?"),
        ]
        stored = await second.get_items()
        assert [text_of(item) for item in stored] == [
            "Hello, my name is Ada.",
            "Nice to meet you, Ada.",
            "What is my name?",
            "Your name is Ada.",
        ]


async def test_tool_calls_made_in_a_run_are_kept_whole(engram: EngramClient, user: str) -> None:
    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny in {city}"

    model = ScriptedModel([[call("get_weather", '{"city": "Paris"}', "call_w1")], [say("It is sunny in Paris.")]])
    agent = Agent(name="assistant", model=model, tools=[get_weather])
    session = EngramSession("chat-tools", engram, user_id=user)
    await Runner.run(agent, "Weather in Paris?", session=session)

    items: list[Any] = await session.get_items()
    kinds = [item.get("type", "message") for item in items]
    assert kinds == ["message", "function_call", "function_call_output", "message"]
    assert items[1]["call_id"] == "call_w1" and items[1]["name"] == "get_weather"
    assert items[1]["arguments"] == '{"city": "Paris"}'
    assert items[2]["call_id"] == "call_w1" and items[2]["output"] == "Sunny in Paris"
    # The turns are searchable conversation: a call by its name and arguments, an output by itself.
    listed = await engram.list_messages(user, "chat-tools", after=session.token)
    assert [(m.role, m.content) for m in listed.messages] == [
        ("user", "Weather in Paris?"),
        ("tool", 'get_weather {"city": "Paris"}'),
        ("tool", "Sunny in Paris"),
        ("assistant", "It is sunny in Paris."),
    ]
    # A third turn sees the call and its output in its input, as the SDK wrote them.
    model.outputs.append([say("Still sunny.")])
    await Runner.run(agent, "And now?", session=session)
    assert model.inputs[-1][1]["call_id"] == "call_w1"  # type: ignore[typeddict-item]
    assert model.inputs[-1][2]["output"] == "Sunny in Paris"  # type: ignore[typeddict-item]


async def test_get_items_answers_the_items_as_added_and_the_latest_n_with_a_limit(engram_url: str, user: str) -> None:
    items = conversation(8)
    async with EngramSession("s", engram_url, user_id=user) as session:
        assert await session.get_items() == []
        await session.add_items(items[:5])
        await session.add_items(items[5:])
        assert await session.get_items() == items
        assert await session.get_items(limit=3) == items[-3:]
        assert await session.get_items(limit=100) == items
        assert await session.get_items(limit=5000) == items  # past a listing's bound (1,000)
        assert await session.get_items(limit=0) == []
    limited = EngramSession("s", engram_url, user_id=user, session_settings={"limit": 2})
    assert await limited.get_items() == items[-2:]
    assert await limited.get_items(limit=4) == items[-4:]
    await limited.close()


async def test_more_than_a_batch_of_items_is_written_in_order(engram_url: str, user: str) -> None:
    items = conversation(230)
    async with EngramSession("long", engram_url, user_id=user) as session:
        await session.add_items(items)
        assert await session.get_items() == items


async def test_pop_item_takes_the_latest_first_and_none_when_empty(engram: EngramClient, user: str) -> None:
    items = conversation(3)
    session = EngramSession("pops", engram, user_id=user)
    await session.add_items(items)
    assert await session.pop_item() == items[2]
    assert await session.get_items() == items[:2]
    assert await session.pop_item() == items[1]
    assert await session.pop_item() == items[0]
    assert await session.pop_item() is None
    assert await session.get_items() == []
    # Popping retracts: the session can grow again, and the retracted turns stay out.
    await session.add_items([{"role": "user", "content": "again"}])
    assert await session.get_items() == [{"role": "user", "content": "again"}]
    # The client was the caller's: close leaves it open.
    await session.close()
    assert (await engram.list_messages(user, "pops")).messages


async def test_pop_item_looks_again_when_another_popper_took_the_latest(
    engram: EngramClient, user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = conversation(2)
    session = EngramSession("raced", engram, user_id=user)
    await session.add_items(items)
    retract = engram.retract_message
    raced: list[str] = []

    async def another_popper_first(user_id: str, message_id: str, **kwargs: Any) -> Any:
        if not raced:  # between this pop's look and its retraction, another process pops
            raced.append(message_id)
            await retract(user_id, message_id)
        return await retract(user_id, message_id, **kwargs)

    monkeypatch.setattr(engram, "retract_message", another_popper_first)
    assert await session.pop_item() == items[0]
    assert len(raced) == 1
    assert await session.get_items() == []


async def test_clear_session_erases_the_conversation_from_history_and_search(engram: EngramClient, user: str) -> None:
    session = EngramSession("clear-me", engram, user_id=user)
    await session.add_items(
        [
            {"role": "user", "content": "My quokka is called Wendell."},
            {"role": "assistant", "content": "Wendell the quokka, noted."},
        ]
    )
    found = await engram.search(user, "quokka Wendell", include_conversation=True, after=session.token)
    assert {hit.found_in for hit in found.results} == {"conversation"}
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    gone = await engram.search(user, "quokka Wendell", include_conversation=True, after=session.token)
    assert gone.results == []
    await session.clear_session()  # nothing left to clear: not an error
    # The session id is usable again after a clear.
    await session.add_items([{"role": "user", "content": "A fresh start."}])
    assert [text_of(item) for item in await session.get_items()] == ["A fresh start."]


async def test_messages_keep_the_roles_and_text_of_their_items(engram: EngramClient, user: str) -> None:
    items: list[Any] = [
        {"role": "developer", "content": "Answer in French."},
        {"role": "system", "content": "You are helpful."},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Look at this"},
                {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "auto"},
            ],
        },
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "42"}]},
        {"role": "assistant", "content": "   "},
        # A tool's output with terminal colours and a NUL: stored whole, searched as printable text.
        {"type": "function_call_output", "call_id": "c2", "output": "\x1b[31mred\x1b[0m\x00"},
    ]
    session = EngramSession("roles", engram, user_id=user)
    await session.add_items(items)
    listed = await engram.list_messages(user, "roles", after=session.token)
    assert [(m.role, m.content) for m in listed.messages] == [
        ("system", "Answer in French."),
        ("system", "You are helpful."),
        ("user", "Look at this"),
        ("tool", '{"type": "reasoning", "id": "rs_1", "summary": []}'),
        ("tool", "42"),
        ("assistant", '{"role": "assistant", "content": "   "}'),
        ("tool", "[31mred [0m"),  # the escapes and the NUL are spaces
    ]
    assert [m.item for m in listed.messages] == items
    assert await session.get_items() == items


def test_a_long_item_is_searchable_by_its_first_16384_characters_and_kept_whole() -> None:
    item: Any = {"role": "user", "content": "word " * 5000}
    draft = draft_of(item)
    assert len(draft.content) == 16_384 and draft.item == item
