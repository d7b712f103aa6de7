"""``BusRequester``: request/reply over Redis Streams for clients, wire-compatible with FastStream.

FastStream's ``broker.request`` opens a Pub/Sub connection and subscribes to a fresh reply
channel for every single request, which caps a client at a few hundred requests per second here.
This requester subscribes once to its own reply channel and matches replies by correlation id, so
many requests can be in flight on one connection. Requests are ordinary FastStream messages
(``BinaryMessageFormatV1`` with ``reply_to`` and ``correlation_id`` headers, framed by ``wire.py``
without importing FastStream), appended to the
stream's inbox, from which the service's gate admits them (``services/bus/gate.py``); its
FastStream subscribers answer them unchanged.

A request the gate refuses because its user's places are all taken (by other clients: this one
sends at most ``user_in_flight`` of a user's at once, the rest wait their turn here) is sent
again after a pause, until the caller's timeout: a user's requests are slowed to the bound, not
refused, unless the wait runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote, urlsplit

from opentelemetry.propagate import inject
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.redis_conn import subscription_messages
from engram_ledger.services.bus import wire
from engram_ledger.services.bus.admission import ADMISSION_HEADER, DEFAULT_USER_IN_FLIGHT, WAIT_HEADER

log = logging.getLogger("engram.client")

RESUBSCRIBE_PAUSE_SECONDS = 0.2
SUBSCRIBE_TIMEOUT_SECONDS = 10.0
# How long ``stop`` waits for the reply reader to end, and how often it asks again meanwhile.
STOP_GRACE_SECONDS = 5.0
STOP_RETRY_SECONDS = 0.05
# While the gate refuses a request (its user's places taken by other clients): the first pause
# before sending it again, and the longest.
FIRST_PAUSE_SECONDS = 0.005
LAST_PAUSE_SECONDS = 0.2


class BusRequester:
    def __init__(
        self,
        redis: Redis,
        *,
        client_name: str | None = None,
        quiet_seconds: float = 5.0,
        user_in_flight: int = DEFAULT_USER_IN_FLIGHT,
    ) -> None:
        """``client_name``: replies come on a channel under ``channels.client_reply_channels``,
        which a Redis ACL can grant to this client's user alone; None: an unnamed channel.
        ``quiet_seconds``: how long the reply channel may stay silent before it is pinged.
        ``user_in_flight``: how many requests of one user this client sends at once (the
        service's own bound holds across every client); 0: no bound here."""
        self._redis = redis
        self._user_in_flight = user_in_flight
        self._turns: dict[str, tuple[asyncio.Semaphore, int]] = {}
        self.reply_channel = channels.reply_channel(uuid.uuid4().hex, client_name)
        self._waiting: dict[str, asyncio.Future[tuple[bytes, dict[str, Any]]]] = {}
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        self._quiet_seconds = quiet_seconds

    async def start(self) -> None:
        await self._subscribe()
        self._reader = asyncio.create_task(self._read_replies(), name="engram-replies")

    async def _subscribe(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
        self._pubsub = self._redis.pubsub()
        await self._pubsub.subscribe(self.reply_channel)
        # Redis answers a SUBSCRIBE later, on the same connection: wait for its confirmation, so
        # that a refusal (an ACL without this channel: NoPermissionError) is raised here, where
        # the caller connects, rather than turning every request into a time-out.
        deadline = asyncio.get_running_loop().time() + SUBSCRIBE_TIMEOUT_SECONDS
        while (message := await self._pubsub.get_message(timeout=0.1)) is None or message["type"] != "subscribe":
            if asyncio.get_running_loop().time() > deadline:
                raise RedisTimeoutError(f"no confirmation of SUBSCRIBE {self.reply_channel}")

    @property
    def running(self) -> bool:
        return self._reader is not None

    async def stop(self) -> None:
        if self._reader is not None:
            await _cancel_and_wait(self._reader)
            self._reader = None
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
        for future in self._waiting.values():
            future.cancel()

    async def request(self, stream: str, body: bytes, timeout: float, user_id: str | None = None) -> bytes:
        """Raises TimeoutError when no reply comes in time (a late reply is dropped), and
        ConnectionError while Redis cannot be reached. ``user_id``: the user the request is
        of, whose turn here it waits for (None: it waits for none, as an operator's)."""
        if user_id is None or not self._user_in_flight:
            return await self._admitted(stream, body, timeout)
        async with self._turn(user_id):
            return await self._admitted(stream, body, timeout)

    @contextlib.asynccontextmanager
    async def _turn(self, user_id: str) -> AsyncIterator[None]:
        """One of this client's ``user_in_flight`` turns for the user (waited for when all are taken)."""
        semaphore, users = self._turns.get(user_id, (asyncio.Semaphore(self._user_in_flight), 0))
        self._turns[user_id] = (semaphore, users + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, users = self._turns[user_id]
            if users == 1:
                del self._turns[user_id]
            else:
                self._turns[user_id] = (semaphore, users - 1)

    async def _admitted(self, stream: str, body: bytes, timeout: float) -> bytes:
        """The reply, the request sent again while the gate refuses it for want of a place."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pause = FIRST_PAUSE_SECONDS
        while True:
            reply, headers = await self._request(stream, body, max(deadline - loop.time(), 0.001))
            if headers.get(ADMISSION_HEADER) is None or loop.time() + pause > deadline:
                return reply
            await asyncio.sleep(pause)
            pause = min(pause * 2, LAST_PAUSE_SECONDS)

    async def _request(self, stream: str, body: bytes, timeout: float) -> tuple[bytes, dict[str, Any]]:
        if self._reader is not None and self._reader.done():
            self._reader.result()  # surface a bug in the reply reader rather than time out silently
        correlation_id = uuid.uuid4().hex
        future: asyncio.Future[tuple[bytes, dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = future
        try:
            # How long this caller waits: the gate holds the request's place no longer.
            headers: dict[str, str] = {WAIT_HEADER: str(int(timeout * 1000))}
            # W3C trace context: the service's consume span continues the caller's trace.
            inject(headers)
            message = wire.encode(body, reply_to=self.reply_channel, headers=headers, correlation_id=correlation_id)
            try:
                await self._redis.rpush(channels.inbox(stream), message)
            except (AttributeError, TypeError) as e:
                # redis-py 8.1 (redis/redis-py#4287): a write on a connection the server has just
                # closed can leak the transport's AttributeError/TypeError instead of its
                # ConnectionError. It is a lost connection; the caller retries as for one.
                raise RedisConnectionError(f"connection lost while sending: {e!r}") from e
            return await asyncio.wait_for(future, timeout)
        finally:
            self._waiting.pop(correlation_id, None)

    async def _read_replies(self) -> None:
        resubscribe = False
        while True:
            try:
                if resubscribe:
                    await self._subscribe()
                assert self._pubsub is not None
                async for message in subscription_messages(self._pubsub, self._quiet_seconds):
                    if message.get("type") != "message":
                        continue
                    body, headers = wire.parse(message["data"])
                    future = self._waiting.get(headers.get("correlation_id", ""))
                    if future is not None and not future.done():
                        future.set_result((bytes(body), headers))
            except (RedisError, OSError):
                pass
            except (AttributeError, TypeError) as e:
                # redis-py 8.1 (redis/redis-py#4287): reading or subscribing on a connection the
                # server has just closed can leak the transport's AttributeError/TypeError instead
                # of a ConnectionError (seen when Redis was killed under load). A lost connection.
                log.warning("the reply channel's connection was lost (%r); subscribing again", e)
            # Redis restarted or failed over: subscribe again. A reply published meanwhile is lost;
            # its request times out and the caller retries with the same command_id.
            resubscribe = True
            await asyncio.sleep(RESUBSCRIBE_PAUSE_SECONDS)


async def _cancel_and_wait(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait until it has ended, within ``STOP_GRACE_SECONDS``.

    One ``cancel()`` is not enough on Python 3.11: a cancel that lands in the same turn of the
    loop as a read's own time limit (redis-py reads a subscription under ``asyncio.timeout``) is
    taken for that limit running out, so the read returns nothing and the task reads on. The
    reader is cancelled again until it ends; a task that still runs at the deadline is left, so
    that a caller's ``close()`` never waits forever."""
    deadline = asyncio.get_running_loop().time() + STOP_GRACE_SECONDS
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=STOP_RETRY_SECONDS)
        if asyncio.get_running_loop().time() > deadline:
            log.warning("the reply reader did not end within %g s of being cancelled", STOP_GRACE_SECONDS)
            return
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()


def client_name_for(url: str, given: str | None) -> str | None:
    """The name this client's reply channels carry: the one given, else the URL's ACL user when
    it is a valid name, so that a role's user works from its URL alone; else none."""
    if given is not None:
        if not channels.valid_client_name(given):
            raise EngramError(
                ErrorCode.INVALID_PARAMETER,
                f"client_name {given!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
            )
        return given
    user = urlsplit(url).username
    return unquote(user) if user and channels.valid_client_name(unquote(user)) else None
