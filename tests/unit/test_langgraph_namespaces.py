"""The LangGraph store's pure parts: namespace <-> category, filter -> where, and
list_namespaces' selection (checked against LangGraph's own InMemoryStore). No Redis: the
store refuses what it must before any I/O."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_ledger.contracts.limits import CATEGORY_PATTERN, MAX_CATEGORY_CHARS

# The langgraph extra (scripts/test.sh installs it): without it, these tests are skipped, and
# the rest of the unit tests still collect.
pytest.importorskip("langgraph.store.base", reason="needs the langgraph extra")

from langgraph.store.base import InvalidNamespaceError, ListNamespacesOp, MatchCondition, PutOp
from langgraph.store.memory import InMemoryStore

from engram_ledger.services.integrations.langgraph import (
    EngramStore,
    category_to_namespace,
    decode_segment,
    encode_label,
    filter_to_where,
    listing_prefix,
    namespace_to_category,
    select_namespaces,
)

# What LangGraph accepts as a label: any non-empty string without "." or NUL.
labels = st.text(min_size=1, max_size=30).filter(lambda s: "." not in s and "\x00" not in s)


def test_a_label_that_is_already_a_segment_is_kept() -> None:
    assert namespace_to_category(("memories", "alice", "user-1_2", "0")) == "memories/alice/user-1_2/0"


def test_any_other_label_is_x_dash_dash_and_lower_case_base32_without_padding() -> None:
    assert encode_label("Alice") == "x--ifwgsy3f"
    assert encode_label("café") == "x--mnqwnq5j"
    assert encode_label("a/b") == "x--mexwe"  # a "/" never splits a label
    assert encode_label("-a") == "x--fvqq"  # a segment starts with a letter or digit
    # A label that looks encoded is encoded itself, so decoding is never ambiguous.
    assert encode_label("x--y") == "x--paws26i"
    assert namespace_to_category(("memories", "Alice Smith")) == "memories/" + encode_label("Alice Smith")


@pytest.mark.parametrize(
    "namespace",
    [("memories", "alice"), ("Mémoires", "日本語", "x--y", "a/b"), ("*",), ("🙂", " ", "UPPER", "x--")],
)
def test_round_trip(namespace: tuple[str, ...]) -> None:
    category = namespace_to_category(namespace)
    assert re.fullmatch(CATEGORY_PATTERN, category)
    assert category_to_namespace(category) == namespace


@settings(max_examples=300)
@given(st.lists(labels, min_size=1, max_size=4).map(tuple))
def test_every_namespace_that_fits_round_trips_through_a_valid_category(namespace: tuple[str, ...]) -> None:
    try:
        category = namespace_to_category(namespace)
    except InvalidNamespaceError:
        assert len("/".join(encode_label(label) for label in namespace)) > MAX_CATEGORY_CHARS
        return
    assert re.fullmatch(CATEGORY_PATTERN, category) and len(category) <= MAX_CATEGORY_CHARS
    assert category_to_namespace(category) == namespace


def test_a_namespace_longer_than_a_category_is_refused_naming_it() -> None:
    namespace = ("memories", "É" * 80)
    with pytest.raises(InvalidNamespaceError, match=r"namespace \('memories', 'ÉÉÉ.*200"):
        namespace_to_category(namespace)
    assert namespace_to_category(("a" * MAX_CATEGORY_CHARS,)) == "a" * MAX_CATEGORY_CHARS
    with pytest.raises(InvalidNamespaceError):
        namespace_to_category(("a" * (MAX_CATEGORY_CHARS - 1), "b"))
    with pytest.raises(InvalidNamespaceError, match="empty"):
        namespace_to_category(())


@pytest.mark.parametrize(
    "segment",
    [
        "x--mfra",  # base32("ab"): "ab" is written as it is, never so
        "x--mfrb",  # another spelling of base32("ab")'s bits
        "x--1",  # not base32
        "x--m",  # not a whole number of bytes
        "x--7q",  # not UTF-8
        "x--fy",  # ".": no LangGraph label has one
    ],
)
def test_a_segment_no_label_encodes_to_is_no_namespace(segment: str) -> None:
    assert decode_segment(segment) is None
    assert category_to_namespace(f"memories/{segment}") is None


def test_filter_becomes_where_with_nested_objects_as_dotted_paths() -> None:
    assert filter_to_where(None) is None and filter_to_where({}) is None
    assert filter_to_where({"kind": "fact", "score": {"$gt": 4, "$lte": 9}}) == {
        "kind": "fact",
        "score": {"$gt": 4, "$lte": 9},
    }
    assert filter_to_where({"meta": {"source": "chat", "deep": {"n": {"$ne": 1}}}, "tags": ["a"]}) == {
        "meta.source": "chat",
        "meta.deep.n": {"$ne": 1},
        "tags": ["a"],
    }


def test_listing_narrows_by_the_literal_head_of_a_prefix() -> None:
    assert listing_prefix(None) is None
    assert listing_prefix((MatchCondition("suffix", ("v1",)),)) is None
    assert listing_prefix((MatchCondition("prefix", ("*", "a")),)) is None
    assert listing_prefix((MatchCondition("prefix", ("memories", "Alice", "*", "x")),)) == "memories/x--ifwgsy3f"


def test_categories_no_namespace_maps_to_are_not_listed() -> None:
    op = ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0)
    assert select_namespaces(["general", "x--mfra", "memories/x--ifwgsy3f", "memories/x--1"], op) == [
        ("general",),
        ("memories", "Alice"),
    ]


NAMESPACES = st.lists(
    st.lists(st.sampled_from(["a", "b", "Alice", "x--y", "café"]), min_size=1, max_size=4).map(tuple),
    min_size=1,
    max_size=12,
)
PATHS = st.lists(st.sampled_from(["a", "b", "Alice", "café", "*"]), min_size=1, max_size=3).map(tuple)


@settings(max_examples=300, deadline=None)
@given(
    namespaces=NAMESPACES,
    prefix=st.none() | PATHS,
    suffix=st.none() | PATHS,
    max_depth=st.none() | st.integers(1, 4),
    limit=st.integers(1, 20),
    offset=st.integers(0, 5),
)
def test_list_namespaces_selects_as_langgraphs_in_memory_store_does(
    namespaces: list[tuple[str, ...]],
    prefix: tuple[str, ...] | None,
    suffix: tuple[str, ...] | None,
    max_depth: int | None,
    limit: int,
    offset: int,
) -> None:
    reference = InMemoryStore()
    for namespace in namespaces:
        reference.put(namespace, "k", {"v": 1})
    expected = reference.list_namespaces(prefix=prefix, suffix=suffix, max_depth=max_depth, limit=limit, offset=offset)
    conditions = tuple(
        MatchCondition(kind, path)  # type: ignore[arg-type]
        for kind, path in (("prefix", prefix), ("suffix", suffix))
        if path
    )
    op = ListNamespacesOp(match_conditions=conditions, max_depth=max_depth, limit=limit, offset=offset)
    # Engram lists each category once, sorted as strings: the order must not matter.
    categories = sorted({namespace_to_category(ns) for ns in namespaces})
    assert select_namespaces(categories, op) == expected
    narrowed = listing_prefix(conditions)
    if narrowed is not None:
        # What list_categories(prefix=...) would answer (whole segments) selects the same.
        kept = [c for c in categories if c == narrowed or c.startswith(narrowed + "/")]
        assert select_namespaces(kept, op) == expected


@pytest.fixture
def offline_store() -> EngramStore:
    # Nothing is sent: every refusal below happens before the store connects.
    return EngramStore("redis://127.0.0.1:1/0", user_id="alice")


def test_the_store_refuses_before_any_io(offline_store: EngramStore) -> None:
    with offline_store as store:
        with pytest.raises(InvalidNamespaceError, match="periods"):
            store.get(("a.b",), "k")  # LangGraph's own rule: a "." never reaches the mapping
        with pytest.raises(InvalidNamespaceError, match="does not fit"):
            store.put(("x" * 201,), "k", {"v": 1})
        with pytest.raises(InvalidNamespaceError, match="does not fit"):
            store.search(("memories", "é" * 150))
        with pytest.raises(ValueError, match="ttl is in minutes"):
            store.put(("memories",), "k", {"v": 1}, ttl=-5)
        with pytest.raises(ValueError, match="ttl"):
            store.batch([PutOp(("memories",), "k", {"v": 1}, ttl=10 * 365 * 24 * 60 + 1)])
        with pytest.raises(InvalidNamespaceError, match="empty"):
            store.batch([PutOp((), "k", {"v": 1})])
        assert store.supports_ttl is True
    with pytest.raises(RuntimeError, match="closed"):
        store.get(("memories",), "k")


async def test_the_async_api_refuses_the_same(offline_store: EngramStore) -> None:
    async with offline_store as store:
        with pytest.raises(ValueError, match="ttl"):
            await store.aput(("memories",), "k", {"v": 1}, ttl=0)
        with pytest.raises(InvalidNamespaceError):
            await store.alist_namespaces(prefix=("é" * 150,))


def test_index_config_fields_are_what_a_put_embeds_by_default() -> None:
    with EngramStore("redis://127.0.0.1:1/0", user_id="u", index={"dims": 384, "fields": ["text"]}) as store:
        assert store.index_fields == ["text"]
    with EngramStore("redis://127.0.0.1:1/0", user_id="u", index={"dims": 384}) as store:
        assert store.index_fields is None


def test_a_store_dropped_without_close_stops_its_thread() -> None:
    import gc

    store = EngramStore("redis://127.0.0.1:1/0", user_id="u")
    thread = store._thread
    assert thread.is_alive()
    del store
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()
