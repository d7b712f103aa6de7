"""Forgetting (docs/requirements.md §1) through the real bus: every edge-case row of the seed,
expiry (also across a restart), isolation, and that the plaintext is gone from every Redis key
and every file under the data dir, while rebuilds still agree with the live read models."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.projections.forget_saga import ForgetSagaProjection
from engram_ledger.projections.history import HistoryProjection, drop_generation, live_generation
from engram_ledger.services.adapters.crypto import load_master_key
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.ops.portable import export_log
from tests.conftest import RunningService, service_settings
from tests.support import eventually, every_value, holding, until_none

SF = "User lives in San Francisco near the Golden Gate park"
SF_VISIT = "User visited San Francisco last year for a conference"
DEADLINES = "engram:{0}:forget:deadlines"


# One service for the module (tests/conftest.py, ``shared_service``): each test is a user of its own.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def service(shared_service: RunningService) -> RunningService:
    return shared_service


@pytest.fixture
def client(shared_client: EngramClient) -> EngramClient:
    return shared_client


@pytest.fixture
def other_user(user: str) -> str:
    return f"{user}-other"


@pytest_asyncio.fixture(loop_scope="module")
async def fresh_service(redis_url: str) -> AsyncIterator[RunningService]:
    """A service of the test's own, on an empty Redis: for a test that reads the whole store."""
    running = await RunningService(service_settings(redis_url)).start()
    yield running
    await running.stop()


async def saved(client: EngramClient, user: str, text: str) -> str:
    return (await client.save(user, text, advise=False)).note_id


async def forget_expired(redis_url: str) -> bool:
    """Whether a ForgetExpired is in the log."""
    async with aioredis.Redis.from_url(redis_url) as redis:
        return any(b"forget_expired" in fields[b"e"] for _, fields in await redis.xrange("engram:{0}:log"))


async def test_a_query_returns_candidates_and_deletes_nothing(client: EngramClient, user: str) -> None:
    lives = await saved(client, user, SF)
    visited = await saved(client, user, SF_VISIT)
    token = (await client.save(user, "My favourite food is ramen", advise=False)).token
    await client.search(user, "x", after=token)
    reply = await client.forget(user, query="San Francisco")
    assert reply.status == "candidates" and not reply.forgotten and not reply.pending
    found = [c.note_id for c in reply.candidates]
    assert set(found) == {lives, visited}, "the two San Francisco notes, not the ramen (too weak a match)"
    ranked = (await client.search(user, "San Francisco")).results[: len(found)]
    assert found == [h.note_id for h in ranked], "best first: the search's order"
    assert [c.similarity for c in reply.candidates] == [h.similarity for h in ranked]
    assert all(c.preview and 0 < c.similarity <= 1 for c in reply.candidates)
    assert (await client.get_note(user, lives)).status == "active"


async def test_two_calls_with_the_same_id_delete_and_the_first_only_asks(client: EngramClient, user: str) -> None:
    note = await saved(client, user, SF)
    first = await client.forget(user, note_ids=[note])
    assert first.status == "confirmation_required" and first.forgotten == []
    assert first.pending[0].note_id == note and first.pending[0].request_count == 1
    assert SF[:40] in first.pending[0].preview and "Please confirm" in first.message
    assert (await client.get_note(user, note, after=first.token)).status == "active"
    second = await client.forget(user, note_ids=[note])
    assert second.status == "forgotten" and second.forgotten == [note]
    view = await client.get_note(user, note, after=second.token)
    assert view.status == "forgotten" and view.content == ""
    assert note not in [n.id for n in (await client.list_notes(user, include_superseded=True)).notes]
    assert (await client.search(user, "San Francisco", after=second.token)).results == []


async def test_a_note_deleted_between_the_calls_is_not_found(client: EngramClient, user: str) -> None:
    note = await saved(client, user, SF)
    await client.forget(user, note_ids=[note])
    await client.forget(user, note_ids=[note], confirmed=True)
    with pytest.raises(EngramError) as refused:
        await client.forget(user, note_ids=[note])
    assert refused.value.code is ErrorCode.MEMORY_NOT_FOUND


async def test_an_unknown_id_is_not_found_with_suggestions(client: EngramClient, user: str) -> None:
    note = await saved(client, user, SF)
    typo = note[:7] + ("x" if note[7] != "x" else "y")
    with pytest.raises(EngramError) as refused:
        await client.forget(user, note_ids=[typo])
    assert refused.value.code is ErrorCode.MEMORY_NOT_FOUND
    assert "not found" in refused.value.message and note in refused.value.message


