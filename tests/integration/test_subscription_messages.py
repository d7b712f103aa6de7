"""``subscription_messages``, the way a serving process and a client read a subscription, on a
real Redis: a quiet subscription is pinged and still delivers; a connection the kernel ended
(the ETIMEDOUT keepalive or TCP_USER_TIMEOUT gives, which redis-py 8.1's ``listen()`` spins on
without yielding) ends the iteration with a ``RedisError`` at once, and the event loop never
stalls. ``tests/faults/test_lost_peer.py`` cuts a real network under it (as root)."""

from __future__ import annotations

import asyncio
import errno
import faulthandler
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from engram_ledger.services.adapters.redis_conn import subscription_messages
from tests.conftest import TEST_REDIS_URL
from tests.support import longest_stall


async def next_of_type(messages: AsyncIterator[dict[str, Any]], kind: str) -> dict[str, Any]:
    async for message in messages:
        if message["type"] == kind:
            return message
    raise AssertionError("the subscription ended")


async def test_a_quiet_subscription_is_pinged_and_still_delivers() -> None:
    async with aioredis.Redis.from_url(TEST_REDIS_URL) as redis:
        pubsub = redis.pubsub()
        await pubsub.subscribe("engram-test:quiet")
        messages = subscription_messages(pubsub, quiet_seconds=0.3)
        assert (await asyncio.wait_for(next_of_type(messages, "subscribe"), 5))["channel"] == b"engram-test:quiet"
        await asyncio.wait_for(next_of_type(messages, "pong"), 5)  # quiet: pinged, and answered
        await redis.publish("engram-test:quiet", "after the pong")
        assert (await asyncio.wait_for(next_of_type(messages, "message"), 5))["data"] == b"after the pong"
        await pubsub.aclose()


@pytest.fixture
def watchdog() -> Iterator[None]:
    """A frozen event loop cannot fail its own test: the whole run would hang. This ends the
    run instead (exit status 1; the threads' tracebacks go to pytest's captured stderr)."""
    faulthandler.dump_traceback_later(60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


async def test_a_connection_the_kernel_ended_ends_the_subscription_without_freezing(watchdog: None) -> None:
    async with aioredis.Redis.from_url(TEST_REDIS_URL) as redis:
        pubsub = redis.pubsub()
        await pubsub.subscribe("engram-test:ended")
        messages = subscription_messages(pubsub, quiet_seconds=1.0)
        await asyncio.wait_for(next_of_type(messages, "subscribe"), 5)
        stop = asyncio.Event()
        watching = asyncio.create_task(longest_stall(stop))
        reading = asyncio.create_task(next_of_type(messages, "message"))
        await asyncio.sleep(0.2)  # the read waits on the wire
        # What asyncio does when the kernel reports ETIMEDOUT on the socket.
        assert pubsub.connection is not None
        transport = pubsub.connection._writer.transport  # type: ignore[union-attr]
        transport._force_close(TimeoutError(errno.ETIMEDOUT, "Connection timed out"))
        with pytest.raises(RedisError):
            await asyncio.wait_for(reading, 5)
        stop.set()
        assert await watching < 0.5
        await pubsub.aclose()
