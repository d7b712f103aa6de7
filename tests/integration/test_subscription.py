"""Subscribing to the event log (``EngramClient.events``) on real Redis, through a real service:
consumer groups, acks and redelivery, content for the key's holder only, erasures, filters, and a
Redis Cluster where each partition's log lives on its own node."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import AnyEvent, NoteForgotten, NoteSaved, NoteUpdated, UserForgotten
from engram_ledger.services.adapters.crypto import MasterKey
from engram_ledger.services.adapters.event_store import decode_event
from engram_ledger.services.adapters.redis_conn import group_info
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.bus.deliveries import ContentState, Delivery
from engram_ledger.services.bus.subscription import Subscription
from tests.cluster import LocalCluster
from tests.conftest import RunningService, service_settings
from tests.support import eventually, master_key_for_tests


@pytest.fixture
async def engram(redis_url: str) -> AsyncIterator[EngramClient]:
    """A service without the vector index (nothing here searches), and an operator's client."""
    running = await RunningService(service_settings(redis_url, index_enabled=False, partitions=3)).start()
    try:
        async with EngramClient(redis_url, timeout=10, operator=True) as client:
            yield client
    finally:
        await running.stop()


async def take(subscription: Subscription, n: int, timeout: float = 10) -> list[Delivery]:
    got: list[Delivery] = []

    async def run() -> None:
        async for delivery in subscription:
            got.append(delivery)
            if len(got) == n:
                return

    await asyncio.wait_for(run(), timeout)
    return got


async def nothing_more(subscription: Subscription, wait: float = 0.6) -> None:
    with pytest.raises(TimeoutError):
        await take(subscription, 1, timeout=wait)


async def the_log(url: str, partitions: int, cluster: bool = False) -> dict[str, AnyEvent]:
    """Every event of every partition, by token."""
    redis = aioredis.RedisCluster.from_url(url) if cluster else aioredis.Redis.from_url(url)
    out: dict[str, AnyEvent] = {}
    for p in range(partitions):
        for entry_id, fields in await redis.xrange(channels.event_log(p)):
            out[channels.format_token(p, entry_id.decode())] = decode_event(fields[b"e"])
    await redis.aclose()
    return out


def in_note_order(deliveries: list[Delivery]) -> bool:
    """Each note's versions arrive 1, 2, 3... (first sightings; a redelivery may repeat one)."""
    seen: dict[tuple[str, str], int] = {}
    for d in deliveries:
        note = (d.event.user_id, d.event.note_id)
        if d.event.version <= seen.get(note, 0):
            continue
        if d.event.version != seen.get(note, 0) + 1:
            return False
        seen[note] = d.event.version
    return True


