"""``EngramStore`` as LangGraph meets it, against one running ``engram serve``: the store's own
API (sync and async), a compiled ``StateGraph`` whose nodes use ``get_store()``, and LangMem's
memory tools. No network, no LLM: the tools are called directly."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_store
from langgraph.graph import START, StateGraph
from langgraph.store.base import Item, SearchItem
from langmem import create_manage_memory_tool, create_search_memory_tool

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.integrations.langgraph import EngramStore, namespace_to_category
from tests.support import eventually

pytestmark = pytest.mark.e2e


@pytest.fixture
def store(engram_url: str, user: str) -> Iterator[EngramStore]:
    with EngramStore(engram_url, user_id=user, timeout=30) as s:
        yield s


def keys(items: list[SearchItem]) -> list[str]:
    return [item.key for item in items]


# The store's API ------------------------------------------------------------------------------


async def test_put_get_update_keeps_every_version(store: EngramStore, engram: EngramClient, user: str) -> None:
    namespace = ("memories", "Alice")
    assert await store.aget(namespace, "prefs") is None
    await store.aput(namespace, "prefs", {"drink": "tea", "tags": ["morning"]})
    first = await store.aget(namespace, "prefs")
    assert isinstance(first, Item)
    assert (first.namespace, first.key, first.value) == (namespace, "prefs", {"drink": "tea", "tags": ["morning"]})
    assert isinstance(first.created_at, datetime) and first.created_at.tzinfo is not None

    await store.aput(namespace, "prefs", {"drink": "coffee", "tags": ["morning"]})
    second = await store.aget(namespace, "prefs")
    assert second is not None and second.value["drink"] == "coffee"
    assert second.created_at == first.created_at and second.updated_at > first.updated_at

    await store.aput(namespace, "prefs", {"drink": "coffee", "tags": ["morning"]})  # the same again: no version
    note = await engram.get_by_key(user, namespace_to_category(namespace), "prefs")
    assert note is not None and note.category == "memories/x--ifwgsy3f" and note.version == 2
    history = await engram.history(user, note.id)
    assert [v.version for v in history.versions] == [1, 2]


async def test_delete_then_get_is_none_and_a_missing_key_is_no_op(store: EngramStore, engram: EngramClient) -> None:
    namespace = ("notes",)
    await store.aput(namespace, "k", {"text": "the boiler code is 4417"})
    assert await store.aget(namespace, "k") is not None
    await store.adelete(namespace, "k")
    assert await store.aget(namespace, "k") is None
    assert await store.asearch(namespace, query="boiler code") == []
    assert await store.alist_namespaces() == []
    await store.adelete(namespace, "k")  # already gone
    await store.adelete(namespace, "never-put")
    # Put again after a delete: a new item.
    await store.aput(namespace, "k", {"text": "new"})
    again = await store.aget(namespace, "k")
    assert again is not None and again.value == {"text": "new"}


async def test_a_search_finds_what_was_just_put_every_time(store: EngramStore) -> None:
    namespace = ("facts", "travel")
    facts = [
        ("f1", "The user's passport expires in March 2031"),
        ("f2", "The user prefers aisle seats on long flights"),
        ("f3", "The user is allergic to shellfish"),
        ("f4", "The user's frequent flyer number is with KLM"),
        ("f5", "The user's favourite city is Lisbon"),
    ]
    for key, text in facts:
        await store.aput(namespace, key, {"text": text})
        # No wait: the store's token makes the search wait for its own write.
        found = await store.asearch(namespace, query=text, limit=3)
        assert found and found[0].key == key, (key, [(i.key, i.score) for i in found])
        assert isinstance(found[0].score, float) and found[0].namespace == namespace
    listed = await store.asearch(namespace, limit=10)
    assert keys(listed) == [k for k, _ in facts] and all(item.score is None for item in listed)


async def test_filters_exact_and_compared(store: EngramStore) -> None:
    namespace = ("items",)
    for i in range(6):
        value = {"n": i, "kind": "even" if i % 2 == 0 else "odd", "meta": {"source": "chat" if i < 3 else "mail"}}
        await store.aput(namespace, f"i{i}", {**value, "text": f"item number {i} about gardening"})

    async def filtered(filter: dict[str, Any], query: str | None = None) -> list[str]:
        return sorted(keys(await store.asearch(namespace, query=query, filter=filter, limit=20)))

    assert await filtered({"kind": "even"}) == ["i0", "i2", "i4"]
    assert await filtered({"n": {"$gt": 3}}) == ["i4", "i5"]
    assert await filtered({"n": {"$gte": 1, "$lt": 3}}) == ["i1", "i2"]
    assert await filtered({"n": {"$lte": 0}}) == ["i0"]
    assert await filtered({"n": {"$ne": 2}, "kind": "even"}) == ["i0", "i4"]
    assert await filtered({"n": {"$eq": 5}}) == ["i5"]
    assert await filtered({"meta": {"source": "mail"}}) == ["i3", "i4", "i5"]  # nested, field by field
    assert await filtered({"meta.source": "chat", "kind": "odd"}) == ["i1"]
    assert await filtered({"missing": 1}) == []
    assert await filtered({"kind": "odd"}, query="gardening") == ["i1", "i3", "i5"]
    assert await filtered({"n": {"$gt": 3}}, query="gardening") == ["i4", "i5"]


async def test_limit_and_offset_page_through_items(store: EngramStore) -> None:
    namespace = ("pages",)
    for i in range(7):
        await store.aput(namespace, f"p{i}", {"text": f"page {i} of the user's cookbook: soup recipe {i}"})
    listed = [keys(await store.asearch(namespace, limit=3, offset=o)) for o in (0, 3, 6)]
    assert listed == [["p0", "p1", "p2"], ["p3", "p4", "p5"], ["p6"]]
    assert await store.asearch(namespace, limit=3, offset=7) == []
    ranked = keys(await store.asearch(namespace, query="soup recipe", limit=7))
    assert sorted(ranked) == [f"p{i}" for i in range(7)]
    pages = [keys(await store.asearch(namespace, query="soup recipe", limit=2, offset=o)) for o in (0, 2, 4, 6)]
    assert [key for page in pages for key in page] == ranked


async def test_namespaces_are_isolated_and_a_prefix_sees_its_children(
    store: EngramStore, engram_url: str, user: str
) -> None:
    puts = {
        ("docs",): "root",
        ("docs", "a"): "in a",
        ("docs", "b"): "in b",
        ("docsx",): "beside",
        ("Docs",): "capital",
        ("docs", "a", "deep"): "deeper",
    }
    for namespace, text in puts.items():
        await store.aput(namespace, "same-key", {"text": f"quarterly report {text}"})
    for namespace, text in puts.items():
        item = await store.aget(namespace, "same-key")
        assert item is not None and item.value["text"] == f"quarterly report {text}" and item.namespace == namespace
    assert await store.aget(("docs", "c"), "same-key") is None

    def spaces(items: list[SearchItem]) -> set[tuple[str, ...]]:
        return {item.namespace for item in items}

    for query in (None, "quarterly report"):
        assert spaces(await store.asearch(("docs", "a"), query=query)) == {("docs", "a"), ("docs", "a", "deep")}
        assert spaces(await store.asearch(("docs",), query=query)) == {
            ("docs",),
            ("docs", "a"),
            ("docs", "b"),
            ("docs", "a", "deep"),
        }
        assert spaces(await store.asearch(("docs", "b"), query=query)) == {("docs", "b")}
        assert spaces(await store.asearch((), query=query)) == set(puts)
    # Another user's store with the same namespaces sees none of it.
    async with EngramStore(engram_url, user_id=f"{user}-other") as other:
        assert await other.aget(("docs",), "same-key") is None
        assert await other.asearch(("docs",)) == []
        assert await other.asearch(("docs",), query="quarterly report") == []
        assert await other.alist_namespaces() == []


async def test_notes_saved_without_a_key_are_never_items(store: EngramStore, engram: EngramClient, user: str) -> None:
    await engram.save(user, "The user's quarterly report is due Friday", category="docs")
    await engram.save(user, "A note only the text API saw", category="general")
    await store.aput(("docs",), "r", {"text": "quarterly report draft"})
    assert keys(await store.asearch(("docs",))) == ["r"]
    # A page is full: the unkeyed note, the better match, is left out before paging.
    assert keys(await store.asearch((), query="The user's quarterly report is due Friday", limit=1)) == ["r"]
    assert keys(await store.asearch(("docs",), limit=1)) == ["r"]
    assert await store.alist_namespaces() == [("docs",)]


async def test_list_namespaces_prefix_suffix_and_max_depth(store: EngramStore) -> None:
    for namespace in [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
        ("a", "c", "f"),
        ("b", "a", "f"),
        ("users", "Ünïcode", "v1"),
    ]:
        await store.aput(namespace, "k", {"v": 1})
    assert await store.alist_namespaces(prefix=("a", "b")) == [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
    ]
    # LangGraph's own docstring example: max_depth truncates, and the same prefix is listed once.
    assert await store.alist_namespaces(prefix=("a", "b"), max_depth=3) == [
        ("a", "b", "c"),
        ("a", "b", "d"),
        ("a", "b", "f"),
    ]
    assert await store.alist_namespaces(suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert await store.alist_namespaces(prefix=("a",), suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f")]
    assert await store.alist_namespaces(prefix=("*", "b")) == [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
    ]
    assert await store.alist_namespaces(max_depth=1) == [("a",), ("b",), ("users",)]
    assert await store.alist_namespaces(prefix=("users",)) == [("users", "Ünïcode", "v1")]
    assert await store.alist_namespaces(suffix=("Ünïcode", "*")) == [("users", "Ünïcode", "v1")]
    everything = await store.alist_namespaces()
    assert len(everything) == 7
    assert await store.alist_namespaces(limit=3, offset=2) == everything[2:5]
    assert await store.alist_namespaces(prefix=("nothing",)) == []


async def test_engram_refusals_propagate(store: EngramStore) -> None:
    with pytest.raises(EngramError) as refused:
        await store.aput(("notes",), "k" * 513, {"v": 1})
    assert refused.value.code is ErrorCode.INVALID_PARAMETER


def test_the_sync_api_from_plain_threads(store: EngramStore) -> None:
    """Blocking calls from threads that have no event loop, several at once."""
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            namespace = ("threads", f"t{n}")
            store.put(namespace, "k", {"text": f"thread {n} remembers the number {n * 11}"})
            item = store.get(namespace, "k")
            assert item is not None and item.value["text"].startswith(f"thread {n} ")
            found = store.search(namespace, query=f"the number {n * 11}")
            assert [i.key for i in found] == ["k"]
            store.delete(namespace, "k")
            assert store.get(namespace, "k") is None
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert store.list_namespaces() == []


async def test_a_batch_runs_in_order(store: EngramStore) -> None:
    from langgraph.store.base import GetOp, ListNamespacesOp, PutOp, SearchOp

    results = await store.abatch(
        [
            GetOp(("b",), "k"),
            PutOp(("b",), "k", {"v": 1}),
            GetOp(("b",), "k"),
            SearchOp(("b",)),
            PutOp(("b",), "k", None),
            GetOp(("b",), "k"),
            ListNamespacesOp(),
        ]
    )
    assert results[0] is None and results[1] is None
    assert isinstance(results[2], Item) and results[2].value == {"v": 1}
    assert isinstance(results[3], list) and [i.key for i in results[3]] == ["k"]  # type: ignore[union-attr]
    assert results[4] is None and results[5] is None and results[6] == []


# A real graph -----------------------------------------------------------------------------------


class State(TypedDict):
    fact: str
    seen: list[str]


def test_a_compiled_graph_remembers_across_runs(store: EngramStore) -> None:
    def remember(state: State) -> dict[str, Any]:
        memories = get_store()
        seen = [item.value["fact"] for item in memories.search(("facts",), limit=50)]
        memories.put(("facts",), f"fact-{len(seen)}", {"fact": state["fact"]})
        return {"seen": seen}

    graph = StateGraph(State).add_node("remember", remember).add_edge(START, "remember").compile(store=store)
    assert graph.invoke({"fact": "likes green tea", "seen": []})["seen"] == []
    assert graph.invoke({"fact": "lives in Oslo", "seen": []})["seen"] == ["likes green tea"]
    assert graph.invoke({"fact": "has a cat", "seen": []})["seen"] == ["likes green tea", "lives in Oslo"]


async def test_an_async_graph_remembers_across_runs(store: EngramStore) -> None:
    async def remember(state: State) -> dict[str, Any]:
        memories = get_store()
        found = await memories.asearch(("facts",), query=state["fact"], limit=5)
        # A sync call on the graph's running loop works too (it blocks this loop, not the store's).
        assert memories.get(("facts",), "never-put") is None
        await memories.aput(("facts",), uuid.uuid4().hex, {"fact": state["fact"]})
        return {"seen": [item.value["fact"] for item in found]}

    graph = StateGraph(State).add_node("remember", remember).add_edge(START, "remember").compile(store=store)
    assert (await graph.ainvoke({"fact": "the user's dog is called Rex", "seen": []}))["seen"] == []
    second = await graph.ainvoke({"fact": "what is the dog called?", "seen": []})
    assert second["seen"][0] == "the user's dog is called Rex"


# LangMem's memory tools ------------------------------------------------------------------------

NAMESPACE = ("memories", "{langgraph_user_id}")


def config_for(langgraph_user: str) -> RunnableConfig:
    return {"configurable": {"langgraph_user_id": langgraph_user}}


def memories_of(search_result: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(search_result)
    return found


async def test_langmem_tools_in_a_graph_create_update_search_delete(store: EngramStore) -> None:
    manage = create_manage_memory_tool(NAMESPACE)
    search = create_search_memory_tool(NAMESPACE)

    class Call(TypedDict):
        tool: str
        args: dict[str, Any]
        result: str

    async def call_tool(state: Call) -> dict[str, Any]:
        # As a ToolNode would: the tool finds the graph's store through get_store().
        tool = manage if state["tool"] == "manage" else search
        return {"result": str(await tool.ainvoke(state["args"]))}

    graph = StateGraph(Call).add_node("call", call_tool).add_edge(START, "call").compile(store=store)

    async def run(tool: str, who: str, **args: Any) -> str:
        done = await graph.ainvoke({"tool": tool, "args": args, "result": ""}, config_for(who))
        result: str = done["result"]
        return result

    created = await run("manage", "alice", content="Alice's favourite colour is teal")
    assert created.startswith("created memory ")
    memory_id = created.removeprefix("created memory ")
    item = await store.aget(("memories", "alice"), memory_id)
    assert item is not None and item.value == {"content": "Alice's favourite colour is teal"}

    found = memories_of(await run("search", "alice", query="what colour does Alice like?"))
    assert [m["key"] for m in found] == [memory_id]
    assert found[0]["namespace"] == ["memories", "alice"] and isinstance(found[0]["score"], float)
    assert memories_of(await run("search", "bob", query="what colour does Alice like?")) == []

    updated = await run(
        "manage", "alice", content="Alice's favourite colour is now orange", action="update", id=memory_id
    )
    assert updated == f"updated memory {memory_id}"
    found = memories_of(await run("search", "alice", query="favourite colour"))
    assert [(m["key"], m["value"]["content"]) for m in found] == [(memory_id, "Alice's favourite colour is now orange")]

    deleted = await run("manage", "alice", action="delete", id=memory_id)
    assert deleted == f"Deleted memory {memory_id}"
    assert memories_of(await run("search", "alice", query="favourite colour")) == []
    assert await store.aget(("memories", "alice"), memory_id) is None


def test_langmem_tools_called_directly_with_the_store(store: EngramStore) -> None:
    """Outside a graph: the tools are given the store, the namespace comes from the config."""
    manage = create_manage_memory_tool(NAMESPACE, store=store)
    search = create_search_memory_tool(NAMESPACE, store=store)
    config = config_for("Carol@Example")  # not a slug: its label is encoded
    created = manage.invoke({"content": "Carol takes the 7:40 train"}, config)
    memory_id = created.removeprefix("created memory ")
    found = memories_of(search.invoke({"query": "which train does Carol take?"}, config))
    assert [m["key"] for m in found] == [memory_id] and found[0]["namespace"] == ["memories", "Carol@Example"]
    manage.invoke({"content": "Carol now takes the 8:10 train", "action": "update", "id": memory_id}, config)
    found = memories_of(search.invoke({"query": "which train does Carol take?"}, config))
    assert [m["value"]["content"] for m in found] == ["Carol now takes the 8:10 train"]
    manage.invoke({"action": "delete", "id": memory_id}, config)
    assert memories_of(search.invoke({"query": "train"}, config)) == []
    assert store.list_namespaces(prefix=("memories",)) == []


async def test_langmem_async_tools_directly(store: EngramStore) -> None:
    manage = create_manage_memory_tool(NAMESPACE, store=store)
    search = create_search_memory_tool(NAMESPACE, store=store)
    config = config_for("dave")
    ids = [
        (await manage.ainvoke({"content": text}, config)).removeprefix("created memory ")
        for text in ("Dave plays the cello", "Dave is vegetarian")
    ]
    found = memories_of(await search.ainvoke({"query": "what instrument does Dave play?", "limit": 1}, config))
    assert [m["key"] for m in found] == [ids[0]]
    assert sorted(i.key for i in await store.asearch(("memories", "dave"))) == sorted(ids)
    await asyncio.gather(*(manage.ainvoke({"action": "delete", "id": i}, config) for i in ids))
    assert await store.asearch(("memories", "dave")) == []


async def test_a_client_is_given_unconnected_and_the_store_owns_it(engram_url: str, user: str) -> None:
    async with EngramClient(engram_url) as connected:
        with pytest.raises(ValueError, match="not connected yet"):
            EngramStore(connected, user_id=user)
    async with EngramStore(EngramClient(engram_url, timeout=30), user_id=user) as store:
        await store.aput(("given",), "k", {"v": 1})
        item = await store.aget(("given",), "k")
        assert item is not None and item.value == {"v": 1}


async def test_an_item_put_with_a_ttl_is_forgotten_when_it_runs_out_unless_read(
    engram_url: str, engram: EngramClient, user: str
) -> None:
    # 0.05 minutes: 3 s, long enough to be read before it runs out on a busy machine. A store
    # whose reads do not renew, and one whose reads do.
    with EngramStore(engram_url, user_id=user, ttl={"refresh_on_read": False}) as store:
        await store.aput(("cache",), "otp", {"code": "pelican-0093"}, ttl=0.05)
        await store.aput(("cache",), "read", {"code": "kept while read"}, ttl=0.05)
        await store.aput(("cache",), "forever", {"code": "no ttl"})
        otp = await engram.get_by_key(user, "cache", "otp", after=store.token)
        assert otp is not None, "read before its time ran out"
        assert otp.expires_at is not None
        read = await engram.get_by_key(user, "cache", "read")
        assert read is not None and read.expires_at is not None
        first_expiry = read.expires_at

        async def unread_one_run_out() -> bool:
            assert await store.aget(("cache",), "read", refresh_ttl=True) is not None, "renewed by each read"
            # Past the time to live it was put with: the read one is there because it was renewed.
            past = datetime.now(UTC) > first_expiry + timedelta(seconds=0.5)
            return past and await store.aget(("cache",), "otp") is None

        await eventually(unread_one_run_out, 60, interval=0.5, what="the item never read run out")
        assert sorted(keys(await store.asearch(("cache",)))) == ["forever", "read"]
        note = await engram.get_by_key(user, "cache", "forever")
        assert note is not None and note.expires_at is None
    # The expired item was forgotten by Engram's timer, as any forget: no history left.
    history = await engram.history(user, otp.id)
    assert history.status == "forgotten" and history.versions == []
