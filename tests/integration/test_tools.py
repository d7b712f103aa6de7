"""Every tool of every profile through the dispatcher, over the real bus, with result shapes
checked against docs/requirements.md; and its example conversations replayed as tool calls."""

from __future__ import annotations

from typing import Any

import pytest

from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.contracts.limits import LIST_NOTES_MAX, LIST_NOTES_PAGE
from engram_ledger.services.agents.tools import PROFILES, ToolDispatcher
from engram_ledger.services.bus.client import EngramClient

# One service for the module (tests/conftest.py, ``shared_service``): each test is a user of its own.
pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture
def client(shared_client: EngramClient) -> EngramClient:
    return shared_client


def tools(client: EngramClient, profile: str, user: str, session: str | None = None) -> ToolDispatcher:
    return ToolDispatcher(client, user, profile, session)


async def test_unknown_tools_and_bad_arguments_are_error_objects(client: EngramClient, user: str) -> None:
    t = tools(client, "memento", user)
    assert (await t.call("nope", {}))["error"]["code"] == "INVALID_PARAMETER"
    assert (await t.call("store_memory", {}))["error"]["code"] == "INVALID_PARAMETER"
    missing = await t.call("supersede_memory", {"old_memory_id": "AAAAAAAA", "new_memory_id": "BBBBBBBB"})
    assert missing["error"]["code"] == "MEMORY_NOT_FOUND" and "not found" in missing["error"]["message"]


async def test_runtime_profile(client: EngramClient, user: str) -> None:
    """Requirements §2: save returns a stable note_id, update keeps it, search finds notes and (with
    include_conversation) the current session, delete goes through the two calls."""
    t = tools(client, "runtime", user, session="chat-1")
    saved = await t.call("memory_save", {"content": "User's name is Shantanu"})
    note = saved["note_id"]
    assert len(note) == 8 and "message" in saved
    found = await t.call("memory_search", {"query": "what is the user's name?"})
    assert found["results"][0] == {**found["results"][0], "note_id": note, "text": "User's name is Shantanu"}
    assert set(found["results"][0]) == {"note_id", "text", "score", "relevance", "source"}
    updated = await t.call("memory_update", {"note_id": note, "content": "User prefers to be called SG"})
    assert updated["note_id"] == note
    found = await t.call("memory_search", {"query": "what should I call the user?"})
    assert found["results"][0]["note_id"] == note and found["results"][0]["text"] == "User prefers to be called SG"
    said = await client.record_message(user, "chat-1", "By the way my flight lands at 6pm")
    t.track(said.token)
    plain = await t.call("memory_search", {"query": "when does my flight land?"})
    assert all(r["source"] == "memory" for r in plain["results"])
    both = await t.call("memory_search", {"query": "when does my flight land?", "include_conversation": True})
    assert both["results"][0]["source"] == "conversation"
    assert (await t.call("memory_update", {"note_id": "ZZZZZZZZ", "content": "x"}))["error"]["code"] == (
        "MEMORY_NOT_FOUND"
    )
    asked = await t.call("memory_delete", {"note_id": note})
    assert asked["status"] == "confirmation_required" and asked["pending"][0]["id"] == note
    done = await t.call("memory_delete", {"note_id": note})
    assert done["status"] == "forgotten" and done["note_id"] == note
    assert (await t.call("memory_delete", {"note_id": note}))["error"]["code"] == "MEMORY_NOT_FOUND"


async def test_versioned_alec_is_my_boss_and_sarah_moved_to_design(client: EngramClient, user: str) -> None:
    """Requirements §3: add_to_memory with categories and subjects; a known subject suggests
    update_memory; update keeps the id and reports old -> new; /memory-style context block."""
    t = tools(client, "prd29", user)  # by its old name: configurations that use it keep working
    alec = await t.call(
        "add_to_memory", {"content": "Alec is the user's boss at TechCorp", "category": "person", "subject": "Alec"}
    )
    assert alec["created"] is True and len(alec["id"]) == 8
    sarah = await t.call(
        "add_to_memory", {"content": "Sarah works on the Platform team", "category": "person", "subject": "Sarah"}
    )
    clash = await t.call(
        "add_to_memory", {"content": "Sarah moved to the Design team", "category": "person", "subject": "Sarah"}
    )
    assert clash["created"] is False and clash["existing_id"] == sarah["id"] and "update_memory" in clash["message"]
    moved = await t.call("update_memory", {"memory_id": sarah["id"], "content": "Sarah is on the Design team"})
    assert moved["id"] == sarah["id"] and moved["version"] == 2
    assert moved["old_content"] == "Sarah works on the Platform team"
    assert moved["new_content"] == "Sarah is on the Design team"
    friday = await t.call(
        "add_to_memory", {"content": "User prefers tasks to have due dates on Fridays", "category": "preference"}
    )
    assert (await t.call("add_to_memory", {"content": "hey", "category": "person"}))["error"]["code"] == (
        "INVALID_PARAMETER"
    )
    block = await client.context(user, after=t.last_token)
    assert f"- [id:{alec['id']}] [Alec] Alec is the user's boss at TechCorp" in block.text
    assert f"- [id:{sarah['id']}] [Sarah] Sarah is on the Design team" in block.text
    assert f"### Preference\n- [id:{friday['id']}] User prefers tasks to have due dates on Fridays" in block.text


