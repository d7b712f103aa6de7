"""Subscribing to Engram's event log: typed deliveries through a consumer group.

``Subscription`` reads every partition's log (``engram:{p}:log``) with a consumer group of the
subscriber's own, created on first use; Redis keeps the group's position and its pending list, so
a restart resumes where the last run stopped. Each entry becomes a ``Delivery``: the event decoded
into its ``contracts/events.py`` Struct, acknowledged explicitly (``await delivery.ack()``).

At least once, in order per partition: a (re)started consumer first takes back its own pending
entries (those it read but never acknowledged before a crash), in log order, then new ones; every
``claim_idle_ms`` it claims entries another consumer of the group has left pending that long
(XAUTOCLAIM, as the service's reclaimer does for requests; the log itself is never copied or
deleted), and a delivery of its own left unacknowledged that long comes again.

Content is sealed in the log (``engram_ledger.services.adapters.crypto``). Without a key a delivery carries
metadata only, its content fields empty (``ContentState.WITHHELD``). With the master key, the
content of a note that still has its data key is opened; a note forgotten before the entry is
read has none, and reads as ``ContentState.ERASED``. A recall's query opens with the key drawn
from its own and those of the notes it names, while all of them exist. Keys are read afresh for
every batch and never cached, so nothing opens once a forget has destroyed them. An entry whose
content does not open under keys that exist (altered) is passed over, logged and acked.

What it needs from Redis: XGROUP CREATE (MKSTREAM), XREADGROUP, XACK and XAUTOCLAIM on the log
keys; GET of ``engram:partitions`` unless ``partition_count`` is given; MGET of the data keys
(``engram:{p}:dek:...``) only with a key. Without a group (``engram tail``): XREAD and XREVRANGE.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import msgspec
from redis.exceptions import ClusterDownError, NoPermissionError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import AnyEvent, Event
from engram_ledger.contracts.limits import UserId
from engram_ledger.services.adapters.crypto import MasterKey
from engram_ledger.services.adapters.redis_conn import close_redis, open_redis, redact_url
from engram_ledger.services.bus.deliveries import (
    ERASURES,
    Delivery,
    UnopenableEvent,
    check_id,
    checked_users,
    data_keys_needed,
    event_decoder,
    event_kinds,
    reveal,
)

log = logging.getLogger("engram.subscription")

# A stable name, so that a restarted subscriber takes back its own pending entries at once and in
# order; several processes sharing one group need a name each.
DEFAULT_CONSUMER = "main"
CLAIM_IDLE_MS = 30_000
BATCH = 500
BLOCK_MS = 1_000
# Redis down or restarting, a cluster failing over: the read is retried, as the service's workers do.
_TRANSIENT = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError, OSError)
_RETRY_MAX_SECONDS = 5.0


class _Closed:
    pass


_CLOSED = _Closed()


class Subscription:
    """Every partition's log through consumer group ``group`` (or, with ``group=None``, followed
    without one: nothing kept, nothing acked, as ``engram tail`` does without ``--group``). Use as
    ``async with subscription: async for delivery in subscription: ...``; iterating alone starts
    it and stops it when the loop ends."""

    def __init__(
        self,
        redis: Any,
        group: str | None,
        *,
        from_start: bool = False,
        users: Iterable[str] | None = None,
        kinds: Iterable[str | type[Event]] | None = None,
        key: MasterKey | None = None,
        consumer: str = DEFAULT_CONSUMER,
        partitions: Sequence[int] | None = None,
        partition_count: int | None = None,
        claim_idle_ms: int = CLAIM_IDLE_MS,
        batch: int = BATCH,
        block_ms: int = BLOCK_MS,
        url: str = "",
        owns_redis: bool = False,
        resume: Mapping[int, str] | None = None,
    ) -> None:
        """``from_start``: a group created now starts at the log's beginning (else at its end);
        an existing group resumes where it is. ``users``: only these users' events. ``kinds``:
        only these event types, erasures always included. ``key``: the master key, to open the
        content of notes not forgotten. ``partitions``: read only these partitions (several
        processes of one group can split them, keeping each note's order); ``partition_count``:
        how many the log has (else read from ``engram:partitions``). ``resume``: without a group,
        read each partition it names after that log entry id (an event stream that reconnects
        picks up after the last event it had)."""
        if group is not None:
            check_id("group", group, UserId)
            check_id("consumer", consumer, UserId)
        for name, value, low in (("claim_idle_ms", claim_idle_ms, 1), ("batch", batch, 1), ("block_ms", block_ms, 1)):
            if not isinstance(value, int) or value < low:
                raise EngramError(ErrorCode.INVALID_PARAMETER, f"{name} must be a whole number >= {low}; got {value!r}")
        self._redis = redis
        self.group = group
        self.consumer = consumer
        self.from_start = from_start
        self.users = checked_users(users)
        self.kinds = event_kinds(kinds)
        self._key = key
        self._only = None if partitions is None else sorted(set(partitions))
        self._partition_count = partition_count
        self._claim_idle_ms = claim_idle_ms
        self._batch = batch
        self._block_ms = block_ms
        self._url = url
        self._owns_redis = owns_redis
        self._resume = dict(resume or {})
        self.partitions: list[int] = []
        self._queue: asyncio.Queue[list[Delivery] | BaseException | _Closed] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ready: collections.deque[Delivery] = collections.deque()
        # Entries this process holds and has not acked: None while queued, else when handed out.
        # A claim never hands out again what is queued or was handed out less than claim_idle_ms ago.
        self._held: dict[tuple[int, str], float | None] = {}
        self._closed = False

    @classmethod
    def connect(cls, url: str, group: str | None, *, cluster: bool = False, **options: Any) -> Subscription:
        """A subscription with a Redis connection of its own, closed with it: all a subscriber
        whose Redis user may only read the log needs (give ``partition_count`` then)."""
        return cls(open_redis(url, cluster), group, url=url, owns_redis=True, **options)

    # lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> Subscription:
        await self.start()
        return self

    async def __aexit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType] | Any) -> None:
        await self.close()

    async def start(self) -> None:
        """Creates the group on each partition (if new) and starts reading; idempotent."""
        if self._queue is not None:
            return
        if self._closed:
            raise EngramError(ErrorCode.INVALID_PARAMETER, "this subscription was closed; open a new one")
        try:
            count = self._partition_count or await self._stored_partition_count()
            self.partitions = self._chosen(count)
            starts: dict[int, str] = {}
            for p in self.partitions:
                if self.group is None:
                    starts[p] = self._resume.get(p) or ("0-0" if self.from_start else await self._log_end(p))
                else:
                    await self._ensure_group(p)
        except _TRANSIENT as e:
            await self._release()
            raise EngramError(ErrorCode.UNAVAILABLE, f"cannot reach the Engram bus at {self._where()}: {e}") from None
        except ResponseError as e:
            await self._release()
            raise _refused(e) from None
        except BaseException:
            await self._release()
            raise
        self._queue = asyncio.Queue(maxsize=max(2, len(self.partitions)))
        for p in self.partitions:
            reader = self._follow(p, starts[p]) if self.group is None else self._consume(p)
            self._tasks.append(asyncio.create_task(self._guarded(reader), name=f"engram-subscription-{p}"))

    async def close(self) -> None:
        """Stops reading; what was read and not acked stays pending for the next run."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            # redis-py can lose a cancellation that lands while a command starts (redis/redis-py#2028,
            # seen with 8.1): cancel again until the reader is really gone.
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=0.05)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()
        if self._queue is not None:
            while not self._queue.empty():
                self._queue.get_nowait()
            self._queue.put_nowait(_CLOSED)
        await self._release()

    async def _release(self) -> None:
        if self._owns_redis:
            self._owns_redis = False
            await close_redis(self._redis)

    def _where(self) -> str:
        return redact_url(self._url) if self._url else "the configured Redis"

    async def _stored_partition_count(self) -> int:
        stored = await self._redis.get(channels.PARTITIONS_KEY)
        if stored is None:
            raise EngramError(
                ErrorCode.UNAVAILABLE,
                f"no Engram service has ever run on {self._where()} (no {channels.PARTITIONS_KEY}); start "
                "`engram serve`, or give partition_count",
            )
        return int(stored)

    def _chosen(self, count: int) -> list[int]:
        chosen = list(range(count)) if self._only is None else self._only
        bad = [p for p in chosen if not 0 <= p < count]
        if bad:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER, f"partitions: {bad} out of range; the log has partitions 0-{count - 1}"
            )
        if self.users is not None:
            # A user's events are all in one partition: the others hold nothing for this filter.
            mine = {channels.partition_of(u, count) for u in self.users}
            chosen = [p for p in chosen if p in mine]
        return chosen

    async def _ensure_group(self, partition: int) -> None:
        try:
            await self._redis.xgroup_create(
                channels.event_log(partition), self.group, id="0" if self.from_start else "$", mkstream=True
            )
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def _log_end(self, partition: int) -> str:
        last = await self._redis.xrevrange(channels.event_log(partition), count=1)
        return last[0][0].decode() if last else "0-0"

    # reading --------------------------------------------------------------------------------

    async def _guarded(self, reader: Any) -> None:
        """Runs a partition's reader; a failure it cannot ride out ends the iteration with it."""
        try:
            await reader
        except asyncio.CancelledError:
            raise
        except ResponseError as e:
            await self._fail(_refused(e))
        except BaseException as e:
            await self._fail(e)

    async def _fail(self, error: BaseException) -> None:
        assert self._queue is not None
        await self._queue.put(error)

    async def _consume(self, partition: int) -> None:
        stream = channels.event_log(partition)
        recovering = True
        backoff = 0.1
        claim_every = max(self._claim_idle_ms / 4000, 0.05)
        next_claim = time.monotonic() + claim_every
        while not self._closed:
            try:
                if recovering:
                    await self._own_pending(partition)
                    recovering = False
                if time.monotonic() >= next_claim:
                    await self._claim(partition)
                    next_claim = time.monotonic() + claim_every
                response = await self._redis.xreadgroup(
                    self.group, self.consumer, {stream: ">"}, count=self._batch, block=self._block_ms
                )
                for _, entries in response or []:
                    await self._emit(partition, entries, redelivered=False)
                backoff = 0.1
            except _TRANSIENT as e:
                log.warning("reading %s: %s; retrying in %.1f s", stream, e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _RETRY_MAX_SECONDS)
                # A read whose reply was lost left its entries pending on this consumer.
                recovering = True
            except ResponseError as e:
                if "NOGROUP" not in str(e):
                    raise
                # The log or the group was deleted (a store emptied and started again).
                log.warning("the group %s on %s is gone; creating it again", self.group, stream)
                await self._ensure_group(partition)
                recovering = True

    async def _own_pending(self, partition: int) -> None:
        """This consumer's pending entries, in log order: those a crashed run read and never acked."""
        stream = channels.event_log(partition)
        after = "0-0"
        while True:
            response = await self._redis.xreadgroup(self.group, self.consumer, {stream: after}, count=self._batch)
            entries = [e for _, es in response or [] for e in es]
            if not entries:
                return
            after = entries[-1][0].decode()
            fresh = [e for e in entries if (partition, e[0].decode()) not in self._held]
            await self._emit(partition, fresh, redelivered=True)

    async def _claim(self, partition: int) -> None:
        """Entries left pending longer than claim_idle_ms by any consumer of the group (one that
        died, or this one, unacked) are taken over and delivered again."""
        stream = channels.event_log(partition)
        start = "0-0"
        while True:
            reply = await self._redis.xautoclaim(
                stream, self.group, self.consumer, self._claim_idle_ms, start_id=start, count=self._batch
            )
            start = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
            claimed = [e for e in reply[1] if e[0] is not None and self._claimable(partition, e[0].decode())]
            await self._emit(partition, claimed, redelivered=True)
            if start == "0-0":
                return

    def _claimable(self, partition: int, position: str) -> bool:
        if (partition, position) not in self._held:
            return True
        handed = self._held[(partition, position)]
        return handed is not None and time.monotonic() - handed >= self._claim_idle_ms / 1000

    async def _follow(self, partition: int, after: str) -> None:
        stream = channels.event_log(partition)
        backoff = 0.1
        while not self._closed:
            try:
                response = await self._redis.xread({stream: after}, count=self._batch, block=self._block_ms)
                for _, entries in response or []:
                    after = entries[-1][0].decode()
                    await self._emit(partition, entries, redelivered=False)
                backoff = 0.1
            except _TRANSIENT as e:
                log.warning("reading %s: %s; retrying in %.1f s", stream, e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _RETRY_MAX_SECONDS)

    async def _emit(self, partition: int, entries: list[Any], *, redelivered: bool) -> None:
        if not entries:
            return
        deliveries, passed_over = await self._prepare(partition, entries, redelivered)
        if passed_over and self.group is not None:
            # Filtered out: done with at once, or they would wait in the pending list forever.
            await self._redis.xack(channels.event_log(partition), self.group, *passed_over)
        if deliveries:
            if self.group is not None:  # without a group nothing is acked: nothing to hold
                for d in deliveries:
                    self._held[(partition, d.position)] = None
            assert self._queue is not None
            await self._queue.put(deliveries)

    async def _prepare(self, partition: int, entries: list[Any], redelivered: bool) -> tuple[list[Delivery], list[str]]:
        """Decodes and filters a batch, and opens what the key allows (the data keys read in one
        MGET: one partition's keys share a slot). An event whose content does not open under
        keys that exist is passed over (acked, with a group) with one line in the log: it would
        fail the same way on every delivery, and stopping at it would stop everything after it."""
        kept: list[tuple[str, AnyEvent]] = []
        passed_over: list[str] = []
        for entry_id, fields in entries:
            position = entry_id.decode()
            event = self._decode(partition, position, fields)
            if self._wanted(event):
                kept.append((position, event))
            else:
                passed_over.append(position)
        wrapped = await self._data_keys(partition, [e for _, e in kept]) if self._key is not None else {}
        deliveries = []
        for position, event in kept:
            mine = {n: wrapped.get((event.user_id, n)) for n in data_keys_needed(event)}
            try:
                shown, state = reveal(event, self._key, mine.get(event.note_id), mine)
            except UnopenableEvent as e:
                log.error("%s entry %s passed over: %s", channels.event_log(partition), position, e.message)
                passed_over.append(position)
                continue
            deliveries.append(Delivery(self, partition, position, shown, state, redelivered))
        return deliveries, passed_over

    async def _data_keys(self, partition: int, events: list[AnyEvent]) -> dict[tuple[str, str], bytes | None]:
        """The wrapped data keys the events' content opens with, by (user, note): read now, never
        kept, so nothing opens once a forget has destroyed one."""
        notes = list(dict.fromkeys((e.user_id, n) for e in events for n in data_keys_needed(e)))
        if not notes:
            return {}
        found = await self._redis.mget([channels.data_key(partition, u, n) for u, n in notes])
        return dict(zip(notes, found, strict=True))

    def _decode(self, partition: int, position: str, fields: dict[bytes, bytes] | None) -> AnyEvent:
        try:
            return event_decoder.decode((fields or {})[b"e"])
        except (KeyError, msgspec.DecodeError) as e:
            # Skipping it could skip an erasure: stop, and let a subscriber with newer contracts take it.
            raise EngramError(
                ErrorCode.STORAGE_ERROR,
                f"{channels.event_log(partition)} entry {position} is not an event these contracts know ({e}); "
                "nothing after it in this partition is delivered until the subscriber's contracts are upgraded",
            ) from None

    def _wanted(self, event: AnyEvent) -> bool:
        if self.users is not None and event.user_id not in self.users:
            return False
        tag = event.__struct_config__.tag
        return self.kinds is None or tag in self.kinds or tag in ERASURES

    # delivering -----------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self._deliveries()

    async def _deliveries(self) -> AsyncIterator[Delivery]:
        started_here = self._queue is None
        await self.start()
        assert self._queue is not None
        try:
            while True:
                if not self._ready:
                    item = await self._queue.get()
                    if isinstance(item, _Closed):
                        self._queue.put_nowait(item)
                        return
                    if isinstance(item, BaseException):
                        # A partition that cannot go on ends the subscription; a new one resumes
                        # where this one was (the entry that failed is still pending).
                        await self.close()
                        raise item
                    self._ready.extend(item)
                # Taken off the subscription's own list, not the loop's: a loop that stops early
                # leaves the rest of the batch for the next one.
                delivery = self._ready.popleft()
                if self.group is not None:
                    self._held[(delivery.partition, delivery.position)] = time.monotonic()
                yield delivery
        finally:
            if started_here:
                await self.close()

    async def ack(self, *deliveries: Delivery) -> None:
        """Acknowledges several deliveries in one call per partition (cheaper than one by one)."""
        by_partition: dict[int, list[Delivery]] = {}
        for d in deliveries:
            if not d._acked:
                by_partition.setdefault(d.partition, []).append(d)
        for partition, done in by_partition.items():
            if self.group is not None:
                try:
                    await self._redis.xack(channels.event_log(partition), self.group, *(d.position for d in done))
                except _TRANSIENT as e:
                    raise EngramError(
                        ErrorCode.UNAVAILABLE, f"cannot reach the Engram bus at {self._where()} to ack: {e}"
                    ) from None
            for d in done:
                d._acked = True
                self._held.pop((partition, d.position), None)


def _refused(error: ResponseError) -> EngramError:
    if isinstance(error, NoPermissionError):
        return EngramError(
            ErrorCode.PERMISSION_DENIED,
            f"Redis refused the subscription ({error}): its user needs XGROUP CREATE, XREADGROUP, XACK and "
            "XAUTOCLAIM on engram:{*}:log, and GET/MGET on engram:{*}:dek:* to open content",
        )
    return EngramError(ErrorCode.STORAGE_ERROR, f"Redis refused the subscription: {error}")
