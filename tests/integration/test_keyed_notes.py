"""Notes put by key with a structured value (PutNote), hierarchical categories, filters on
values and paging, through the real bus (real Redis, Qdrant Edge, MiniLM): the Engram features
the framework adapters (LangGraph's store) stand on."""

from __future__ import annotations

import asyncio

import pytest

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.config import ROLES
from tests.conftest import RunningService, service_settings
from tests.support import eventually, leaked

# One service for the module (tests/conftest.py, ``shared_service``): each test is a user of its own.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def service(shared_service: RunningService) -> RunningService:
    return shared_service


@pytest.fixture
def client(shared_client: EngramClient) -> EngramClient:
    return shared_client


async def test_a_put_is_an_upsert_by_key_and_history_keeps_every_version(client: EngramClient, user: str) -> None:
    first = await client.put(user, "prefs", "food", {"content": "likes pizza", "stars": 3})
    again = await client.put(user, "prefs", "food", {"stars": 3, "content": "likes pizza"})  # same value
    changed = await client.put(user, "prefs", "food", {"content": "likes sushi now", "stars": 5})
    assert (first.version, again.version, changed.version) == (1, 1, 2)
    assert first.note_id == again.note_id == changed.note_id
    view = await client.get_by_key(user, "prefs", "food", after=changed.token)
    assert view is not None
    assert (view.key, view.value) == ("food", {"content": "likes sushi now", "stars": 5})
    assert view.content == "likes sushi now\nstars: 5"
    history = await client.history(user, first.note_id, after=changed.token)
    assert [v.change for v in history.versions] == ["saved", "updated"]
    assert [v.value for v in history.versions] == [{"content": "likes pizza", "stars": 3}, view.value]


async def test_a_key_is_unique_per_category_and_user(client: EngramClient, user: str) -> None:
    a = await client.put(user, "prefs", "k", {"v": "one"})
    b = await client.put(user, "prefs/work", "k", {"v": "two"})
    c = await client.put("bob", "prefs", "k", {"v": "three"})
    assert len({a.note_id, b.note_id, c.note_id}) == 3
    found = await client.get_by_key(user, "prefs", "k", after=b.token)
    assert found is not None and found.value == {"v": "one"}
    assert await client.get_by_key(user, "other", "k", after=b.token) is None
    assert (await client.get_by_key("bob", "prefs", "k", after=c.token)).value == {"v": "three"}  # type: ignore[union-attr]


async def test_puts_racing_on_a_new_key_make_one_note(client: EngramClient, user: str) -> None:
    replies = await asyncio.gather(*(client.put(user, "race", "same", {"n": i}) for i in range(8)))
    assert len({r.note_id for r in replies}) == 1
    assert sorted(r.version for r in replies)[-1] == 8
    token = max(replies, key=lambda r: r.version).token
    listed = await client.list_notes(user, category="race", after=token)
    assert listed.total == 1


async def test_a_forgotten_key_is_free_again_and_its_value_is_shredded(
    client: EngramClient,
    service: RunningService,
    user: str,
) -> None:
    put = await client.put(user, "prefs", "secret", {"pin": "zebra-4921"})
    gone = await client.forget(user, note_ids=[put.note_id], confirmed=True)
    assert gone.status == "forgotten"
    assert await client.get_by_key(user, "prefs", "secret", after=gone.token) is None
    again = await client.put(user, "prefs", "secret", {"pin": "other"})
    assert again.note_id != put.note_id and again.version == 1
    # Nothing of the forgotten value is readable anywhere in Redis.
    assert await leaked(service.settings.redis_url, b"zebra-4921") == []


async def test_a_value_is_searched_by_its_indexed_fields(client: EngramClient, user: str) -> None:
    await client.put(user, "mem", "a", {"title": "garden", "body": "the tomatoes need water every morning"})
    put = await client.put(user, "mem", "b", {"title": "tomatoes", "body": "my car is at the garage"}, index=["body"])
    hits = (await client.search(user, "watering the tomato plants", category="mem", after=put.token)).results
    assert hits[0].note is not None and hits[0].note.key == "a"
    view = await client.get_by_key(user, "mem", "b", after=put.token)
    assert view is not None and view.content == "my car is at the garage"


