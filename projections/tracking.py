"""What every projection of the log shares (after pyeventsourcing's tracking records): its
position is stored with its state in one transaction, so a batch delivered twice, replayed or
applied by two workers at once changes the state once.

``TrackedProjection.apply`` owns the transaction: WATCH the checkpoint, read it with the state
the batch needs in one round trip, skip the entries at or before it, let the projection plan
its writes, then MULTI, the writes and the new checkpoint, EXEC. A projection supplies its
policy: which of its keys a batch reads (``_state_keys``), what the batch changes
(``_plan``, which may first write outside Redis) and how that is written (``_queue``).
``rebuild()`` runs the same ``apply`` from position zero.

A WATCH that fails means another writer moved the projection on (a worker that lost its lease,
a rebuild's switch): nothing is written and ``StaleProjection`` is raised rather than retried,
so the runner reopens from the stored checkpoint and a worker without its lease stops writing.

Readers wait on a caller's token (``CheckpointReader.wait_for``) without polling: the live
history, index and timeline projections announce each checkpoint on ``channels.applied_channel``
in the same transaction, and each process has one subscription to it (``AppliedNotices``) that
wakes the waiters whose position has been reached. A token past the end of its partition's log
names no write, so it is refused at once instead of holding a handler for the whole wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, WatchError

from engram_ledger.contracts import channels
from engram_ledger.contracts.channels import GenerationKeys
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.redis_conn import close_with, subscription_messages, transaction_client
from engram_ledger.services.application.ports import EventStore, LogEntry

log = logging.getLogger("engram.tracking")

# A waiter reads the checkpoint again this often even when no notice came: a notice published
# while the subscription is being re-made is lost, and a rebuild's switch to a fresh generation
# announces nothing. It bounds how late such a waiter wakes, not how soon the others do.
RECHECK_SECONDS = 0.5
# Before subscribing again after the subscription's connection broke (Redis restarting).
RESUBSCRIBE_SECONDS = 0.2

Plan = TypeVar("Plan")


class StaleProjection(Exception):
    """Another writer changed what this one watched: its checkpoint, or the live generation."""


class GenerationChanged(StaleProjection):
    """The live generation is no longer the one this projection writes (a rebuild switched)."""


def position_key(position: str | bytes) -> tuple[int, int]:
    return channels.parse_entry_id(position)


async def read_generation(redis: Redis, live_key: str) -> int:
    """The generation a live pointer names; 0 before any rebuild."""
    raw = await redis.get(live_key)
    return int(raw) if raw is not None else 0


class TrackedProjection(ABC, Generic[Plan]):
    """One partition's projection: its state and its checkpoint, written together."""

    name: ClassVar[str]
    rebuild_batch: ClassVar[int] = 500
    # Whether a live apply announces its checkpoint on ``channels.applied_channel``: only the
    # projections readers wait for need to.
    announces: ClassVar[bool] = False

    def __init__(self, redis: Redis, partition: int, checkpoint_key: str) -> None:
        self._redis = redis
        self.partition = partition
        self._checkpoint_key = checkpoint_key

    async def checkpoint(self) -> str | None:
        raw = await self._redis.get(self._checkpoint_key)
        return raw.decode() if raw is not None else None

    async def apply(self, batch: Sequence[LogEntry], *, live: bool = True) -> None:
        """Apply a batch of log entries, in order, with the checkpoint, in one transaction.
        Entries at or before the checkpoint are skipped: redelivery changes nothing. A rebuild
        passes ``live=False``: its fresh generation is not the live one, and only it writes there."""
        state_keys = self._state_keys(batch)
        guards = self._guards()
        redis = await transaction_client(self._redis, self._checkpoint_key)
        async with redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(self._checkpoint_key, *(guards if live else []))
                # One round trip for everything the batch reads (all keys share the {p} slot).
                checkpoint, *values = await pipe.mget([self._checkpoint_key, *guards, *state_keys])
                if live:
                    self._check(values[: len(guards)])
                done = position_key(checkpoint) if checkpoint else (0, 0)
                batch = [e for e in batch if position_key(e.position) > done]
                if not batch:
                    return
                state = dict(zip(state_keys, values[len(guards) :], strict=True))
                plan = await self._plan(batch, state)
                pipe.multi()
                self._queue(pipe, plan)
                pipe.set(self._checkpoint_key, batch[-1].position)
                if live and self.announces:
                    pipe.publish(applied_channel(redis), f"{self.partition} {batch[-1].position}")
                await pipe.execute()
            except WatchError as e:
                raise StaleProjection() from e

    async def rebuild(
        self, store: EventStore, progress: Callable[[int], None] | None = None, batch_size: int | None = None
    ) -> int:
        """Apply the log from position zero up to its head when called. Returns how many events
        were read."""
        return await rebuild_together([self], store, progress, batch_size or self.rebuild_batch)

    async def repair(self) -> int:
        """What a writer that lost the projection may have left wrong outside its transaction,
        written again (see ``PointsProjection.repair``). A projection that writes only in its
        transaction has nothing to repair."""
        return 0

    def _guards(self) -> list[str]:
        """Keys read and watched with the checkpoint that say whether this writer may write."""
        return []

    def _check(self, guards: Sequence[bytes | None]) -> None:
        """Raise ``StaleProjection`` if the guards' values forbid writing."""

    def _state_keys(self, batch: Sequence[LogEntry]) -> list[str]:
        """The projection's keys the batch reads, once each."""
        return []

    async def _start_over(self) -> None:
        """Clear the state before a rebuild; a fresh generation starts empty."""

    @abstractmethod
    async def _plan(self, batch: Sequence[LogEntry], state: dict[str, bytes | None]) -> Plan:
        """What the unapplied entries change, given the stored values of ``_state_keys``."""

    @abstractmethod
    def _queue(self, pipe: Pipeline, plan: Plan) -> None:
        """Queue the plan's writes in the transaction."""


