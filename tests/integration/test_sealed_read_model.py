"""Content at rest is sealed before any forget, not only after one: the history read model keeps
what the user said under the note's own data key, its key lookup by a keyed hash, and the
request streams drop a request once it is answered. Real bus, real Redis (no index: the read
model and the streams are what is looked at)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import msgspec
import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.channels import HistoryKeys
from engram_ledger.contracts.commands import MessageDraft
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.model import Origin
from engram_ledger.projections.history import HistoryProjection, live_generation
from engram_ledger.projections.history_reader import HistoryReader
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.application.ports import ListingPage
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.config import ROLES
from tests.conftest import RunningService, service_settings
from tests.support import dump, eventually, every_value, master_key_for_tests

M = "Qworfle"  # in every secret below, and nowhere else


@pytest.fixture
async def sealed_service(redis_url: str) -> AsyncIterator[RunningService]:
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    yield running
    await running.stop()


async def _holding(
    redis: aioredis.Redis, needle: bytes, allowed: frozenset[bytes] = frozenset(), timeout: float = 30.0
) -> set[bytes]:
    """The keys whose name or value holds ``needle``, once none but ``allowed`` does or the
    time is out: a handled request is deleted just after its reply, so a scan right after the
    last reply may still find it."""
    found: set[bytes] = set()

    async def only_allowed() -> bool:
        nonlocal found
        found = {key async for key, blob in every_value(redis) if needle in blob}
        return found <= allowed

    with contextlib.suppress(AssertionError):  # the caller's assertion names what is left
        await eventually(only_allowed, timeout)
    return found


async def test_before_any_forget_only_the_log_holds_names_and_nothing_holds_text(
    sealed_service: RunningService,
) -> None:
    url = sealed_service.settings.redis_url
    origin = Origin(channel="tui", session_id=f"origin-{M}-session")
    async with EngramClient(url) as client:
        note = await client.save("alice", f"my locker code is {M}-one", subject=f"{M} Quarrington", origin=origin)
        await client.update("alice", note.note_id, content=f"my locker code is {M}-two", origin=origin)
        newer = await client.save("alice", f"the locker moved: {M}-three", advise=False)
        await client.supersede("alice", note.note_id, newer.note_id)
        put = await client.put("alice", f"prefs/{M.lower()}-free", f"{M}-key", {"pin": f"{M}-value"})
        said = await client.record_messages(
            "alice",
            f"session-{M}",
            [MessageDraft(content=f"I said {M}-turn", speaker=f"{M} Speaker", item={"x": f"{M}-item"})],
        )
        token = said.token
        # Queries carry text too: a key, a session name.
        found = await client.get_by_key("alice", f"prefs/{M.lower()}-free", f"{M}-key", after=token)
        listed = await client.list_messages("alice", f"session-{M}", after=token)
        history = await client.history("alice", note.note_id, after=token)
        read = await client.get_note("alice", note.note_id, after=token)
        notes = await client.list_notes("alice", include_superseded=True, after=token)
        keyed = await client.list_categories("alice", keyed_only=True, after=token)

    # Reads answer in plain text.
    assert found is not None and found.key == f"{M}-key" and found.value == {"pin": f"{M}-value"}
    assert read.content == f"my locker code is {M}-two" and read.subject == f"{M} Quarrington"
    assert [v.content for v in history.versions] == [f"my locker code is {M}-{n}" for n in ("one", "two", "two")]
    assert [v.origin for v in history.versions] == [origin, origin, None]
    (turn,) = listed.messages
    assert (turn.content, turn.speaker, turn.item, turn.session_id) == (
        f"I said {M}-turn",
        f"{M} Speaker",
        {"x": f"{M}-item"},
        f"session-{M}",
    )
    assert {n.id for n in notes.notes} == {note.note_id, newer.note_id, put.note_id}
    assert keyed.categories == [f"prefs/{M.lower()}-free"]

    redis = aioredis.Redis.from_url(url)
    try:
        # What the user said, whom it is about, a key and its value, a turn's speaker and item:
        # in no key name and no value, the request streams included, before any forget.
        for secret in ("-one", "-two", "-three", " Quarrington", "-key", "-value", "-turn", " Speaker", "-item"):
            assert await _holding(redis, f"{M}{secret}".encode()) == set(), secret
        # Names (a session's, an origin's) stay in the log's events and the note streams only:
        # the log keeps them readable (why: README, Security). The read model seals them.
        log_only = frozenset(
            {channels.event_log(0).encode()}
            | {channels.note_stream(0, "alice", i).encode() for i in (note.note_id, said.notes[0].note_id)}
        )
        for name in (f"session-{M}", f"origin-{M}-session"):
            held = await _holding(redis, name.encode(), log_only)
            assert held and held <= log_only, (name, held)
        # A category is a label the listings sort by: readable by design.
        assert await _holding(redis, M.lower().encode(), frozenset(), timeout=0)
        # Deleted entries are gone from memory too, not only hidden: the streams' serialized
        # form (what an RDB or a replica gets) holds none of the requests.
        for stream in (channels.command_stream(0), channels.query_stream(0)):
            assert M.encode() not in (await redis.dump(stream) or b""), stream
        # A rebuild writes the very bytes the live projection wrote.
        store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
        await HistoryProjection(redis, 0, 41, master_key_for_tests()).rebuild(store)
        assert await dump(redis, 0, 41) == await dump(redis, 0, await live_generation(redis, 0))
    finally:
        await redis.aclose()


async def test_a_forgotten_keyed_note_leaves_no_lookup_and_rebuilds_to_the_same_model(
    sealed_service: RunningService,
) -> None:
    """The projection applies a forget after the note's key is gone, so the lookup's field (a
    keyed hash of the key, which the sealed view no longer gives) comes from beside the view."""
    url = sealed_service.settings.redis_url
    async with EngramClient(url) as client:
        put = await client.put("alice", "prefs", f"{M}-key", {"pin": f"{M}-value"})
        kept = await client.put("alice", "other", "k", {"v": 1})
        await client.forget("alice", note_ids=[put.note_id])
        done = await client.forget("alice", note_ids=[put.note_id])
        assert done.status == "forgotten"
        gone = await client.get_note("alice", put.note_id, after=done.token)
        assert gone.status == "forgotten" and gone.key is None and gone.value is None
        assert (await client.list_categories("alice", keyed_only=True, after=done.token)).categories == ["other"]
        assert await client.get_by_key("alice", "prefs", f"{M}-key") is None
        assert await client.get_by_key("alice", "other", "k") is not None
    redis = aioredis.Redis.from_url(url)
    try:
        assert await _holding(redis, M.encode()) == set()
        store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
        await HistoryProjection(redis, 0, 42, master_key_for_tests()).rebuild(store)
        assert await dump(redis, 0, 42) == await dump(redis, 0, await live_generation(redis, 0))
    finally:
        await redis.aclose()
    assert kept.note_id


async def test_a_sealed_view_does_not_open_under_another_notes_name(sealed_service: RunningService) -> None:
    url = sealed_service.settings.redis_url
    async with EngramClient(url) as client:
        a = await client.save("alice", "the spare key is under the blue pot", advise=False)
        b = await client.save("alice", "the wifi password is on the fridge", advise=False)
        await client.get_note("alice", b.note_id, after=b.token)
    redis = aioredis.Redis.from_url(url)
    reader = HistoryReader(redis, 1, master_key_for_tests())
    try:
        keys = HistoryKeys(0, await live_generation(redis, 0))
        await redis.set(keys.note("alice", b.note_id), await redis.get(keys.note("alice", a.note_id)))
        with pytest.raises(EngramError) as refused:
            await reader.get_note("alice", b.note_id)
        assert refused.value.code is ErrorCode.STORAGE_ERROR
        assert (await reader.get_note("alice", a.note_id)).content == "the spare key is under the blue pot"  # type: ignore[union-attr]
    finally:
        await redis.aclose()


async def test_a_cached_key_opens_nothing_once_the_wrapped_key_is_deleted(sealed_service: RunningService) -> None:
    """A forget deletes the wrapped key at once; the projection writes the tombstone after. In
    between the sealed view is still there and the reader has the key in its cache: it must
    read the note as gone."""
    url = sealed_service.settings.redis_url
    async with EngramClient(url) as client:
        note = await client.save("alice", "my passport number is X1234567", advise=False)
        said = await client.record_message("alice", "s1", "and my bank PIN is 9921")
        await client.get_note("alice", note.note_id, after=said.token)
    redis = aioredis.Redis.from_url(url)
    reader = HistoryReader(redis, 1, master_key_for_tests())
    try:
        assert (await reader.get_note("alice", note.note_id)) is not None
        assert (await reader.get_message("alice", said.note_id)) is not None
        for note_id in (note.note_id, said.note_id):
            await redis.delete(channels.data_key(0, "alice", note_id))
        assert await reader.get_note("alice", note.note_id) is None
        assert await reader.get_message("alice", said.note_id) is None
        assert await reader.get_many("alice", [note.note_id], [said.note_id]) == ({}, {})
        assert await reader.list_notes("alice", None, False) == []
        assert (await reader.messages("alice", "s1", None))[0] == []
    finally:
        await redis.aclose()


async def test_a_reader_whose_first_read_is_many_notes_knows_its_generation(sealed_service: RunningService) -> None:
    """A search's first read (``get_many``) learns the live generation from the same MGET; what
    the reader asks next (a wait for a token, a single note) must use it, not fail for want of
    one."""
    url = sealed_service.settings.redis_url
    async with EngramClient(url) as client:
        note = await client.save("alice", "the boat is moored at pier 4", advise=False)
        await client.get_note("alice", note.note_id, after=note.token)
    redis = aioredis.Redis.from_url(url)
    reader = HistoryReader(redis, 1, master_key_for_tests())
    try:
        found, _ = await reader.get_many("alice", [note.note_id], [])
        assert found[note.note_id].content == "the boat is moored at pier 4"
        assert await reader.wait_for(note.token, 5.0)
        assert (await reader.get_note("alice", note.note_id)) is not None
    finally:
        await redis.aclose()


async def test_a_page_is_read_alone_and_equals_the_slice_of_the_whole_listing(sealed_service: RunningService) -> None:
    url = sealed_service.settings.redis_url
    categories = ["a", "a/b", "a-x", "a/b/c", "b"]
    async with EngramClient(url) as client:
        for i in range(25):
            last = await client.save("alice", f"note number {i}", category=categories[i % 5], advise=False)
        whole = await client.list_notes("alice", after=last.token)
        under = await client.list_notes("alice", category_prefix="a")
        assert [n.category for n in under.notes].count("a-x") == 0 and under.total == 15
        for offset in (0, 3, 5, 7, 14, 15, 40):
            page = await client.list_notes("alice", offset=offset, limit=4)
            assert page.notes == whole.notes[offset : offset + 4] and page.total == 25
            page = await client.list_notes("alice", category_prefix="a", offset=offset, limit=4)
            assert page.notes == under.notes[offset : offset + 4] and page.total == 15
            page = await client.list_notes("alice", category="a/b", offset=offset, limit=2)
            assert [n.category for n in page.notes] == ["a/b"] * len(page.notes) and page.total == 5
    redis = aioredis.Redis.from_url(url)
    reader = HistoryReader(redis, 1, master_key_for_tests())
    try:
        now = datetime.now(UTC)
        asked = ListingPage(category_prefix="a", offset=5, limit=4, now=now)
        assert await reader.list_page("alice", asked) == (under.notes[5:9], 15)
    finally:
        await redis.aclose()


async def test_a_lapsed_note_makes_the_page_come_from_the_whole_listing(redis_url: str) -> None:
    # No saga: nothing forgets the lapsed note, so it stays in the listing the page is read from.
    roles = frozenset(ROLES) - {"saga"}
    running = await RunningService(service_settings(redis_url, index_enabled=False, roles=roles)).start()
    try:
        await _lapsed_note_page(redis_url)
    finally:
        await running.stop()


async def _lapsed_note_page(url: str) -> None:
    async with EngramClient(url) as client:
        for i in range(4):
            await client.save("alice", f"kept note {i}", advise=False)
        brief = await client.put("alice", "a-first", "k", {"v": 1}, ttl_seconds=0.2)
        await client.list_notes("alice", after=brief.token)
        await asyncio.sleep(0.3)  # its time to live runs out
        redis = aioredis.Redis.from_url(url)
        reader = HistoryReader(redis, 1, master_key_for_tests())
        try:
            # Lapsed, and still in the listing: the page cannot be cut from the listing alone.
            page = await reader.list_page("alice", ListingPage(limit=2, now=datetime.now(UTC)))
            listed = await client.list_notes("alice", offset=0, limit=2)
        finally:
            await redis.aclose()
        assert page is None
        assert brief.note_id not in [n.id for n in listed.notes] and listed.total == 4


async def test_a_read_model_written_before_sealing_reads_until_a_rebuild_seals_it(
    sealed_service: RunningService,
) -> None:
    """Its views in plain JSON and its key lookup by the key itself, as an earlier release wrote
    them: still read; ``engram rebuild history`` then writes them sealed and hashed."""
    url = sealed_service.settings.redis_url
    async with EngramClient(url) as client:
        put = await client.put("alice", "prefs", f"{M}-key", {"pin": f"{M}-value"})
        read = await client.get_by_key("alice", "prefs", f"{M}-key", after=put.token)
    assert read is not None
    # The read model's own view: reads are counted beside it, not in it.
    view = msgspec.structs.replace(read, access_count=0, last_accessed_at=None)
    redis = aioredis.Redis.from_url(url)
    reader = HistoryReader(redis, 1, master_key_for_tests())
    try:
        live = await live_generation(redis, 0)
        keys = HistoryKeys(0, live)
        await redis.set(keys.note("alice", put.note_id), msgspec.json.encode(view))
        await redis.delete(keys.keyed("alice"))
        await redis.hset(keys.keyed("alice"), f"prefs\x00{M}-key", put.note_id)
        assert await reader.get_by_key("alice", "prefs", f"{M}-key") == view
        assert await reader.get_note("alice", put.note_id) == view
        store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
        rebuilt = HistoryProjection(redis, 0, live + 1, master_key_for_tests())
        await rebuilt.rebuild(store)
        assert await rebuilt.make_live(live)
        assert await reader.get_by_key("alice", "prefs", f"{M}-key") == view
        assert await _holding(redis, M.encode()) == set()
    finally:
        await redis.aclose()