async def test_a_group_gets_every_event_typed_and_resumes_after_a_restart(engram: EngramClient) -> None:
    a = await engram.save("alice", "Alec is my boss", subject="Alec", category="person")
    await engram.update("alice", a.note_id, content="Alec is my former boss")
    b = await engram.save("bob", "Bob likes tea")
    await engram.supersede("alice", a.note_id, (await engram.save("alice", "Alec retired")).note_id)
    log = await the_log(engram.url, 3)

    async with engram.events("crm-sync", from_start=True) as events:
        first = await take(events, len(log))
        assert {d.token: d.event for d in first}.keys() == log.keys()
        assert all(d.event.event_id == log[d.token].event_id for d in first)
        assert in_note_order(first) and not any(d.redelivered for d in first)
        saved = next(d for d in first if d.event.note_id == b.note_id)
        assert isinstance(saved.event, NoteSaved) and saved.event.kind == "fact" and saved.event.version == 1
        # Half are acked; the rest stay pending as a crash would leave them.
        await events.ack(*first[: len(first) // 2])

    async with engram.events("crm-sync", from_start=True) as events:
        again = await take(events, len(first) - len(first) // 2)
        unacked = first[len(first) // 2 :]
        # Each partition's own pending entries come back in log order; partitions interleave as
        # their readers are scheduled.
        for p in {d.partition for d in unacked}:
            assert [d.token for d in again if d.partition == p] == [d.token for d in unacked if d.partition == p]
        assert {d.token for d in again} == {d.token for d in unacked}
        assert all(d.redelivered for d in again)
        for d in again:
            await d.ack()
        await nothing_more(events)
        later = await engram.save("bob", "Bob moved to Oslo")
        (new,) = await take(events, 1)
        assert new.event.note_id == later.note_id and not new.redelivered
        await new.ack()
    # Redis keeps the position: nothing is pending, and a new run starts after the last entry.
    redis = aioredis.Redis.from_url(engram.url)
    for p in range(3):
        pending = await redis.xpending(channels.event_log(p), "crm-sync")
        assert pending["pending"] == 0
    await redis.aclose()
    async with engram.events("crm-sync", from_start=True) as events:
        await nothing_more(events)


async def test_a_new_group_without_from_start_begins_at_the_end(engram: EngramClient) -> None:
    await engram.save("alice", "before the subscriber")
    async with engram.events("late") as events:
        await nothing_more(events, 0.3)
        after = await engram.save("alice", "after the subscriber")
        (d,) = await take(events, 1)
        assert d.event.note_id == after.note_id


async def test_two_groups_each_see_everything(engram: EngramClient) -> None:
    for i in range(12):
        await engram.save(f"user-{i % 4}", f"note {i}")
    log = await the_log(engram.url, 3)
    async with engram.events("search-index", from_start=True) as one, engram.events("audit", from_start=True) as two:
        first, second = await take(one, len(log)), await take(two, len(log))
    assert {d.token for d in first} == {d.token for d in second} == set(log)


async def test_what_a_dead_consumer_left_unacked_is_claimed_by_another(engram: EngramClient) -> None:
    for i in range(5):
        await engram.save("carol", f"carol's note {i}")
    async with engram.events("crm", from_start=True, consumer="crm-1") as dying:
        left = await take(dying, 5)  # and never acked: this consumer dies
    async with engram.events("crm", consumer="crm-2", claim_idle_ms=300) as survivor:
        claimed = await take(survivor, 5, timeout=5)
        assert sorted(d.token for d in claimed) == sorted(d.token for d in left)
        assert all(d.redelivered for d in claimed)
        await survivor.ack(*claimed)
        await nothing_more(survivor, 0.8)  # acked: never again, past the claim time too


async def test_a_delivery_left_unacked_comes_again_after_the_claim_time(engram: EngramClient) -> None:
    await engram.save("dave", "dave's note")
    async with engram.events("slow", from_start=True, claim_idle_ms=300) as events:
        (first,) = await take(events, 1)
        (again,) = await take(events, 1, timeout=5)
        assert again.token == first.token and again.redelivered
        await again.ack()
        await nothing_more(events, 0.8)


async def test_content_opens_for_the_keys_holder_only(engram: EngramClient) -> None:
    saved = await engram.save("alice", "Alec is my boss", subject="Alec", category="person")
    await engram.update("alice", saved.note_id, importance=0.9)  # no content: nothing to open
    async with engram.events("meta", from_start=True) as events:
        created, changed = await take(events, 2)
    assert isinstance(created.event, NoteSaved) and created.content is ContentState.WITHHELD
    assert created.event.content == "" and created.event.subject is None
    assert created.event.category == "person" and created.event.note_id == saved.note_id
    assert b"Alec" not in msgspec.json.encode(created.event), "no plaintext, no ciphertext either"
    assert isinstance(changed.event, NoteUpdated) and changed.content is ContentState.NONE

    async with engram.events("crm", from_start=True, key=master_key_for_tests()) as events:
        created, _ = await take(events, 2)
    assert created.content is ContentState.OPEN
    assert isinstance(created.event, NoteSaved)
    assert (created.event.content, created.event.subject) == ("Alec is my boss", "Alec")

    wrong = MasterKey(bytes(32))
    with pytest.raises(EngramError) as refused:
        async with engram.events("wrong", from_start=True, key=wrong) as events:
            await take(events, 1)
    assert refused.value.code is ErrorCode.INVALID_PARAMETER and "cannot open" in refused.value.message


async def test_a_note_forgotten_before_its_delivery_is_read_yields_no_plaintext(engram: EngramClient) -> None:
    kept = await engram.save("alice", "Alice lives in Lisbon")
    gone = await engram.save("alice", "Alice's PIN is 4921", subject="PIN")
    await engram.update("alice", gone.note_id, content="Alice's PIN is 5113")
    await engram.forget("alice", note_ids=[gone.note_id], confirmed=True)
    async with engram.events("crm", from_start=True, key=master_key_for_tests()) as events:
        deliveries = await take(events, 4)
    by_note = {(d.event.note_id, d.event.version): d for d in deliveries}
    assert by_note[(kept.note_id, 1)].content is ContentState.OPEN
    for version in (1, 2):
        shredded = by_note[(gone.note_id, version)]
        assert shredded.content is ContentState.ERASED
        encoded = msgspec.json.encode(shredded.event)
        assert b"4921" not in encoded and b"5113" not in encoded and b"PIN" not in encoded
    tombstone = by_note[(gone.note_id, 3)]
    assert isinstance(tombstone.event, NoteForgotten) and tombstone.content is ContentState.NONE
    assert tombstone.erasure is not None and tombstone.erasure.scope == "note"
    assert tombstone.erasure.note_ids == (gone.note_id,) and tombstone.erasure.user_id == "alice"
    assert f"erase every copy of note {gone.note_id} of user alice" in str(tombstone.erasure)


async def test_erasing_a_user_tells_subscribers_everything_to_erase(engram: EngramClient) -> None:
    notes = [(await engram.save("erin", f"erin's note {i}")).note_id for i in range(3)]
    message = await engram.record_message("erin", "chat-1", "hello there")
    await engram.forget_user("erin", confirmed=True)
    async with engram.events("crm", from_start=True, users=["erin"]) as events:
        deliveries = await take(events, 9)
        await nothing_more(events, 0.3)
    erasures = [d.erasure for d in deliveries if d.erasure is not None]
    assert sorted(e.note_ids[0] for e in erasures if e.scope == "note") == sorted([*notes, message.note_id])
    (whole,) = [e for e in erasures if e.scope == "user"]
    assert sorted(whole.note_ids) == sorted([*notes, message.note_id])
    assert "erase everything held about user erin" in str(whole)
    # The receipt comes after every note's own erasure.
    receipt = next(i for i, d in enumerate(deliveries) if isinstance(d.event, UserForgotten))
    assert all(isinstance(d.event, NoteForgotten) for d in deliveries[receipt - 4 : receipt])


async def test_filters_deliver_what_they_name_plus_erasures_and_ack_the_rest(engram: EngramClient) -> None:
    for user in ("alice", "bob", "carol"):
        await engram.save(user, f"{user}'s first note")
    alices = await engram.save("alice", "alice's second note")
    await engram.update("alice", alices.note_id, content="alice's second note, changed")
    await engram.forget("alice", note_ids=[alices.note_id], confirmed=True)
    async with engram.events("alice-saves", from_start=True, users=["alice"], kinds=["note_saved"]) as events:
        got = await take(events, 3)
        await events.ack(*got)
        await nothing_more(events, 0.3)
    assert [type(d.event) for d in got] == [NoteSaved, NoteSaved, NoteForgotten]
    assert {d.event.user_id for d in got} == {"alice"}
    redis = aioredis.Redis.from_url(engram.url)
    p = channels.partition_of("alice", 3)
    assert (await redis.xpending(channels.event_log(p), "alice-saves"))["pending"] == 0, "passed over: acked"
    # Only alice's partition is read at all.
    others = [await group_info(redis, channels.event_log(q), "alice-saves") for q in range(3) if q != p]
    assert others == [None, None]
    await redis.aclose()


async def test_bad_subscriptions_are_typed_errors_with_clear_messages(engram: EngramClient) -> None:
    cases = [
        ({"kinds": ["note_saves"]}, "note_saves"),
        ({"users": ["bad user"]}, "users"),
        ({"partitions": [7]}, "out of range"),
        ({"claim_idle_ms": 0}, "claim_idle_ms"),
    ]
    for options, words in cases:
        with pytest.raises(EngramError) as refused:
            async with engram.events("g", **options):  # type: ignore[arg-type]
                pass
        assert refused.value.code is ErrorCode.INVALID_PARAMETER and words in refused.value.message, options
    with pytest.raises(EngramError) as refused:
        engram.events("no spaces in a group")
    assert refused.value.code is ErrorCode.INVALID_PARAMETER and "group" in refused.value.message


async def test_a_subscriber_needs_only_the_log_when_told_the_partitions(redis_url: str, tmp_path: Path) -> None:
    """Least privilege: a Redis user allowed XGROUP, XREADGROUP, XACK and XAUTOCLAIM on the logs."""
    running = await RunningService(service_settings(redis_url, index_enabled=False, partitions=2)).start()
    admin = aioredis.Redis.from_url(redis_url)
    try:
        async with EngramClient(redis_url, timeout=10) as client:
            await client.save("alice", "one")
            await client.save("bob", "two")
        # The subscriber role: the log keys, and only the stream commands a group needs (plus
        # what a connection itself sends: SELECT of the test's database).
        await admin.acl_setuser(
            "sub-test",
            enabled=True,
            passwords=["+sub-secret"],
            keys=["engram:{*}:log"],
            commands=["+xgroup|create", "+xreadgroup", "+xack", "+xautoclaim", "+select"],
        )
        host, port, db = (admin.connection_pool.connection_kwargs[k] for k in ("host", "port", "db"))
        url = f"redis://sub-test:sub-secret@{host}:{port}/{db}"
        async with Subscription.connect(url, "least", from_start=True, partition_count=2) as events:
            got = await take(events, 2)
            await events.ack(*got)
        assert {d.event.user_id for d in got} == {"alice", "bob"}
        # Asking for what the role may not read (the partition count) is refused in plain words.
        with pytest.raises(EngramError) as refused:
            async with Subscription.connect(url, "least"):
                pass
        assert refused.value.code is ErrorCode.PERMISSION_DENIED
    finally:
        await admin.acl_deluser("sub-test")
        await admin.aclose()
        await running.stop()


async def test_on_a_cluster_each_partitions_log_is_read_where_it_lives(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster").start()
    try:
        settings = service_settings(cluster.url, redis_cluster=True, partitions=6, index_enabled=False)
        running = await RunningService(settings).start()
        try:
            async with EngramClient(cluster.url, timeout=10, cluster=True, operator=True) as client:
                users = [f"user-{i}" for i in range(12)]
                notes = {u: (await client.save(u, f"{u} says hi")).note_id for u in users}
                for u in users[:6]:
                    await client.update(u, notes[u], content=f"{u} says hello")
                await client.forget(users[0], note_ids=[notes[users[0]]], confirmed=True)
                log = await the_log(cluster.url, 6, cluster=True)
                assert len({channels.parse_token(t)[0] for t in log}) > 3, "spread over the partitions"
                async with client.events("crm", from_start=True, key=master_key_for_tests()) as events:
                    got = await take(events, len(log))
                    await events.ack(*got)
                    await nothing_more(events, 0.5)
        finally:
            await running.stop()
    finally:
        cluster.stop()
    assert {d.token for d in got} == set(log) and in_note_order(got)
    saves = [d for d in got if isinstance(d.event, NoteSaved) and d.event.user_id != users[0]]
    assert len(saves) == 11 and all(d.content is ContentState.OPEN for d in saves)
    assert all(isinstance(d.event, NoteSaved) and d.event.content.endswith("says hi") for d in saves)
    assert all(d.content is ContentState.ERASED for d in got if d.event.user_id == users[0] and d.event.version < 3)


async def test_a_subscription_rides_out_a_redis_restart(tmp_path: Path) -> None:
    """Redis SIGKILLed and restarted from its AOF under a running subscription: it goes on where
    it was, and what it had not acked is still its to ack."""
    server = RedisServer(tmp_path / "redis", appendfsync="always").start()
    running = await RunningService(service_settings(server.url, index_enabled=False)).start()
    try:
        async with EngramClient(server.url, timeout=10) as client:
            for i in range(5):
                await client.save("alice", f"before the restart {i}")
            async with client.events("crm", from_start=True) as events:
                before = await take(events, 5)
                await events.ack(*before[:3])
                server.kill()
                server.start()
                for i in range(5):

                    async def saved(i: int = i) -> bool:
                        try:
                            await client.save("alice", f"after the restart {i}", command_id=f"after-{i}")
                            return True
                        except EngramError as e:  # Redis coming back: retried as a caller must
                            assert e.code in (ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT), e
                            return False

                    await eventually(saved, 60, interval=0.2, what=f"save {i} after the restart")
                after = await take(events, 5, timeout=20)
                await events.ack(*before[3:], *after)
                await nothing_more(events)
        assert [d.event.version for d in before + after] == [1] * 10
        assert len({d.token for d in before + after}) == 10 and not any(d.redelivered for d in after)
        redis = aioredis.Redis.from_url(server.url)
        assert (await redis.xpending(channels.event_log(0), "crm"))["pending"] == 0
        assert await redis.xlen(channels.event_log(0)) == 10
        await redis.aclose()
    finally:
        await running.stop()
        server.stop()