async def rebuild_together(
    projections: Sequence[TrackedProjection[Any]],
    store: EventStore,
    progress: Callable[[int], None] | None = None,
    batch_size: int = TrackedProjection.rebuild_batch,
) -> int:
    """Rebuild several projections of one partition in one reading of its log, each batch
    applied to each in turn (what one embeds, the next finds in the embedder's cache). Returns
    how many events were read."""
    partition = projections[0].partition
    for projection in projections:
        await projection._start_over()
    head, _ = await store.log_head(partition)
    if head is None:
        for projection in projections:
            await projection._redis.set(projection._checkpoint_key, "0-0")
        return 0
    after, read = "0", 0
    while position_key(after) < position_key(head):
        batch = await store.read_log(partition, after, batch_size)
        if not batch:
            break
        for projection in projections:
            await projection.apply(batch, live=False)
        after = batch[-1].position
        read += len(batch)
        if progress:
            progress(len(batch))
    return read


class GenerationalProjection(TrackedProjection[Plan]):
    """A projection kept under a generation: a rebuild fills a fresh one and switches the live
    pointer, so readers never see a half-built model. A writer of a generation that is no
    longer live stops (``GenerationChanged``)."""

    announces = True

    def __init__(self, redis: Redis, partition: int, generation: int, keys: GenerationKeys) -> None:
        super().__init__(redis, partition, keys.checkpoint)
        self.generation = generation
        self._live_key = keys.live

    def _guards(self) -> list[str]:
        return [self._live_key]

    def _check(self, guards: Sequence[bytes | None]) -> None:
        (live,) = guards
        if int(live or 0) != self.generation:
            raise GenerationChanged()


async def read_position(redis: Redis, checkpoint_key: str) -> tuple[int, int]:
    raw = await redis.get(checkpoint_key)
    return position_key(raw) if raw else (0, 0)