async def test_memento_the_austin_supersede(client: EngramClient, user: str) -> None:
    """Requirements §4: store_memory answers created / similar / action_required; supersede_memory;
    search_memories hides the superseded one and carries relevance_score."""
    t = tools(client, "memento", user)
    seattle = await t.call("store_memory", {"content": "User lives in Seattle", "confidence": 0.9})
    assert seattle["similar"] == [] and seattle["action_required"] is None
    created = seattle["created"]
    assert set(created) >= {"id", "content", "confidence", "source", "created_at", "updated_at", "accessed_at"}
    assert created["source"] == "extracted" and created["confidence"] == 0.9
    austin = await t.call("store_memory", {"content": "User moved to Austin last month", "source": "explicit"})
    old, new = seattle["created"]["id"], austin["created"]["id"]
    assert [s["id"] for s in austin["similar"]] == [old] and austin["similar"][0]["content"] == "User lives in Seattle"
    assert austin["action_required"] == f'Call supersede_memory("{old}", "{new}") to mark the old memory as outdated.'
    result = await t.call("supersede_memory", {"old_memory_id": old, "new_memory_id": new})
    assert result == {"success": True, "message": f"Memory {old} marked as superseded by {new}"}
    found = await t.call("search_memories", {"query": "Where does the user live?", "limit": 3})
    assert [m["id"] for m in found["memories"]] == [new]
    assert 0 < found["memories"][0]["relevance_score"] <= 2 and found["memories"][0]["supersedes"] == old
    recent = await t.call("list_recent_memories", {"limit": 5})
    assert [m["id"] for m in recent["memories"]] == [new]


async def test_assistant_batch_extraction_with_a_duplicate(client: EngramClient, user: str) -> None:
    """Requirements §5: extract_memory in a batch, exact duplicates (case and spacing) caught, and
    memory_updated: true; update, list, remove (two calls)."""
    t = tools(client, "assistant", user)
    first = await t.call(
        "extract_memory", {"facts": [{"content": "Likes black coffee"}, {"content": "Has a dog named Max"}]}
    )
    assert first["memory_updated"] is True and len(first["saved"]) == 2 and first["duplicates"] == []
    again = await t.call(
        "extract_memory",
        {"facts": [{"content": "likes  BLACK coffee"}, {"content": "Allergic to peanuts", "category": "health"}]},
    )
    assert again["memory_updated"] is True and len(again["saved"]) == 1
    assert again["duplicates"] == [{"content": "likes  BLACK coffee", "existing_id": first["saved"][0]}]
    nothing = await t.call("extract_memory", {"facts": [{"content": "Has a dog named Max"}]})
    assert nothing["memory_updated"] is False
    listed = await t.call("list_memories", {})
    assert {f["content"] for f in listed["facts"]} == {
        "Likes black coffee",
        "Has a dog named Max",
        "Allergic to peanuts",
    }
    assert all(set(f) == {"id", "content", "category", "created_at"} for f in listed["facts"])
    tea = await t.call("update_memory", {"fact_id": first["saved"][0], "content": "Prefers tea"})
    assert tea["memory_updated"] is True and tea["fact_id"] == first["saved"][0]
    dog = first["saved"][1]
    asked = await t.call("remove_memory", {"fact_ids": [dog]})
    assert asked["memory_updated"] is False and asked["status"] == "confirmation_required"
    removed = await t.call("remove_memory", {"fact_ids": [dog]})
    assert removed["memory_updated"] is True and removed["deleted"] == [dog]
    xml = await client.context(user, format="xml", after=t.last_token)
    assert "<facts>\n    Prefers tea. Allergic to peanuts.\n  </facts>" in xml.text  # category, then age


async def test_forget_profile_the_san_francisco_forget(client: EngramClient, user: str) -> None:
    """Requirements §1's conversation: query -> candidates with ids; the chosen id -> please confirm;
    the same id -> deleted; the other candidate stays."""
    t = tools(client, "forget", user)
    lives = await client.save(user, "User lives in San Francisco", advise=False)
    visited = await client.save(user, "User visited San Francisco last year", advise=False)
    await client.save(user, "User likes hiking in Yosemite", advise=False)
    t.track(visited.token)
    found = await t.call("forget", {"query": "San Francisco"})
    assert found["status"] == "candidates"
    assert {c["id"] for c in found["candidates"][:2]} == {lives.note_id, visited.note_id}
    assert all(set(c) == {"id", "content", "similarity"} for c in found["candidates"])
    asked = await t.call("forget", {"memory_id": lives.note_id})
    assert asked["status"] == "confirmation_required" and "Please confirm" in asked["message"]
    assert asked["pending"][0]["content_preview"] == "User lives in San Francisco"
    done = await t.call("forget", {"memory_id": lives.note_id})
    assert done["status"] == "forgotten" and done["deleted"] == [lives.note_id]
    assert (await t.call("forget", {}))["error"]["code"] == "INVALID_PARAMETER"
    assert (await client.get_note(user, visited.note_id)).status == "active"


