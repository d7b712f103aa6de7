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
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar, Generic, TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from contracts import channels
from contracts.channels import GenerationKeys
from services.adapters.redis_conn import transaction_client
from services.application.ports import EventStore, LogEntry

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
                await pipe.execute()
            except WatchError as e:
                raise StaleProjection() from e

    async def rebuild(
        self, store: EventStore, progress: Callable[[int], None] | None = None, batch_size: int | None = None
    ) -> int:
        """Apply the log from position zero up to its head when called. Returns how many events
        were read."""
        await self._start_over()
        head, _ = await store.log_head(self.partition)
        if head is None:
            await self._redis.set(self._checkpoint_key, "0-0")
            return 0
        after, read = "0", 0
        while position_key(after) < position_key(head):
            batch = await store.read_log(self.partition, after, batch_size or self.rebuild_batch)
            if not batch:
                break
            await self.apply(batch, live=False)
            after = batch[-1].position
            read += len(batch)
            if progress:
                progress(len(batch))
        return read

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


class GenerationalProjection(TrackedProjection[Plan]):
    """A projection kept under a generation: a rebuild fills a fresh one and switches the live
    pointer, so readers never see a half-built model. A writer of a generation that is no
    longer live stops (``GenerationChanged``)."""

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
    """How far a projection's live generation has got, for callers that wait on a token."""

    def __init__(self, known_partitions: int | None = None) -> None:
        # None: any partition may be asked for (a token of an unknown one waits its timeout out).
        self._known_partitions = known_partitions

    @abstractmethod
    async def checkpoint(self, partition: int) -> tuple[int, int]:
        """The position the partition's live generation has applied, (0, 0) before any."""

    async def wait_for(self, token: str, timeout: float, poll: float = 0.002) -> bool:
        """Wait until the live generation has applied the token's position."""
        partition, position = channels.parse_token(token)
        if self._known_partitions is not None and partition >= self._known_partitions:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while await self.checkpoint(partition) < position:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(poll)
        return True
