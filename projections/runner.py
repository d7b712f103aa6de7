"""Catch-up subscription: follows one partition's log from a projection's own checkpoint, in
strict order, and applies batches. A lease lets several workers run it while only one applies;
the projection's WATCH on its checkpoint keeps a worker that lost its lease from writing anyway."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from redis.asyncio import Redis

from engram_ledger.contracts.channels import HistoryKeys, IndexKeys, SagaKeys, TimelineKeys
from engram_ledger.projections.tracking import StaleProjection
from engram_ledger.services.application.ports import EventStore, LogEntry

log = logging.getLogger("engram.projections")

_HOLD_LEASE = """
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not owner then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""


class Projection(Protocol):
    async def checkpoint(self) -> str | None: ...

    async def apply(self, batch: Sequence[LogEntry]) -> None:
        """Raises StaleProjection when another writer moved it on (GenerationChanged: it is no
        longer the live generation); the runner then reopens it from its checkpoint."""

    async def repair(self) -> int:
        """Write again what a writer that lost the lease reported it may have overwritten
        (outside Redis, as the index's points); how many. Run by the lease holder, after
        each batch or wait."""


class ProjectionRunner:
    def __init__(
        self,
        redis: Redis,
        store: EventStore,
        partition: int,
        owner: str,
        *,
        name: str,
        lease_key: str,
        open_live: Callable[[], Awaitable[Projection]],
        batch_size: int = 256,
        block_ms: int = 500,
        lease_ms: int = 10_000,
    ) -> None:
        self._redis = redis
        self._store = store
        self.partition = partition
        self.name = name
        self._owner = owner
        self._open_live = open_live
        self._batch = batch_size
        self._block_ms = block_ms
        self._lease_ms = lease_ms
        self._lease = redis.register_script(_HOLD_LEASE)
        self._lease_key = lease_key

    async def run(self, stop: asyncio.Event) -> None:
        projection: Projection | None = None
        after = "0"
        while not stop.is_set():
            try:
                if not await self._lease(keys=[self._lease_key], args=[self._owner, self._lease_ms]):
                    projection = None
                    await asyncio.sleep(self._lease_ms / 3000)
                    continue
                if projection is None:
                    projection = await self._open_live()
                    after = await projection.checkpoint() or "0"
                batch = await self._store.read_log(self.partition, after, self._batch, self._block_ms)
                if batch:
                    await projection.apply(batch)
                    after = batch[-1].position
                await projection.repair()
            except StaleProjection:
                projection = None
            except asyncio.CancelledError:
                raise
            except Exception:
                # Redis restarting, a network blip: keep the loop alive and pick up from the checkpoint.
                log.exception("%s projection of partition %d failed; retrying", self.name, self.partition)
                projection = None
                await asyncio.sleep(0.5)

    async def release(self) -> None:
        owner = await self._redis.get(self._lease_key)
        if owner is not None and owner.decode() == self._owner:
            await self._redis.delete(self._lease_key)


# Each projection's lease key, by its name: the one a worker must hold to apply its batches.
LEASES: dict[str, Callable[[int], str]] = {
    "history": lambda p: HistoryKeys(p, 0).lease,
    "index": lambda p: IndexKeys(p, 0).lease,
    "timeline": lambda p: TimelineKeys(p, 0).lease,
    "forget-saga": lambda p: SagaKeys(p).lease,
}


def projection_runner(
    name: str,
    open_live: Callable[[], Awaitable[Projection]],
    redis: Redis,
    store: EventStore,
    partition: int,
    owner: str,
    lease_ms: int,
) -> ProjectionRunner:
    """The runner of one partition of the projection ``name`` (a key of ``LEASES``);
    ``open_live`` opens the projection of the live generation, again after a switch."""
    return ProjectionRunner(
        redis,
        store,
        partition,
        owner,
        name=name,
        lease_key=LEASES[name](partition),
        open_live=open_live,
        lease_ms=lease_ms,
    )