async def test_engram_profile_every_tool(client: EngramClient, user: str) -> None:
    t = tools(client, "engram", user)
    saved = await t.call("save", {"content": "Alec is my boss", "category": "person", "subject": "Alec"})
    note = saved["note_id"]
    newer = await t.call("save", {"content": "Alec retired in May and Priya is my boss now", "category": "person"})
    assert newer["similar"] and newer["similar"][0]["note_id"] == note and "supersede" in newer["action_required"]
    assert (await t.call("update", {"note_id": note, "content": "Alec was my boss"}))["version"] == 2
    assert (await t.call("supersede", {"old_id": note, "new_id": newer["note_id"]}))["superseded_by"] == newer[
        "note_id"
    ]
    hits = await t.call("search", {"query": "who is my boss?"})
    assert [h["note_id"] for h in hits["results"]] == [newer["note_id"]]
    assert [n["id"] for n in (await t.call("list", {"include_superseded": True}))["notes"]] == sorted(
        [note, newer["note_id"]], key=lambda i: i != note
    )
    history = await t.call("history", {"note_id": note})
    assert [v["change"] for v in history["versions"]] == ["saved", "updated", "superseded"]
    block = await t.call("context", {"format": "markdown"})
    assert newer["note_id"] in block["text"] and note not in block["text"] and block["tokens"] > 0
    episode = await t.call(
        "save",
        {
            "content": "Dinner with Sarah at Flour+Water",
            "kind": "episode",
            "summary": "Dinner plans with sister Sarah",
            "narrative": "Alex asked to be reminded about dinner with Sarah on Saturday at 7pm.",
            "occurred_at": "2026-01-20T19:00:00+00:00",
            "links": [newer["note_id"]],
        },
    )
    stored = await client.get_note(user, episode["note_id"], after=episode["token"])
    assert stored.links == [newer["note_id"]] and stored.summary == "Dinner plans with sister Sarah"
    linked_fact = await t.call("save", {"content": "a fact with links", "links": [note]})
    assert linked_fact["error"]["code"] == "INVALID_PARAMETER"
    assert (await t.call("forget", {"note_id": episode["note_id"]}))["status"] == "confirmation_required"


async def test_the_tools_that_list_notes_page_them(client: EngramClient, user: str) -> None:
    """The listing tools returned the whole memory in one result; they now page it."""
    written = await client.save_many(user, [NoteDraft(content=f"fact number {i}") for i in range(5)])
    for name, key in (("engram", "notes"), ("assistant", "facts")):
        t = tools(client, name, user)
        t.track(written.token)
        lister = "list" if name == "engram" else "list_memories"
        first = await t.call(lister, {"limit": 2})
        assert len(first[key]) == 2 and first["total"] == 5 and first["next_offset"] == 2, first
        last = await t.call(lister, {"offset": 4, "limit": 2})
        assert len(last[key]) == 1 and last["total"] == 5 and "next_offset" not in last, last
        assert (await t.call(lister, {"limit": LIST_NOTES_MAX + 1}))["error"]["code"] == "INVALID_PARAMETER"
        everything = await t.call(lister, {})
        assert len(everything[key]) == 5 and "next_offset" not in everything
    specs = {s.name: s for s in PROFILES["engram"] + PROFILES["assistant"]}
    for name in ("list", "list_memories"):
        assert specs[name].parameters["properties"]["limit"]["default"] == LIST_NOTES_PAGE


def _shape(result: dict[str, Any]) -> set[str]:
    return set(result)


@pytest.mark.parametrize(
    ("profile", "tool", "listed"),
    [
        ("engram", "search", "results"),
        ("memento", "search_memories", "memories"),
        ("runtime", "memory_search", "results"),
    ],
)
async def test_every_search_tool_says_in_words_when_nothing_matched(
    client: EngramClient, user: str, profile: str, tool: str, listed: str
) -> None:
    t = tools(client, profile, user, session="chat-1")
    save = {"engram": "save", "memento": "store_memory", "runtime": "memory_save"}[profile]
    await t.call(save, {"content": "Keeps bees on the roof"})
    nothing = await t.call(tool, {"query": "What is the capital of Peru?"})
    assert nothing[listed] == [] and nothing["message"].startswith("No memory matched 'What is the capital of Peru?'")
    every = await t.call(tool, {"query": "What is the capital of Peru?", "min_relevance": 0})
    assert len(every[listed]) == 1 and "message" not in every
    found = await t.call(tool, {"query": "who keeps bees?"})
    assert len(found[listed]) == 1 and "message" not in found
