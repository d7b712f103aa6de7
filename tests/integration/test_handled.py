"""``DeleteHandled`` on real Redis through the real broker: a request's reply, ack and delete go
together, so an answered request is gone from its stream, and one whose reply Redis refuses is
neither acked nor deleted (it stays pending, for the reclaimer to deliver again)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis.asyncio as aioredis
from faststream import AckPolicy
from faststream.redis import StreamSub
from faststream.redis.parser import BinaryMessageFormatV1

from engram_ledger.services.bootstrap import make_broker
from tests.support import until_none

STREAM, GROUP = "handled-test:requests", "handled-test"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def echo_url(redis: aioredis.Redis, redis_url: str) -> AsyncIterator[str]:
    """A Redis user that may publish on ``allowed:*`` channels only, as an ACL'd service may."""
    user, password = f"handled-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    await redis.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&allowed:*", "+@all")
    parts = urlsplit(redis_url)
    yield urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))
    await redis.execute_command("ACL", "DELUSER", user)


@pytest.fixture
async def echo(echo_url: str) -> AsyncIterator[None]:
    broker = make_broker(echo_url)

    @broker.subscriber(
        stream=StreamSub(STREAM, group=GROUP, consumer="echo-1", polling_interval=100),
        ack_policy=AckPolicy.REJECT_ON_ERROR,
    )
    async def echo(body: bytes) -> bytes:
        return body

    await broker.start()
    yield
    await broker.stop()


async def ask(redis: aioredis.Redis, reply_to: str, body: bytes) -> bytes | None:
    """Sends one request and waits for its reply on ``reply_to`` (None if none comes in 2 s)."""
    async with redis.pubsub(ignore_subscribe_messages=True) as pubsub:
        await pubsub.subscribe(reply_to)
        request = await BinaryMessageFormatV1.encode(message=body, reply_to=reply_to, headers={}, correlation_id="c-1")
        await redis.xadd(STREAM, {"__data__": request})
        try:
            async with asyncio.timeout(2):
                while (message := await pubsub.get_message(timeout=2)) is None:
                    pass
        except TimeoutError:
            return None
        return BinaryMessageFormatV1.parse(message["data"])[0]


async def test_an_answered_request_is_acked_and_deleted_with_its_reply(redis: aioredis.Redis, echo: None) -> None:
    assert await ask(redis, "allowed:one", b"hello") == b"hello"
    # The reply and the delete are one round trip: gone by now, or nearly.
    await until_none(lambda: redis.xlen(STREAM), what="the answered request in its stream")
    assert (await redis.xpending(STREAM, GROUP))["pending"] == 0


async def test_a_request_whose_reply_is_refused_stays_pending_and_in_its_stream(
    redis: aioredis.Redis, echo: None
) -> None:
    assert await ask(redis, "denied:one", b"hello") is None
    pending = (await redis.xpending(STREAM, GROUP))["pending"]
    assert pending == 1, "refused reply: the request is not acked"
    assert await redis.xlen(STREAM) == 1, "nor deleted"
    # The stream keeps flowing: the next request is answered and taken off.
    assert await ask(redis, "allowed:two", b"next") == b"next"
    assert (await redis.xpending(STREAM, GROUP))["pending"] == 1
