"""One caller cannot starve the others: a flood of one user's requests, written straight onto
the real bus as a hostile agent would, is taken in turns with everyone else's, and what is over
the user's share is refused at once, typed, with a hint of when to try again."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis
from faststream.redis.parser.binary import BinaryMessageFormatV1
from redis.exceptions import ConnectionError as RedisConnectionError

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.bus.admission import DEFAULT_USER_IN_FLIGHT, Admission
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.bus.shedder import BacklogShedder
from tests.conftest import RunningService, service_settings
from tests.support import log_events

FLOOD = 2_000


async def flood(redis: aioredis.Redis, stream: str, bodies: list[dict[str, Any]]) -> asyncio.Task[list[dict[str, Any]]]:
    """Every body written to ``stream`` in one pipeline, replies asked on one channel: a task
    that gathers the replies' bodies."""
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
            pipe.xadd(stream, {"__data__": json.dumps({"data": json.dumps(body), "headers": headers})})
        await pipe.execute()
    return gathering


async def test_a_flood_written_straight_onto_the_bus_is_answered_in_full_and_refused_past_the_share(
    redis_url: str,
) -> None:
    running = await RunningService(
        service_settings(redis_url, index_enabled=False, handler_concurrency=2, user_share=4)
    ).start()
    try:
        async with aioredis.Redis.from_url(redis_url) as redis, EngramClient(redis_url, timeout=60) as bob:
            # given one user's 2,000 saves on the stream at once, as a hostile agent writes them
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
                for _ in range(50):
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


async def test_a_user_whose_places_other_clients_hold_past_the_wait_is_refused_with_when_to_try_again(
    redis_url: str,
) -> None:
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    try:
        async with aioredis.Redis.from_url(redis_url) as redis, EngramClient(redis_url, timeout=1) as agent:
            # given every place of the user held by other clients' requests for longer than this
            # client waits for a reply (1 s)
            others = Admission(redis, DEFAULT_USER_IN_FLIGHT)
            for i in range(DEFAULT_USER_IN_FLIGHT):
                await others.take(0, "flood", f"elsewhere-{i}", hold_ms=30_000)
            with pytest.raises(EngramError) as refused:
                await agent.save("flood", "one too many", advise=False)
            assert refused.value.code is ErrorCode.RATE_LIMITED and refused.value.retry_after_ms == 1_000
            assert "for the last 1 s" in refused.value.message, "it waited for a place before it gave up"
            assert await redis.xinfo_stream(channels.command_stream(0)) is not None
            # nothing was sent; another user is served; and once a place is given back, so is it
            assert await agent.save("bob", "not refused", advise=False)
            await others.release(0, "flood", "elsewhere-0")
            assert await agent.save("flood", "one too many", advise=False)
        assert len([e for e in await log_events(redis_url) if e.user_id == "flood"]) == 1, (
            "the refused one sent nothing"
        )
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