async def test_each_id_is_tracked_separately_and_all_must_be_confirmed(client: EngramClient, user: str) -> None:
    a, b = await saved(client, user, SF), await saved(client, user, SF_VISIT)
    both = await client.forget(user, note_ids=[a, b])
    assert both.status == "confirmation_required" and {p.note_id for p in both.pending} == {a, b}
    again = await client.forget(user, note_ids=[a, b])
    assert again.status == "forgotten" and sorted(again.forgotten) == sorted([a, b])


async def test_a_different_id_on_the_second_call_is_a_new_first_call_and_the_old_pending_lapses(
    client: EngramClient,
    user: str,
) -> None:
    a, b = await saved(client, user, SF), await saved(client, user, SF_VISIT)
    first = await client.forget(user, note_ids=[a])
    await client.get_note(user, a, after=first.token)  # the saga has seen it pending
    other = await client.forget(user, note_ids=[b])
    assert other.status == "confirmation_required" and [p.note_id for p in other.pending] == [b]
    assert f"earlier request for {a} is withdrawn" in other.message
    await client.get_note(user, b, after=other.token)
    back = await client.forget(user, note_ids=[a])
    assert back.status == "confirmation_required" and back.pending[0].request_count == 1, "a asks again"
    assert (await client.get_note(user, a, after=back.token)).status == "active"
    assert (await client.get_note(user, b)).status == "active"


async def test_rapid_calls_count_requests_and_still_need_two(client: EngramClient, user: str) -> None:
    note = await saved(client, user, SF)
    replies = await asyncio.gather(*[client.forget(user, note_ids=[note]) for _ in range(2)])
    assert sorted(r.status for r in replies) == ["confirmation_required", "forgotten"]
    done = next(r for r in replies if r.status == "forgotten")
    assert done.forgotten == [note]


async def test_a_retried_request_returns_its_first_outcome(client: EngramClient, user: str) -> None:
    note = await saved(client, user, SF)
    first = await client.forget(user, note_ids=[note], command_id="forget-1")
    again = await client.forget(user, note_ids=[note], command_id="forget-1")
    assert again.replayed and again.status == "confirmation_required" and again.token == first.token
    assert (await client.get_note(user, note, after=again.token)).status == "active"


async def test_another_user_can_neither_see_nor_confirm_a_pending_forget(
    client: EngramClient, user: str, other_user: str
) -> None:
    note = await saved(client, user, SF)
    await client.forget(user, note_ids=[note])
    with pytest.raises(EngramError) as refused:
        await client.forget(other_user, note_ids=[note])
    assert refused.value.code is ErrorCode.MEMORY_NOT_FOUND and SF not in refused.value.message
    assert (await client.get_note(user, note)).status == "active"


async def test_a_pending_forget_expires_and_the_next_request_asks_again(redis_url: str) -> None:
    running = await RunningService(service_settings(redis_url, forget_ttl_seconds=0.5)).start()
    try:
        async with EngramClient(redis_url, operator=True) as client:
            note = await saved(client, "alice", SF)
            await client.forget("alice", note_ids=[note])
            # The saga's timer lapses it (ForgetExpired in the log).
            await eventually(lambda: forget_expired(redis_url), what="a ForgetExpired in the log")
            again = await client.forget("alice", note_ids=[note])
            assert again.status == "confirmation_required" and again.pending[0].request_count == 1
    finally:
        await running.stop()


async def test_an_expiry_due_while_the_service_was_down_is_applied_at_start(redis_url: str) -> None:
    running = RunningService(service_settings(redis_url, forget_ttl_seconds=0.3))
    # Its clock stopped: on a busy machine the deadline could pass, and the expiry be applied,
    # before this service stops; the test is of one that passes while nothing runs.
    running.engram.forget_timer = None
    await running.start()
    redis = aioredis.Redis.from_url(redis_url)
    try:
        async with EngramClient(redis_url, operator=True) as client:
            note = await saved(client, "alice", SF)
            await client.forget("alice", note_ids=[note])
        # The saga, not the read model a token waits for, keeps the deadline.
        await eventually(lambda: redis.zcard(DEADLINES), what="the pending forget's deadline in Redis")
        await running.stop()
        [(_, deadline_ms)] = await redis.zrange(DEADLINES, 0, -1, withscores=True)
        # Time passes while nothing runs, until the deadline has.
        await asyncio.sleep(max(0.0, deadline_ms / 1000 - time.time()) + 0.05)
        assert await redis.zcard(DEADLINES) == 1, "the deadline is kept in Redis"
        running = await RunningService(service_settings(redis_url, forget_ttl_seconds=0.3)).start()
        try:
            await until_none(lambda: redis.zcard(DEADLINES), what="the deadline applied at start")
            assert await forget_expired(redis_url)
        finally:
            await running.stop()
    finally:
        await redis.aclose()


