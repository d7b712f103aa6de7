"""``RequestGate``: the one way a client's request reaches a request stream.

A client appends its request to an inbox, a list beside the stream (``channels.inbox``), with
``RPUSH``: all its Redis role may do there, and nothing it can do with it removes, trims or
reorders anyone else's request. (A Redis function could not be the door instead: Redis checks
every command a script or function runs against its caller's ACL, so a function that may XADD
needs a caller who may XADD, and then MAXLEN 0.)

Each worker runs a gate per inbox of the streams it serves, in every partition. A gate reads a
batch at the inbox's head, finds each request's user, and hands the batch to one script
(``admission.ADMIT``) that takes it off the inbox and admits each request by its user's places in
flight (at most ``per_user`` of a user's requests in the streams at once), all in one step: a
request leaves the inbox only as it enters the stream, so a worker killed at any point loses
none, and two workers' gates never admit one request twice (the script checks that the head is
still the batch read, by each request's SHA-1). An admitted request is written to its stream with
the place it holds; one past its user's share is answered ``RATE_LIMITED`` at once, in the format
it was sent in, with ``ADMISSION_HEADER`` set so that Engram's own clients wait and send it again
(up to their timeout). A request whose user cannot be read is admitted under one shared set of
``UNREADABLE_IN_FLIGHT`` places, and its subscriber answers it with the precise error. The
operators' inbox takes no places: an operator's erasure of a flooding user gets through.

An empty inbox is waited on with ``BLMOVE inbox inbox RIGHT RIGHT``, which blocks until a
request is there and then moves the last one to where it was: a wait that takes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
from faststream.redis.parser.binary import BinaryMessageFormatV1
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import ErrorCode, ErrorReply
from engram_ledger.contracts.limits import REQUEST_STREAM_BYTES
from engram_ledger.services.bus.admission import ADMISSION_HEADER, ADMIT, hold_ms
from engram_ledger.services.bus.envelope import EnvelopeFormat, JSONEnvelopeFormat, is_binary

log = logging.getLogger("engram.gate")

# Requests popped at a time, and how long a pop waits for one.
BATCH = 256
BLOCK_SECONDS = 1.0
RETRY_AFTER_MS = 200
# Places shared by every request whose user cannot be read (so junk too is bounded).
UNREADABLE_IN_FLIGHT = 64
_UNREADABLE = " unreadable"  # a space: no user id holds one


class _Who(msgspec.Struct):
    user_id: Any = None


_who = msgspec.json.Decoder(_Who)
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class _Request:
    entry: bytes
    user_id: str | None
    reply_to: str | None
    correlation_id: str
    hold_ms: int


def _read(entry: bytes) -> _Request:
    """What the gate needs of a request: its user, where to answer, how long its caller waits."""
    try:
        body, headers = EnvelopeFormat.parse(entry)
    except Exception:  # FastStream's own parser on bytes of no known format
        return _Request(entry, None, None, "", hold_ms({}))
    try:
        user_id = _who.decode(body).user_id
    except (msgspec.DecodeError, ValueError, RecursionError):
        user_id = None
    reply_to = headers.get("reply_to")
    correlation_id = headers.get("correlation_id")
    return _Request(
        entry,
        user_id if isinstance(user_id, str) else None,
        reply_to if isinstance(reply_to, str) and reply_to else None,
        correlation_id if isinstance(correlation_id, str) else "",
        hold_ms(headers),
    )


@dataclass(frozen=True)
class Lane:
    """An inbox the gate pops and the stream it admits into; ``places``: whether its requests
    take places (not the operators')."""

    inbox: str
    stream: str
    places: bool = True


class RequestGate:
    def __init__(
        self,
        redis: Redis,
        partition: int,
        lane: Lane,
        per_user: int,
        maxlen: int,
        *,
        budget: int = REQUEST_STREAM_BYTES,
        batch: int = BATCH,
    ) -> None:
        """``per_user``: places per user (0: requests take none); ``maxlen``: the stream's count
        cap (``ENGRAM_REQUEST_STREAM_MAXLEN``); ``budget``: its bytes (a request is added with
        MAXLEN ~ the budget over its size)."""
        self._redis = redis
        self.partition = partition
        self.lane = lane
        self._per_user = per_user
        self._maxlen = maxlen
        self._budget = budget
        self._batch = batch
        self._admit = redis.register_script(ADMIT)

    async def run(self, stop: asyncio.Event) -> None:
        inbox = self.lane.inbox
        seen: bytes | None = None
        while not stop.is_set():
            try:
                # The request the wait saw (the inbox's last) is, most often, its only one: it is
                # tried as the whole batch, which saves reading the inbox (the script checks).
                if await self.admit_head(seen) is None:
                    seen = await self._redis.blmove(inbox, inbox, BLOCK_SECONDS, "RIGHT", "RIGHT")
                else:
                    seen = None
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as e:
                log.warning("the gate of %s failed (%r); trying again", inbox, e)
                seen = None
                await asyncio.sleep(0.5)

    async def admit_head(self, guess: bytes | None = None) -> int | None:
        """Admit the batch at the inbox's head; how many of it were refused (None: the inbox is
        empty). ``guess``: a request that may be the whole inbox, tried before reading it. A
        batch another gate took meanwhile is read again."""
        entries = [guess] if guess is not None else await self._read_head()
        while entries:
            refused = await self._admitted(entries)
            if refused is not None:
                return refused
            entries = await self._read_head()
        return None

    async def _read_head(self) -> list[bytes]:
        return list(await self._redis.lrange(self.lane.inbox, 0, self._batch - 1))

    async def _admitted(self, entries: list[bytes]) -> int | None:
        """Admit ``entries`` if they are the inbox's head; how many were refused (None: they
        are not its head)."""
        requests = [_read(entry) for entry in entries]
        keys = [self.lane.inbox, self.lane.stream]
        args: list[Any] = [len(requests), self._maxlen, self._budget]
        for request in requests:
            which, cap = self._place(request, keys)
            # The place's id is the gate's own: a caller could repeat a correlation id.
            args += [hashlib.sha1(request.entry).hexdigest(), which, cap, uuid.uuid4().hex, request.hold_ms]
        refused = await self._admit(keys=keys, args=args)
        if refused == -1:
            return None
        if refused:
            await self._refuse([requests[i - 1] for i in refused])
        return len(refused)

    def _place(self, request: _Request, keys: list[str]) -> tuple[int, int]:
        """The index in ``keys`` of the set of places the request takes (added to ``keys``), and
        how many places that set has; (0, 0) when it takes none."""
        if not self.lane.places or not self._per_user:
            return 0, 0
        user = request.user_id if request.user_id is not None else _UNREADABLE
        cap = self._per_user if request.user_id is not None else UNREADABLE_IN_FLIGHT
        key = channels.in_flight(self.partition, user)
        if key not in keys:
            keys.append(key)
        return keys.index(key) + 1, cap

    async def _refuse(self, requests: list[_Request]) -> None:
        answers = [(r.reply_to, await _refusal(r)) for r in requests if r.reply_to is not None]
        if not answers:
            return
        if isinstance(self._redis, RedisCluster):
            # A cluster's client refuses PUBLISH in a pipeline (it has no key to route it by).
            for channel, answer in answers:
                await self._redis.publish(channel, answer)
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for channel, answer in answers:
                pipe.publish(channel, answer)
            await pipe.execute()


async def _refusal(request: _Request) -> bytes:
    reply = ErrorReply(
        code=ErrorCode.RATE_LIMITED,
        message=(
            f"user {request.user_id!r} has as many requests waiting for a reply as its share of the "
            f"service; nothing was done: send this request again in {RETRY_AFTER_MS / 1000:g} s"
        ),
        retry_after_ms=RETRY_AFTER_MS,
    )
    form = BinaryMessageFormatV1 if is_binary(request.entry) else JSONEnvelopeFormat
    return await form.encode(
        message=_encoder.encode(reply),
        reply_to=None,
        headers={ADMISSION_HEADER: "full"},
        correlation_id=request.correlation_id,
    )
