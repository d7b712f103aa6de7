"""The command and query decoders fuzzed through the real bus (hypothesis bodies sent to the
request streams of a running service on real Redis): every body gets a typed reply, nothing is
left pending or dead-lettered, and the streams keep serving good requests."""

from __future__ import annotations

import msgspec
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings

from engram_ledger.contracts import channels
from engram_ledger.services.bus.client import EngramClient
from tests.builders import bodies
from tests.support import until_none

STREAMS = [
    (channels.command_stream(0), channels.COMMAND_GROUP),
    (channels.query_stream(0), channels.QUERY_GROUP),
]


async def pending(redis: aioredis.Redis) -> list[int]:
    """The request streams' counts of pending entries; none when nothing is pending."""
    counts = [(await redis.xpending(stream, group))["pending"] for stream, group in STREAMS]
    return counts if any(counts) else []


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
async def test_fuzzed_bodies_on_the_real_bus_get_typed_replies_and_nothing_sticks(
    client: EngramClient, redis_url: str, body: bytes
) -> None:
    for stream, _ in STREAMS:
        reply = msgspec.json.decode(await client.request_raw(stream, body))
        assert isinstance(reply, dict) and "type" in reply
        if reply["type"] == "error":
            assert reply["code"] in {"INVALID_PARAMETER", "MEMORY_NOT_FOUND", "UNAVAILABLE"} and reply["message"]
    good = await client.save("u", "still flowing", advise=False)
    assert (await client.get_note("u", good.note_id, after=good.token)).content == "still flowing"
    redis = aioredis.Redis.from_url(redis_url)
    try:
        # An entry is acknowledged just after its reply is published.
        await until_none(lambda: pending(redis), what="requests pending")
        assert [await redis.xlen(channels.dead_letter_stream(s)) for s, _ in STREAMS] == [0, 0]
    finally:
        await redis.aclose()