async def test_after_a_forget_the_plaintext_is_in_no_redis_key_no_file_and_no_export(
    fresh_service: RunningService,
) -> None:
    """Content and subject alike: a subject is free text (a person's name, a place), so it is
    personal data too, in the log, the note's stream, the index's state and shard, and an export."""
    service = fresh_service  # its index is closed below
    secret = "My locker code at the Embarcadero gym is 4417-blue"
    async with EngramClient(service.settings.redis_url, operator=True) as client:
        note = (await client.save("alice", secret, subject="Ottoline Quarrington")).note_id
        await client.update("alice", note, content=secret + " (since May)")
        await client.update("alice", note, subject="Peregrine Fairweather")
        await client.search("alice", secret, subject="Peregrine Fairweather")
        keep = await client.save("alice", "I like my coffee black", subject="Barnaby Thistlewood", advise=False)
        await client.forget("alice", note_ids=[note])
        done = await client.forget("alice", note_ids=[note])
        await client.search("alice", "coffee", after=done.token)
        assert (await client.get_note("alice", keep.note_id)).content == "I like my coffee black"
        kept = await client.search("alice", "coffee", subject="barnaby  THISTLEWOOD")
        assert [h.note_id for h in kept.results] == [keep.note_id], "subject filters still match, case aside"
    needles = [secret.encode(), b"4417-blue", b"Embarcadero"]
    needles += [b"Ottoline", b"Quarrington", b"Peregrine", b"Fairweather", b"ottoline", b"peregrine"]
    redis = aioredis.Redis.from_url(service.settings.redis_url)
    try:
        # The request streams are trimmed once the forget is acknowledged, just after its reply.
        await until_none(lambda: holding(redis, needles), what="plaintext left in Redis")
        # No text is at rest in plain any more (the kept note's is sealed too): the scan does
        # reach where it is stored, and test_the_plaintext_scan_reads_every_kind_of_redis_value
        # shows it would see text there.
        keys = [key async for key, _ in every_value(redis)]
        assert any(keep.note_id.encode() in key for key in keys), "the scan sees the kept note's records"
        exported = io.StringIO()
        await export_log(redis, 1, exported)
        assert exported.getvalue().count("\n") > 5
        assert not [n for n in needles if n.decode() in exported.getvalue()], "plaintext left in the export"
    finally:
        await redis.aclose()
    await service.engram.index.close() if service.engram.index else None
    for path in Path(service.settings.data_dir).rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(n in data for n in needles), f"plaintext left in {path}"


async def test_rebuild_after_forgets_equals_live(fresh_service: RunningService) -> None:
    service = fresh_service  # the read model is rebuilt, and the saga's every deadline compared
    async with EngramClient(service.settings.redis_url, operator=True) as client:
        notes = [await saved(client, "alice", f"fact number {i} about the garden") for i in range(5)]
        await client.forget("alice", note_ids=notes[:2], confirmed=True)
        last = await client.forget("alice", note_ids=[notes[2]])
        await client.get_note("alice", notes[0], after=last.token)
        live = await client.list_notes("alice", include_superseded=True)
        gone = await client.get_note("alice", notes[0])
    redis = aioredis.Redis.from_url(service.settings.redis_url)
    try:
        master = load_master_key(service.settings.data_dir)
        store = RedisEventStore(redis, 1, 3600, master)
        previous = await live_generation(redis, 0)
        rebuilt = HistoryProjection(redis, 0, previous + 1, master)
        await rebuilt.rebuild(store)
        assert await rebuilt.make_live(previous)
        await drop_generation(redis, 0, previous)
        # The saga's state too: the pending deletion of notes[2] and its deadline.
        saga = ForgetSagaProjection(redis, 0)
        deadlines = await redis.zrange(saga.keys.deadlines, 0, -1, withscores=True)
        pending = await redis.smembers(saga.keys.pending("alice"))
        assert len(deadlines) == 1 and pending == {notes[2].encode()}
        await saga.rebuild(store)
        assert await redis.zrange(saga.keys.deadlines, 0, -1, withscores=True) == deadlines
        assert await redis.smembers(saga.keys.pending("alice")) == pending
    finally:
        await redis.aclose()
    async with EngramClient(service.settings.redis_url, operator=True) as client:
        assert await client.list_notes("alice", include_superseded=True) == live
        assert await client.get_note("alice", notes[0]) == gone and gone.status == "forgotten"


