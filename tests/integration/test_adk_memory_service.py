"""``EngramMemoryService`` as Google ADK meets it: ADK's ``Runner`` with its in-memory session
service and a scripted model (a ``BaseLlm`` answering canned turns, no network), whose
``load_memory`` tool finds in Engram what an earlier session said; against a real service on
real Redis."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.memory.base_memory_service import BaseMemoryService
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools import load_memory
from google.genai import types
from pydantic import Field

from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.integrations.adk import EngramMemoryService

APP = "travel"


class ScriptedModel(BaseLlm):
    """Answers each model call with the next scripted turn: a text, or a call of a tool (a dict
    ``{"name": ..., "args": ...}``). Keeps every request it was given."""

    turns: list[Any]
    requests: list[LlmRequest] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(llm_request)
        turn = self.turns.pop(0)
        part = types.Part(text=turn) if isinstance(turn, str) else types.Part(function_call=types.FunctionCall(**turn))
        yield LlmResponse(content=types.Content(role="model", parts=[part]))


def said(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


async def converse(runner: Runner, user: str, session_id: str, text: str) -> list[str]:
    replies: list[str] = []
    async for event in runner.run_async(user_id=user, session_id=session_id, new_message=said(text)):
        if event.content and event.content.parts:
            replies.extend(part.text for part in event.content.parts if part.text)
    return replies


def tool_responses(model: ScriptedModel) -> list[dict[str, Any]]:
    """What each function call answered, as the runner gave it back to the model."""
    found = []
    for request in model.requests:
        for content in request.contents:
            for part in content.parts or []:
                if part.function_response is not None:
                    found.append(part.function_response.response or {})
    return found


async def test_load_memory_finds_what_an_earlier_session_said(client: EngramClient) -> None:
    memory = EngramMemoryService(client)
    assert isinstance(memory, BaseMemoryService)
    sessions = InMemorySessionService()  # type: ignore[no-untyped-call]
    model = ScriptedModel(
        model="scripted",
        turns=[
            "Got it, have a good trip.",
            {"name": "load_memory", "args": {"query": "When is my flight to Lisbon?"}},
            "Your flight to Lisbon is on May 3rd.",
        ],
    )
    agent = LlmAgent(name="concierge", model=model, instruction="Help the traveller.", tools=[load_memory])
    runner = Runner(app_name=APP, agent=agent, session_service=sessions, memory_service=memory)

    first = await sessions.create_session(app_name=APP, user_id="alice", session_id="trip-1")
    assert await converse(runner, "alice", first.id, "I fly to Lisbon on May 3rd, seat 14C.") == [
        "Got it, have a good trip."
    ]
    ended = await sessions.get_session(app_name=APP, user_id="alice", session_id=first.id)
    assert ended is not None
    await memory.add_session_to_memory(ended)
    await memory.add_session_to_memory(ended)  # again, as a session may be: nothing twice

    # The session is an Engram conversation of the app's user: the user's turn and the agent's.
    recorded = await client.list_messages("travel:alice", "trip-1", after=memory.tokens["travel:alice"])
    assert [(m.role, m.speaker, m.content) for m in recorded.messages] == [
        ("user", None, "I fly to Lisbon on May 3rd, seat 14C."),
        ("assistant", "concierge", "Got it, have a good trip."),
    ]

    second = await sessions.create_session(app_name=APP, user_id="alice", session_id="trip-2")
    replies = await converse(runner, "alice", second.id, "When is my flight?")
    assert replies[-1] == "Your flight to Lisbon is on May 3rd."
    (loaded,) = tool_responses(model)
    memories = loaded["result"].memories  # load_memory's LoadMemoryResponse
    assert memories and memories[0].content.parts is not None
    assert memories[0].content.parts[0].text == "I fly to Lisbon on May 3rd, seat 14C."
    assert memories[0].author == "user" and memories[0].timestamp is not None
    assert memories[0].custom_metadata["session_id"] == "trip-1"

    # Another user of the app, or the same user of another app, finds nothing of it.
    assert (await memory.search_memory(app_name=APP, user_id="bob", query="flight to Lisbon")).memories == []
    assert (await memory.search_memory(app_name="shop", user_id="alice", query="flight to Lisbon")).memories == []


async def test_memories_are_added_searched_and_deleted_for_good(client: EngramClient) -> None:
    memory = EngramMemoryService(client)
    entry = MemoryEntry(content=types.Content(role="user", parts=[types.Part(text="Alice is allergic to peanuts")]))
    await memory.add_memory(app_name=APP, user_id="alice", memories=[entry])
    found = await memory.search_memory(app_name=APP, user_id="alice", query="what is Alice allergic to?")
    assert [m.content.parts[0].text for m in found.memories if m.content.parts] == ["Alice is allergic to peanuts"]
    (hit,) = found.memories
    await memory.delete_memory(app_name=APP, user_id="alice", memory_id=hit.id)
    assert (await memory.search_memory(app_name=APP, user_id="alice", query="peanuts allergy")).memories == []
    # Deleting what is not there (again, or another user's) does nothing, as ADK's own services.
    await memory.delete_memory(app_name=APP, user_id="alice", memory_id=hit.id)
    await memory.delete_memory(app_name=APP, user_id="bob", memory_id=hit.id)
    assert (await memory.search_memory(app_name=APP, user_id="alice", query="   ")).memories == []


async def test_events_added_as_deltas_are_recorded_once(client: EngramClient) -> None:
    from google.adk.events.event import Event

    memory = EngramMemoryService(client, user_id_for=lambda app, user: user)
    events = [
        Event(id=f"e{i}", invocation_id="i1", author="user", content=said(f"I like {food}"))
        for i, food in enumerate(["ramen", "tapas"])
    ]
    await memory.add_events_to_memory(app_name=APP, user_id="alice", events=events[:1], session_id="s1")
    await memory.add_events_to_memory(app_name=APP, user_id="alice", events=events, session_id="s1")
    listed = await client.list_messages("alice", "s1", after=memory.tokens["alice"])
    assert [m.content for m in listed.messages] == ["I like ramen", "I like tapas"]
    assert json.loads(json.dumps(listed.messages[0].item))["adk_event_id"] == "e0"
