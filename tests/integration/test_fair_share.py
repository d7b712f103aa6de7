"""One caller cannot starve the others: a flood of one user's requests, appended to the real
bus's inboxes as a hostile agent would, is admitted no further than the user's places, and what
is over them is refused at once, typed, with a hint of when to try again."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from faststream.redis.parser.binary import BinaryMessageFormatV1
from redis.asyncio.cluster import RedisCluster

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.bus.admission import DEFAULT_USER_IN_FLIGHT, WAIT_HEADER
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.bus.gate import ADMISSION_HEADER, Lane, RequestGate
from tests.cluster import LocalCluster
from tests.conftest import RunningService, service_settings
from tests.support import eventually, log_events

FLOOD = 2_000


async def flood(redis: aioredis.Redis, stream: str, bodies: list[dict[str, Any]]) -> asyncio.Task[list[dict[str, Any]]]:
    """Every body appended to ``stream``'s inbox in one pipeline, replies asked on one channel: a
    task that gathers the replies' bodies."""
    reply_to = channels.reply_channel(f"flood-{uuid.uuid4().hex}")
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(reply_to)

    async def replies() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        async with asyncio.timeout(120):
            while len(got) < len(bodies):
                message = await pubsub.get_message(timeout=1.0)
                if message is not None and message["type"] == "message":
                    got.append(json.loads(json.loads(message["data"])["data"]))
        await pubsub.aclose()
        return got

    gathering = asyncio.create_task(replies())
    async with redis.pipeline(transaction=False) as pipe:
        for i, body in enumerate(bodies):
            headers = {"reply_to": reply_to, "correlation_id": f"c-{i}"}
            pipe.rpush(channels.inbox(stream), json.dumps({"data": json.dumps(body), "headers": headers}))
        await pipe.execute()
    return gathering


async def test_a_flood_appended_to_an_inbox_is_answered_in_full_and_refused_past_the_share(
    redis_url: str,
) -> None:
    running = await RunningService(
        service_settings(redis_url, index_enabled=False, handler_concurrency=2, user_share=4)
    ).start()
    try:
        async with aioredis.Redis.from_url(redis_url) as redis, EngramClient(redis_url, timeout=60) as bob:
            # given one user's 2,000 saves in the inbox at once, as a hostile agent appends them
            saves = [
                {"type": "save_note", "command_id": f"f-{i}", "user_id": "flood", "content": f"flood note {i}"}
                for i in range(FLOOD)
            ]
            replies = await flood(redis, channels.command_stream(0), saves)
            # when another user saves behind them
            written = await bob.save("bob", "my save is not stuck behind the flood", advise=False)
            answered = await replies
        # then every request got its answer: written, or refused typed with a hint; none lost
        refused = [r for r in answered if r["type"] == "error"]
        assert refused and all(r["code"] == "RATE_LIMITED" and r["retry_after_ms"] > 0 for r in refused)
        assert "send this request again in" in refused[0]["message"]
        events = await log_events(redis_url)
        assert len([e for e in events if e.user_id == "flood"]) == len(answered) - len(refused)
        assert len(answered) == FLOOD
        # and the other user's save was not queued behind the whole flood (first in, first out, it
        # came after every one of them that was written)
        mine = next(i for i, e in enumerate(events) if e.note_id == written.note_id)
        ahead = sum(1 for e in events[:mine] if e.user_id == "flood")
        assert ahead < FLOOD // 2, f"{ahead} of the flood's saves were written before it"
    finally:
        await running.stop()