async def test_filters_compare_values_and_pages_count_every_match(client: EngramClient, user: str) -> None:
    token = None
    for i in range(6):
        token = (await client.put(user, "items", f"k{i}", {"n": i, "tag": "even" if i % 2 == 0 else "odd"})).token
    even = await client.list_notes(user, category="items", where={"tag": "even"}, after=token)
    assert [n.key for n in even.notes] == ["k0", "k2", "k4"] and even.total == 3
    between = await client.list_notes(user, category="items", where={"n": {"$gt": 1, "$lte": 4}}, after=token)
    assert sorted(n.value["n"] for n in between.notes if n.value) == [2, 3, 4]
    assert (await client.list_notes(user, category="items", where={"n": {"$ne": 0}}, after=token)).total == 5
    plain = await client.save(user, "an item saved as text", category="items", advise=False)
    token = plain.token
    page = await client.list_notes(user, category="items", keyed_only=True, offset=2, limit=2, after=token)
    assert [n.key for n in page.notes] == ["k2", "k3"] and page.total == 6
    assert (await client.list_notes(user, category="items", after=token)).total == 7
    keyed = await client.search(
        user, "an item saved as text", category="items", keyed_only=True, after=token, min_relevance=0
    )
    assert plain.note_id not in [h.note_id for h in keyed.results] and len(keyed.results) == 5
    hits = await client.search(
        user, "item", category="items", where={"tag": "odd"}, top_k=5, after=token, min_relevance=0
    )
    assert sorted(h.note.key for h in hits.results if h.note) == ["k1", "k3", "k5"]
    with pytest.raises(EngramError) as refused:
        await client.list_notes(user, where={"n": {"$like": 1}})
    assert refused.value.code is ErrorCode.INVALID_PARAMETER and "$like" in refused.value.message


async def test_search_pages_through_results(client: EngramClient, user: str) -> None:
    token = None
    for i in range(30):
        value = {"text": f"my dog number {i} likes the park" if i % 2 else f"my cat number {i} sleeps all day"}
        token = (await client.put(user, "pets", f"p{i}", value)).token
    # The pages of one search (same query, same top_k) are slices of one ranking: none repeats
    # a hit, together they hold every note (the floor off), and the dogs come before the cats.
    pages = [
        (
            await client.search(user, "dog park", top_k=10, offset=o, category="pets", after=token, min_relevance=0)
        ).results
        for o in (0, 10, 20)
    ]
    seen = [h.note.key for page in pages for h in page if h.note]
    assert len(seen) == 30 and len(set(seen)) == 30
    scores = [h.score for page in pages for h in page]
    assert scores == sorted(scores, reverse=True)
    assert {int(k[1:]) % 2 for k in seen[:15]} == {1}
    with pytest.raises(EngramError) as refused:
        await client.search(user, "dog", top_k=20, offset=90)
    assert refused.value.code is ErrorCode.INVALID_PARAMETER


async def test_categories_nest_and_a_prefix_takes_whole_segments(client: EngramClient, user: str) -> None:
    for category in ("memories", "memories/alice", "memories/alice/work", "memories-old", "memoriesx", "other"):
        token = (await client.put(user, category, "k", {"text": f"note in {category}"})).token
    listed = await client.list_categories(user, after=token)
    assert listed.categories == sorted(
        ["memories", "memories/alice", "memories/alice/work", "memories-old", "memoriesx", "other"]
    )
    under = await client.list_categories(user, prefix="memories", after=token)
    assert under.categories == ["memories", "memories/alice", "memories/alice/work"]
    notes = await client.list_notes(user, category_prefix="memories/alice", after=token)
    assert [n.category for n in notes.notes] == ["memories/alice", "memories/alice/work"]
    hits = await client.search(user, "note in", top_k=10, category_prefix="memories", after=token, min_relevance=0)
    assert sorted(h.note.category for h in hits.results if h.note) == [
        "memories",
        "memories/alice",
        "memories/alice/work",
    ]
    assert (await client.list_categories("u2", after=token)).categories == []
    text = await client.save(user, "saved as text", category="memories/text", advise=False)
    keyed = await client.list_categories(user, prefix="memories", keyed_only=True, after=text.token)
    assert keyed.categories == ["memories", "memories/alice", "memories/alice/work"]
    everything = await client.list_categories(user, prefix="memories", after=text.token)
    assert "memories/text" in everything.categories


async def test_a_bad_put_is_refused_in_words_naming_the_field(client: EngramClient, user: str) -> None:
    for kwargs, word in (
        ({"category": "Bad Category", "key": "k", "value": {"a": 1}}, "category"),
        ({"category": "ok", "key": " ", "value": {"a": 1}}, "key"),
        ({"category": "ok", "key": "k", "value": {"a": "x" * 70_000}}, "value"),
    ):
        with pytest.raises(EngramError) as refused:
            await client.put(user, **kwargs)  # type: ignore[arg-type]
        assert refused.value.code is ErrorCode.INVALID_PARAMETER, kwargs
        assert word in refused.value.message
    with pytest.raises(EngramError) as conflict:
        await client.put(user, "ok", "k", {"a": 1}, expected_version=3)
    assert conflict.value.code is ErrorCode.VERSION_CONFLICT