class CheckpointReader(ABC):
    """How far a projection's live generation has got, for callers that wait on a token.

    A reader of Redis keeps its client as ``_redis`` (``HistoryReader``) or overrides
    ``_client`` (``IndexReader``); with it, a wait blocks on the projections' notices and a
    token past the log's head is refused. A reader without one (the in-memory ones of the
    tests) is polled."""

    def __init__(self, known_partitions: int | None = None) -> None:
        # None: any partition may be asked for (the log's head then tells whether it exists).
        self._known_partitions = known_partitions

    @abstractmethod
    async def checkpoint(self, partition: int) -> tuple[int, int]:
        """The position the partition's live generation has applied, (0, 0) before any."""

    def _client(self) -> Redis | None:
        redis = getattr(self, "_redis", None)
        return redis if isinstance(redis, Redis | RedisCluster) else None

    async def wait_for(self, token: str, timeout: float) -> bool:
        """Wait until the live generation has applied the token's position; False when it has
        not within ``timeout``. A token that names no write (of a partition that does not
        exist, or past the end of its partition's log) is ``INVALID_PARAMETER`` at once."""
        partition, position = channels.parse_token(token)
        if self._known_partitions is not None and partition >= self._known_partitions:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER,
                f"token {token} names partition {partition}, and there are only {self._known_partitions} "
                f"(0-{self._known_partitions - 1}); pass the token a write's reply gave",
            )
        if await self.checkpoint(partition) >= position:
            return True
        redis = self._client()
        if redis is None:
            return await self._poll(partition, position, timeout)
        last = await redis.xrevrange(channels.event_log(partition), count=1)
        head = position_key(last[0][0]) if last else None
        if head is None or head < position:
            ends = f"ends at {head[0]}-{head[1]}" if head is not None else "is empty"
            raise EngramError(
                ErrorCode.INVALID_PARAMETER,
                f"token {token} names no write: partition {partition}'s log {ends}; pass the token a write's "
                "reply gave (a token from another store, or made up, is never reached)",
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with applied_notices(redis).watch(partition, position) as announced:
            while await self.checkpoint(partition) < position:
                left = deadline - loop.time()
                if left <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(announced.wait(), min(left, RECHECK_SECONDS))
                announced.clear()
        return True

    async def _poll(self, partition: int, position: tuple[int, int], timeout: float, poll: float = 0.002) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while await self.checkpoint(partition) < position:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(poll)
        return True


class _Watch:
    """One waiter: its partition and position, and the event a notice that reaches it sets."""

    def __init__(self, partition: int, position: tuple[int, int]) -> None:
        self.partition = partition
        self.position = position
        self.reached = asyncio.Event()


class AppliedNotices:
    """The process's one subscription to ``channels.applied_channel`` (per Redis client; see
    ``applied_notices``), shared by every waiter: a notice sets the events of the waiters whose
    position it reaches, and they read their checkpoint again. It is made on the first wait and
    ended by ``close_redis``."""

    def __init__(self, redis: Redis) -> None:
        # Weak: the registry is keyed by the client, which this must not keep alive.
        self._redis = weakref.ref(redis)
        self._channel = applied_channel(redis)
        self._watches: set[_Watch] = set()
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    @contextlib.asynccontextmanager
    async def watch(self, partition: int, position: tuple[int, int]) -> AsyncIterator[asyncio.Event]:
        """An event set when a notice reaches ``position`` in ``partition``; on entering, the
        subscription is in place, so a notice sent after the caller reads its checkpoint is not
        missed (a wait for it is bounded: the caller also reads again every RECHECK_SECONDS)."""
        watch = _Watch(partition, position)
        self._watches.add(watch)
        try:
            if self._listener is None or self._listener.done():
                self._listener = asyncio.create_task(self._listen(), name="engram-applied-notices")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._subscribed.wait(), RECHECK_SECONDS)
            yield watch.reached
        finally:
            self._watches.discard(watch)

    async def _listen(self) -> None:
        while (redis := self._redis()) is not None:
            pubsub = redis.pubsub()
            del redis
            try:
                await pubsub.subscribe(self._channel)
                async for message in subscription_messages(pubsub):
                    if message.get("type") == "subscribe":
                        self._subscribed.set()
                    elif message.get("type") == "message":
                        self._deliver(message["data"])
            except (RedisError, OSError) as e:
                log.debug("the subscription to %s broke (%r); subscribing again", self._channel, e)
            except Exception:
                # Waiters still read their checkpoints every RECHECK_SECONDS: slower, not stuck.
                log.exception("reading %s failed; subscribing again", self._channel)
            finally:
                self._subscribed.clear()
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(RESUBSCRIBE_SECONDS)

    def _deliver(self, data: bytes) -> None:
        try:
            partition, position = data.decode().split(" ")
            p, reached = int(partition), position_key(position)
        except ValueError:
            return  # not a notice of ours: the channel is open to anyone who may publish
        for watch in self._watches:
            if watch.partition == p and watch.position <= reached:
                watch.reached.set()

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None


def applied_channel(redis: Redis) -> str:
    """The notices' channel of the database ``redis`` works in (a cluster has only database 0)."""
    if isinstance(redis, RedisCluster):
        return channels.applied_channel(0)
    return channels.applied_channel(int(redis.connection_pool.connection_kwargs.get("db") or 0))


_notices: weakref.WeakKeyDictionary[Redis, AppliedNotices] = weakref.WeakKeyDictionary()


def applied_notices(redis: Redis) -> AppliedNotices:
    """The one ``AppliedNotices`` of a Redis client, made on first use."""
    notices = _notices.get(redis)
    if notices is None:
        notices = _notices[redis] = AppliedNotices(redis)
        close_with(redis, notices.close)
    return notices