async def test_one_clients_flood_waits_its_turn_in_the_client_and_others_are_not_queued_behind_it(
    redis_url: str,
) -> None:
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    try:
        async with EngramClient(redis_url, timeout=60) as agent, EngramClient(redis_url, timeout=60) as bob:
            await bob.save("bob", "warming up", advise=False)
            # given one agent sending 2,000 saves of one user at once
            saves = [asyncio.create_task(agent.save("flood", f"flood note {i}", advise=False)) for i in range(FLOOD)]
            async with aioredis.Redis.from_url(redis_url) as redis:
                # then the user never has more requests in flight than its places
                seen = []
                for _ in range(50):  # samples, while the flood goes on
                    seen.append(await redis.zcard(channels.in_flight(0, "flood")))
                    await asyncio.sleep(0.005)
                assert max(seen) <= DEFAULT_USER_IN_FLIGHT and max(seen) > 0, seen
            # and another user's save is not queued behind the rest
            written = await bob.save("bob", "my save is not stuck behind the flood", advise=False)
            outcomes = await asyncio.gather(*saves)
        assert len({o.note_id for o in outcomes}) == FLOOD, "every one of them written, none refused"
        events = await log_events(redis_url)
        mine = next(i for i, e in enumerate(events) if e.note_id == written.note_id)
        ahead = sum(1 for e in events[:mine] if e.user_id == "flood")
        assert ahead < FLOOD // 2, f"{ahead} of the flood's saves were written before it"
    finally:
        await running.stop()


async def _hold_places(redis: aioredis.Redis, user: str, count: int) -> list[str]:
    """Places of the user taken by other clients' requests, for longer than any wait here."""
    places = [f"elsewhere-{i}" for i in range(count)]
    far = (await redis.time())[0] * 1000 + 60_000
    await redis.zadd(channels.in_flight(0, user), dict.fromkeys(places, far))
    return places


async def test_a_user_whose_places_other_clients_hold_past_the_wait_is_refused_with_when_to_try_again(
    redis_url: str,
) -> None:
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    try:
        async with aioredis.Redis.from_url(redis_url) as redis, EngramClient(redis_url, timeout=1) as agent:
            # given every place of the user held by other clients' requests for longer than this
            # client waits for a reply (1 s)
            places = await _hold_places(redis, "flood", DEFAULT_USER_IN_FLIGHT)
            with pytest.raises(EngramError) as refused:
                await agent.save("flood", "one too many", advise=False)
            assert refused.value.code is ErrorCode.RATE_LIMITED and refused.value.retry_after_ms
            assert "send this request again in" in refused.value.message
            # nothing was sent; another user is served; and once a place is given back, so is it
            assert await agent.save("bob", "not refused", advise=False)
            await redis.zrem(channels.in_flight(0, "flood"), places[0])
            assert await agent.save("flood", "one too many", advise=False)
        assert len([e for e in await log_events(redis_url) if e.user_id == "flood"]) == 1, (
            "the refused one sent nothing"
        )
    finally:
        await running.stop()


async def test_a_request_waits_for_a_place_another_client_gives_back(redis_url: str) -> None:
    """Two clients of one user: while the other holds both places, a request is sent again
    until one is given back, rather than refused while the other's are answered."""
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    try:
        async with aioredis.Redis.from_url(redis_url) as redis, EngramClient(redis_url, timeout=30) as mine:
            places = await _hold_places(redis, "erin", DEFAULT_USER_IN_FLIGHT)
            waiting = asyncio.create_task(mine.save("erin", "waits for a place", advise=False))
            done, _ = await asyncio.wait({waiting}, timeout=0.3)
            assert not done, "it waits while the other client holds both places"
            await redis.zrem(channels.in_flight(0, "erin"), places[0])
            assert (await asyncio.wait_for(waiting, 10)).version == 1
    finally:
        await running.stop()


async def test_a_flood_of_queries_is_refused_past_the_users_share_and_others_are_answered(redis_url: str) -> None:
    running = await RunningService(
        service_settings(redis_url, index_enabled=False, handler_concurrency=1, user_share=2)
    ).start()
    try:
        async with aioredis.Redis.from_url(redis_url) as redis, EngramClient(redis_url, timeout=60) as bob:
            saved = await bob.save("bob", "a note of bob's", advise=False)
            listings = [{"type": "list_notes", "user_id": "flood"} for _ in range(FLOOD)]
            replies = await flood(redis, channels.query_stream(0), listings)
            mine = await bob.list_notes("bob", after=saved.token)
            answered = await replies
        assert [n.id for n in mine.notes] == [saved.note_id]
        kinds = {r["type"] for r in answered}
        refused = [r for r in answered if r["type"] == "error"]
        assert refused and all(r["code"] == "RATE_LIMITED" for r in refused)
        assert kinds <= {"error", "notes"}, kinds
    finally:
        await running.stop()