async def test_a_note_put_with_a_time_to_live_is_forgotten_when_it_runs_out(
    client: EngramClient,
    service: RunningService,
    user: str,
) -> None:
    # Long enough to be read before it runs out on a busy machine (a read of an expired note
    # answers nothing).
    put = await client.put(user, "cache", "otp", {"code": "walrus-5531"}, ttl_seconds=3.0)
    kept = await client.put(user, "cache", "kept", {"code": "stays"}, ttl_seconds=10.0)
    view = await client.get_by_key(user, "cache", "otp", after=put.token)
    assert view is not None, "read before its time ran out"
    assert view.expires_at is not None
    # The other is renewed, each time for its whole time to live again, until the first has run
    # out and been forgotten: it never runs out.
    renewals = 0

    async def otp_forgotten() -> bool:
        nonlocal renewals
        renewed = await client.renew(user, kept.note_id)
        renewals += renewed.version > 1
        try:
            return (await client.history(user, put.note_id, after=renewed.token)).status == "forgotten"
        except EngramError as e:
            # Its key is gone a moment before the history has its tombstone: not yet.
            if e.code is ErrorCode.MEMORY_NOT_FOUND:
                return False
            raise

    await eventually(otp_forgotten, 60, interval=0.5, what="the note whose time ran out forgotten")
    assert renewals >= 1
    # The timer has forgotten the other: the same provable forget as any.
    history = await client.history(user, put.note_id)
    assert history.status == "forgotten" and history.versions == []
    assert await client.get_by_key(user, "cache", "otp") is None
    assert (await client.get_by_key(user, "cache", "kept")) is not None
    assert await leaked(service.settings.redis_url, b"walrus-5531") == []
    # The key is free again; a put without a time to live never expires.
    again = await client.put(user, "cache", "otp", {"code": "new"})
    assert again.note_id != put.note_id
    assert (await client.get_by_key(user, "cache", "otp", after=again.token)).expires_at is None  # type: ignore[union-attr]


async def test_an_expired_note_reads_as_gone_and_a_put_makes_a_new_one_before_the_timer_comes(
    redis_url: str,
) -> None:
    # A service whose forget saga (and so its timer) does not run: only reads and puts see expiry.
    roles = frozenset(ROLES) - {"saga"}
    running = await RunningService(service_settings(redis_url, roles=roles)).start()
    try:
        async with EngramClient(redis_url) as client:
            put = await client.put("alice", "cache", "k", {"v": 1}, ttl_seconds=0.3)
            await client.get_by_key("alice", "cache", "k", after=put.token)
            await asyncio.sleep(0.5)  # its time to live runs out
            assert await client.get_by_key("alice", "cache", "k") is None
            assert (await client.list_notes("alice", category="cache")).total == 0
            assert put.note_id not in [n.id for n in (await client.list_recent("alice")).notes]
            assert put.note_id not in (await client.context("alice")).note_ids
            with pytest.raises(EngramError) as renewed:
                await client.renew("alice", put.note_id)  # gone already: not brought back
            assert renewed.value.code is ErrorCode.MEMORY_NOT_FOUND
            again = await client.put("alice", "cache", "k", {"v": 2})
            assert again.note_id != put.note_id and again.version == 1
            assert (await client.history("alice", put.note_id, after=again.token)).status == "forgotten"
    finally:
        await running.stop()


async def test_a_key_given_back_by_a_superseded_note_stays_with_its_new_holder(client: EngramClient, user: str) -> None:
    old = await client.put(user, "prefs", "tea", {"kind": "green"})
    plain = await client.save(user, "Alice now drinks black tea", advise=False)
    await client.supersede(user, old.note_id, plain.note_id)  # gives the key back
    new = await client.put(user, "prefs", "tea", {"kind": "black"})
    assert new.note_id != old.note_id
    # The superseded note forgotten later must not take the key from its new holder.
    gone = await client.forget(user, note_ids=[old.note_id], confirmed=True)
    found = await client.get_by_key(user, "prefs", "tea", after=gone.token)
    assert found is not None and found.id == new.note_id
    assert (await client.list_categories(user, keyed_only=True, after=gone.token)).categories == ["prefs"]