async def test_forgetting_a_user_asks_then_erases_everything_and_leaves_others_untouched(
    client: EngramClient, user: str, other_user: str
) -> None:
    mine = [await saved(client, user, t) for t in (SF, SF_VISIT, "My dentist is Dr. Molar")]
    await client.supersede(user, mine[0], mine[1])
    said = await client.record_message(user, "s1", "I told you my passport number is X1234567")
    theirs = await saved(client, other_user, SF)
    asked = await client.forget_user(user)
    assert asked.status == "confirmation_required" and "ALL 4 memories" in asked.message
    assert len((await client.list_notes(user, after=asked.token)).notes) == 2, "nothing erased yet"
    done = await client.forget_user(user)
    assert done.status == "forgotten" and sorted(done.forgotten) == sorted([*mine, said.note_id])
    assert done.erased_at is not None
    assert (await client.list_notes(user, include_superseded=True, after=done.token)).notes == []
    assert (await client.list_recent(user)).notes == []
    with pytest.raises(EngramError) as gone:
        await client.get_note(user, mine[2])
    assert gone.value.code is ErrorCode.MEMORY_NOT_FOUND
    hits = await client.search(user, "passport", include_conversation=True, session_id="s1", after=done.token)
    assert hits.results == []
    assert (await client.get_note(other_user, theirs)).content == SF
    assert [h.note_id for h in (await client.search(other_user, "San Francisco", after=done.token)).results] == [theirs]
    # The user can start over; the erased notes stay erased.
    fresh = await client.save(user, SF, advise=False)
    assert fresh.note_id not in mine and not fresh.duplicate


async def test_an_erased_users_plaintext_is_in_no_redis_key(
    service: RunningService, client: EngramClient, user: str, other_user: str
) -> None:
    await saved(client, user, "My passport number is X1234567")
    await client.record_message(user, "s1", "and my bank PIN is 9921")
    kept = await saved(client, other_user, "My bike lock code is 5150")
    done = await client.forget_user(user, confirmed=True)
    assert (await client.get_note(other_user, kept, after=done.token)).status == "active"
    redis = aioredis.Redis.from_url(service.settings.redis_url)
    try:
        needles = [b"passport number is X1234567", b"bank PIN is 9921"]
        await until_none(lambda: holding(redis, needles), what="plaintext left in Redis")
        keys = [key async for key, _ in every_value(redis)]
        assert any(kept.encode() in key for key in keys), "the scan sees another user's (sealed) note"
    finally:
        await redis.aclose()


async def test_the_plaintext_scan_reads_every_kind_of_redis_value(redis_url: str) -> None:
    """The scans above prove nothing where every_value does not look: it must see a value in a key
    name, a string, hash fields and values, stream entry fields and values, and every member of a
    set, a sorted set and a list (not only the first)."""
    redis = aioredis.Redis.from_url(redis_url)
    try:
        await redis.set(b"name-<key>", b"x")
        await redis.set(b"k:string", b"a <string> value")
        await redis.hset(b"k:hash", mapping={b"<hash-field>": b"x", b"f": b"<hash-value>"})
        await redis.xadd(b"k:stream", {b"f": b"x"})
        await redis.xadd(b"k:stream", {b"<stream-field>": b"x", b"g": b"<stream-value>"})
        await redis.zadd(b"k:zset", {b"a": 1, b"<zset>": 2, b"b": 3})
        await redis.sadd(b"k:set", b"a", b"<set>", b"b")
        await redis.rpush(b"k:list", b"a", b"<list>", b"b")
        seen = [(key, blob) async for key, blob in every_value(redis)]
        for key, needle in [
            (b"name-<key>", b"<key>"),
            (b"k:string", b"<string>"),
            (b"k:hash", b"<hash-field>"),
            (b"k:hash", b"<hash-value>"),
            (b"k:stream", b"<stream-field>"),
            (b"k:stream", b"<stream-value>"),
            (b"k:zset", b"<zset>"),
            (b"k:set", b"<set>"),
            (b"k:list", b"<list>"),
        ]:
            assert any(k == key and needle in blob for k, blob in seen), f"{needle!r} in {key!r} not seen"
    finally:
        await redis.aclose()


async def test_a_deployment_can_turn_the_confirmation_off(redis_url: str) -> None:
    running = await RunningService(service_settings(redis_url, forget_confirmation=False)).start()
    try:
        async with EngramClient(redis_url, operator=True) as client:
            note = await saved(client, "alice", SF)
            done = await client.forget("alice", note_ids=[note])
            assert done.status == "forgotten" and done.forgotten == [note]
            asked = await client.forget_user("alice")
            assert asked.status == "confirmation_required", "erasing a whole user always asks"
    finally:
        await running.stop()