async def test_the_gate_admits_a_users_share_and_refuses_the_rest_in_the_format_sent(redis_url: str) -> None:
    stream = channels.query_stream(0)
    lane = Lane(channels.inbox(stream), stream)
    async with aioredis.Redis.from_url(redis_url) as redis:
        gate = RequestGate(redis, 0, lane, per_user=3, maxlen=100_000)
        pubsub = redis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe("engram:replies:gate")
        binary = await BinaryMessageFormatV1.encode(
            message=b'{"type": "list_notes", "user_id": "flood"}',
            reply_to="engram:replies:gate",
            headers={},
            correlation_id="bin-0",
        )
        # given 300 requests of one user (binary and JSON) and one of another
        entries: list[bytes] = []
        for i in range(300):
            envelope = {
                "data": '{"type": "list_notes", "user_id": "flood"}',
                "headers": {"reply_to": "engram:replies:gate", "correlation_id": f"json-{i}"},
            }
            entries.append(binary if i % 2 else json.dumps(envelope).encode())
        entries.append(b'{"type": "list_notes", "user_id": "bob"}')
        # when the gate admits them
        await redis.rpush(lane.inbox, *entries)
        assert await _drain(gate) == 297 and not await redis.exists(lane.inbox)
        # then the user's first three and the other user's are in the stream, each with its place
        admitted = [fields for _, fields in await redis.xrange(stream)]
        assert len(admitted) == 3 + 1 and admitted[-1][b"__data__"] == entries[-1]
        assert await redis.zcard(channels.in_flight(0, "flood")) == 3
        assert {f[b"engram-place"] for f in admitted[:3]} == set(
            await redis.zrange(channels.in_flight(0, "flood"), 0, -1)
        )
        assert await redis.pttl(channels.in_flight(0, "flood")) > 0, "the places lapse on their own"
        # and each refused request was answered in its own format, marked as not admitted
        replies = []
        async with asyncio.timeout(10):
            while len(replies) < 297:
                if (message := await pubsub.get_message(timeout=1.0)) is not None:
                    replies.append(message["data"])
        jsons = [json.loads(r) for r in replies if r.startswith(b"{")]
        binaries = [BinaryMessageFormatV1.parse(r) for r in replies if not r.startswith(b"{")]
        assert jsons and binaries and len(jsons) + len(binaries) == 297
        assert json.loads(jsons[0]["data"])["code"] == "RATE_LIMITED" and jsons[0]["headers"]["correlation_id"]
        assert jsons[0]["headers"][ADMISSION_HEADER] == "full"
        body, headers = binaries[0]
        assert json.loads(body)["code"] == "RATE_LIMITED" and headers["correlation_id"] == "bin-0"
        await pubsub.aclose()