async def test_the_shedder_refuses_only_unread_requests_past_a_users_share_in_the_format_sent(redis_url: str) -> None:
    stream = channels.query_stream(0)
    async with aioredis.Redis.from_url(redis_url) as redis:
        await redis.xgroup_create(stream, channels.QUERY_GROUP, id="0", mkstream=True)
        pubsub = redis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe("engram:replies:shed")
        # given a worker that has read (taken) the first two entries of one user
        binary = await BinaryMessageFormatV1.encode(
            message=b'{"type": "list_notes", "user_id": "flood"}',
            reply_to="engram:replies:shed",
            headers={},
            correlation_id="bin-0",
        )
        await redis.xadd(stream, {"__data__": binary})
        await redis.xadd(stream, {"__data__": binary})
        await redis.xreadgroup(channels.QUERY_GROUP, "worker", {stream: ">"}, count=2)
        # and behind them 300 more of that user (binary and JSON) and one of another
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(300):
                envelope = {
                    "data": '{"type": "list_notes", "user_id": "flood"}',
                    "headers": {"reply_to": "engram:replies:shed", "correlation_id": f"json-{i}"},
                }
                pipe.xadd(stream, {"__data__": binary if i % 2 else json.dumps(envelope)})
            pipe.xadd(stream, {"__data__": b'{"type": "list_notes", "user_id": "bob"}'})
            await pipe.execute()
        shedder = BacklogShedder(redis, stream, channels.QUERY_GROUP, per_user=3, backlog=100)
        # when it sheds
        assert await shedder.shed() == 297
        # then what was read stays, the user's first three unread stay, and the other user's
        left = [fields[b"__data__"] for _, fields in await redis.xrange(stream)]
        assert len(left) == 2 + 3 + 1 and left[-1] == b'{"type": "list_notes", "user_id": "bob"}'
        # and each refused request was answered in its own format
        replies = []
        async with asyncio.timeout(10):
            while len(replies) < 297:
                if (message := await pubsub.get_message(timeout=1.0)) is not None:
                    replies.append(message["data"])
        assert len(replies) == 297
        jsons = [json.loads(r) for r in replies if r.startswith(b"{")]
        binaries = [BinaryMessageFormatV1.parse(r) for r in replies if not r.startswith(b"{")]
        assert jsons and binaries and len(jsons) + len(binaries) == 297
        assert json.loads(jsons[0]["data"])["code"] == "RATE_LIMITED" and jsons[0]["headers"]["correlation_id"]
        body, headers = binaries[0]
        assert json.loads(body)["code"] == "RATE_LIMITED" and headers["correlation_id"] == "bin-0"
        await pubsub.aclose()


async def test_places_a_client_could_not_give_back_do_not_refuse_its_retries(redis_url: str) -> None:
    """Redis restarting (the faults tests kill it) fails the give-back of requests that timed
    out: the client's retries were refused by its own dead requests until they lapsed."""
    async with aioredis.Redis.from_url(redis_url) as redis:
        admission = Admission(redis, per_user=2)
        for request in ("a", "b"):
            await admission.take(0, "ada", request, hold_ms=60_000)
        zrem = redis.zrem

        # redis-py's own error, and what it can leak from a connection Redis just closed
        lost = iter([RedisConnectionError("Redis is restarting"), AttributeError("'NoneType' has no 'writelines'")])

        async def unreachable(*args: Any) -> Any:
            raise next(lost)

        redis.zrem = unreachable  # type: ignore[method-assign]
        for request in ("a", "b"):
            await admission.release(0, "ada", request)  # does not raise: kept for later
        redis.zrem = zrem  # type: ignore[method-assign]
        await admission.take(0, "ada", "c", hold_ms=60_000)  # gives a and b back first
        assert await redis.zrange(channels.in_flight(0, "ada"), 0, -1) == [b"c"]


async def test_a_request_waits_for_a_place_another_client_gives_back(redis_url: str) -> None:
    """Two clients of one user: the second's requests wait for a place the first gives back,
    rather than being refused while the first's requests are answered within milliseconds."""
    async with aioredis.Redis.from_url(redis_url) as redis:
        other = Admission(redis, per_user=2)
        for request in ("a", "b"):
            await other.take(0, "erin", request, hold_ms=60_000)
        mine = Admission(redis, per_user=2)
        waiting = asyncio.create_task(mine.take(0, "erin", "c", hold_ms=60_000, wait=5.0))
        await asyncio.sleep(0.1)
        assert not waiting.done(), "it waits while the other client holds both places"
        await other.release(0, "erin", "a")
        await asyncio.wait_for(waiting, 2.0)
        # and a wait that runs out is refused, with a hint of about a second
        with pytest.raises(EngramError) as refused:
            await mine.take(0, "erin", "d", hold_ms=60_000, wait=0.05)
        assert refused.value.code is ErrorCode.RATE_LIMITED and refused.value.retry_after_ms == 1_000
