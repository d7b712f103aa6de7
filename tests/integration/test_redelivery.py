"""Promise 7's second half and promise 8's first: a dead consumer's pending messages are claimed
by a live worker; a message that keeps failing goes to the dead-letter stream after a bounded
number of deliveries, and the stream keeps flowing."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.channels import PARTITIONS_KEY
from engram_ledger.contracts.commands import SaveNote
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.bus.gate import Lane, RequestGate
from engram_ledger.services.bus.reclaimer import ATTEMPT_FIELD, DEAD_LETTERS_KEPT, PendingReclaimer
from tests.conftest import RunningService, service_settings
from tests.support import eventually, log_events


async def test_a_dead_consumers_pending_command_is_claimed_and_answered(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    stream = channels.command_stream(0)
    await redis.set(PARTITIONS_KEY, 1)
    await redis.xgroup_create(stream, channels.COMMAND_GROUP, id="0", mkstream=True)
    async with EngramClient(redis_url, timeout=15) as client:
        request = asyncio.create_task(
            client.execute(SaveNote(command_id="orphan", user_id="alice", content="taken by a dying worker"), object)  # type: ignore[arg-type]
        )
        # A worker's gate admits the command, the worker reads it into its pending list, then
        # dies without acking.
        gate = RequestGate(redis, 0, Lane(channels.inbox(stream), stream), per_user=2, maxlen=1_000)

        async def admitted() -> bool:
            return await gate.admit_head() is not None

        await eventually(admitted, 10, what="the command in the inbox")
        grabbed = await redis.xreadgroup(channels.COMMAND_GROUP, "dead-worker", {stream: ">"}, count=1, block=5000)
        assert grabbed and len(grabbed[0][1]) == 1
        running = await RunningService(service_settings(redis_url, claim_idle_ms=300)).start()
        try:
            reply = await request
            assert reply.version == 1  # type: ignore[attr-defined]
            assert [e.command_id for e in await log_events(redis_url)] == ["orphan"]
            assert (await redis.xpending(stream, channels.COMMAND_GROUP))["pending"] == 0
        finally:
            await running.stop()
    await redis.aclose()


async def test_a_poison_command_is_dead_lettered_after_bounded_deliveries(redis_url: str) -> None:
    running = await RunningService(service_settings(redis_url, claim_idle_ms=200, max_deliveries=3)).start()
    calls = 0
    original = running.engram.commands.execute

    async def crash_on_poison(command):  # type: ignore[no-untyped-def]
        nonlocal calls
        if command.content == "poison":
            calls += 1
            raise RuntimeError("simulated infrastructure bug")
        return await original(command)

    running.engram.commands.execute = crash_on_poison  # type: ignore[method-assign]
    stream = channels.command_stream(0)
    redis = aioredis.Redis.from_url(redis_url)
    try:
        async with EngramClient(redis_url, timeout=0.5) as client:
            with pytest.raises(EngramError) as info:
                await client.save("alice", "poison", command_id="poison-1")
            assert info.value.code is ErrorCode.TIMEOUT
            client.timeout = 10
            healthy = await client.save(
                "alice", "healthy", command_id="healthy-1"
            )  # the stream keeps flowing meanwhile
            assert healthy.version == 1
            dead_stream = channels.dead_letter_stream(stream)
            await eventually(lambda: redis.xlen(dead_stream), what="the poison command in the dead letters")
            (_, fields), *rest = await redis.xrange(dead_stream)
            assert rest == []
            assert fields[ATTEMPT_FIELD.encode()] == b"3" and calls == 3
            assert fields[b"command_id"] == b"poison-1" and fields[b"type"] == b"save_note"
            assert b"__data__" not in fields, "no body: it holds the user's text, which no forget reaches there"
            assert (await redis.xpending(stream, channels.COMMAND_GROUP))["pending"] == 0
            # The poison command never reached the log; the healthy one did.
            assert [e.command_id for e in await log_events(redis_url)] == ["healthy-1"]
    finally:
        await redis.aclose()
        await running.stop()


async def failed_for_good(redis: aioredis.Redis, stream: str, bodies: list[bytes], **caps: int) -> PendingReclaimer:
    """``bodies`` sent to ``stream`` and taken by a worker that dies with each: the reclaimer
    (one delivery allowed, the dead letters' ``caps``) moves every one of them to the dead letters."""
    await redis.xgroup_create(stream, channels.QUERY_GROUP, id="0", mkstream=True)
    for body in bodies:
        await redis.xadd(stream, {"__data__": body})
    await redis.xreadgroup(channels.QUERY_GROUP, "dead-worker", {stream: ">"})
    return PendingReclaimer(redis, stream, channels.QUERY_GROUP, 0, 1, "sweeper", **caps)


async def test_dead_letters_keep_the_newest_thousand(redis_url: str) -> None:
    """Dead letters were never trimmed: every request made to fail stayed in Redis for good."""
    redis = aioredis.Redis.from_url(redis_url)
    stream = channels.query_stream(0)
    try:
        bodies = [
            b'{"type": "search", "command_id": "q-%d", "query": "poison"}' % i for i in range(DEAD_LETTERS_KEPT + 50)
        ]
        sweeper = await failed_for_good(redis, stream, bodies)
        while (await redis.xpending(stream, channels.QUERY_GROUP))["pending"]:
            await sweeper.sweep()
        dead = await redis.xrange(sweeper.dead_letters)
        assert len(dead) == DEAD_LETTERS_KEPT
        assert dead[-1][1][b"command_id"] == b"q-%d" % (DEAD_LETTERS_KEPT + 49), "the newest are kept"
    finally:
        await redis.aclose()


async def test_a_big_request_leaves_a_small_dead_letter_within_the_byte_budget(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    stream = channels.query_stream(0)
    try:
        body = b'{"type": "search", "user_id": "%s", "query": "%s"}' % (b"u" * 5_000, b"x" * 100_000)
        sweeper = await failed_for_good(redis, stream, [body] * 12, dead_letter_bytes=2_000)
        await sweeper.sweep()
        letters = await redis.xrange(sweeper.dead_letters)
        sizes = [sum(len(k) + len(v) for k, v in fields.items()) for _, fields in letters]
        assert all(size < 400 for size in sizes), "a letter names the request, cut short; it does not copy it"
        assert letters[-1][1][b"bytes"] == str(len(body)).encode()
        assert len(letters) == 2_000 // sizes[0], "and the byte budget still bounds how many are kept"
    finally:
        await redis.aclose()


async def test_a_stream_filled_past_its_cap_by_a_caller_writing_redis_itself_is_trimmed(redis_url: str) -> None:
    """A client adds requests with MAXLEN; one writing XADD itself need not. The sweep bounds it."""
    redis = aioredis.Redis.from_url(redis_url)
    stream = channels.query_stream(0)
    try:
        await redis.xgroup_create(stream, channels.QUERY_GROUP, id="0", mkstream=True)
        async with redis.pipeline(transaction=False) as pipe:
            for _ in range(2_000):
                pipe.xadd(stream, {"__data__": b'{"type": "list_notes", "user_id": "flood"}'})
            await pipe.execute()
        sweeper = PendingReclaimer(redis, stream, channels.QUERY_GROUP, 60_000, 3, "sweeper", max_entries=500)
        counts = await sweeper.sweep()
        assert counts["trimmed"] >= 1_000
        assert 500 <= await redis.xlen(stream) < 700, "trimmed to the cap, by whole nodes"
    finally:
        await redis.aclose()