async def test_on_a_redis_cluster_the_gate_refuses_past_the_share_and_goes_on_admitting(tmp_path: Path) -> None:
    """A refusal on a Redis Cluster stopped the gate for good: its answers were published in a
    pipeline, which a cluster's client refuses, and every later request of the partition waited in
    the inbox until its caller gave up."""
    cluster = LocalCluster(tmp_path / "cluster").start()
    stream = channels.query_stream(0)
    lane = Lane(channels.inbox(stream), stream)
    redis = RedisCluster.from_url(cluster.url)
    # A cluster passes PUBLISH on to every node: any node's subscriber hears the answers.
    listener = aioredis.Redis(port=cluster.nodes[0].port)
    pubsub = listener.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe("engram:replies:cluster-gate")
    stop = asyncio.Event()
    gate = asyncio.create_task(RequestGate(redis, 0, lane, per_user=1, maxlen=100_000).run(stop))
    try:
        # given three requests of one user, whose place is one
        def request(user: str, n: int) -> bytes:
            body = json.dumps({"type": "list_notes", "user_id": user})
            headers = {"reply_to": "engram:replies:cluster-gate", "correlation_id": f"{user}-{n}"}
            return json.dumps({"data": body, "headers": headers}).encode()

        await redis.rpush(lane.inbox, *(request("flood", n) for n in range(3)))
        # then the two past the place are refused, typed
        refused: list[dict[str, Any]] = []

        async def two_refused() -> bool:
            if (message := await pubsub.get_message(timeout=0.1)) is not None:
                refused.append(json.loads(json.loads(message["data"])["data"]))
            return len(refused) == 2

        await eventually(two_refused, what="two refusals", interval=0)
        assert all(r["code"] == "RATE_LIMITED" for r in refused)
        # and the gate goes on: another user's request is admitted
        await redis.rpush(lane.inbox, request("bob", 0))
        await eventually(lambda: redis.xlen(stream), what="bob's request admitted too")
        assert await redis.xlen(stream) == 2 and not gate.done()
    finally:
        stop.set()
        await asyncio.wait_for(gate, 10)
        await pubsub.aclose()
        await listener.aclose()
        await redis.aclose()
        cluster.stop()


async def test_a_place_lapses_when_its_callers_wait_ends(redis_url: str) -> None:
    """A request whose worker died keeps its place no longer than its caller waits: the gate
    clears lapsed places, and the set expires with its last place."""
    stream = channels.command_stream(0)
    lane = Lane(channels.inbox(stream), stream)
    async with aioredis.Redis.from_url(redis_url) as redis:
        gate = RequestGate(redis, 0, lane, per_user=2, maxlen=100_000)
        quick = await BinaryMessageFormatV1.encode(
            message=b'{"type": "save_note", "user_id": "ada"}',
            reply_to=None,
            headers={WAIT_HEADER: "0"},
            correlation_id="q",
        )
        await redis.rpush(lane.inbox, quick, quick, quick)
        assert await _drain(gate) == 1, "two places, the third refused"
        # then, once their holds have run out (the caller's wait and a grace of a second)
        assert await eventually(lambda: _admitted(redis, gate, quick), timeout=30, what="a lapsed place taken again")
        await eventually(lambda: _gone(redis, channels.in_flight(0, "ada")), timeout=30, what="the set to expire")


async def _drain(gate: RequestGate) -> int:
    """Admit batches until the inbox is empty; how many requests were refused."""
    refused = 0
    while (some := await gate.admit_head()) is not None:
        refused += some
    return refused


async def _admitted(redis: aioredis.Redis, gate: RequestGate, entry: bytes) -> bool:
    await redis.rpush(gate.lane.inbox, entry)
    return await gate.admit_head() == 0


async def test_gates_of_several_workers_admit_each_request_once_and_lose_none(redis_url: str) -> None:
    """Four gates on one inbox at once: every request reaches the stream exactly once."""
    stream = channels.command_stream(0)
    lane = Lane(channels.inbox(stream), stream)
    async with aioredis.Redis.from_url(redis_url) as redis:
        gates = [RequestGate(redis, 0, lane, per_user=0, maxlen=100_000, batch=7) for _ in range(4)]
        sent = [b'{"type": "save_note", "user_id": "u%d", "n": %d}' % (i % 13, i) for i in range(3_000)]

        async with redis.pipeline(transaction=False) as pipe:
            for entry in sent:
                pipe.rpush(lane.inbox, entry)
            await pipe.execute()
        await asyncio.gather(*(_drain(g) for g in gates))
        written = [fields[b"__data__"] for _, fields in await redis.xrange(stream)]
        assert written == sent


async def _gone(redis: aioredis.Redis, key: str) -> bool:
    return not await redis.exists(key)
