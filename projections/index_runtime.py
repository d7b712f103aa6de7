"""The process's live vector index: opens the generation ``engram:{p}:idx:live`` names, checks
that it was built with the configured embedding model, and follows a rebuild's switch to a new
generation (opening the new one before closing the old, so queries never stop)."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from redis.asyncio import Redis

from contracts.channels import IndexKeys, model_key
from projections.index import live_index_generation
from projections.tracking import CheckpointReader, read_position
from projections.vector_index import VectorIndex
from services.adapters.embedder import Embedder
from services.ops.periodic import every

log = logging.getLogger("engram.index")


class ModelMismatch(RuntimeError):
    """The live index was built with another embedding model than the one configured."""


async def record_model(redis: Redis, generation: int, embedder: Embedder) -> None:
    """Record which model a generation is built with; refuse if it was built with another one."""
    record = json.dumps({"model": embedder.model_name, "dimension": embedder.dimension})
    await redis.set(model_key(generation), record, nx=True)
    stored = json.loads(await redis.get(model_key(generation)))
    if (stored["model"], stored["dimension"]) != (embedder.model_name, embedder.dimension):
        raise ModelMismatch(
            f"the live index (generation {generation}) was built with {stored['model']} "
            f"({stored['dimension']} dimensions), but {embedder.model_name} ({embedder.dimension}) is configured: "
            "run `engram rebuild index` to re-embed "
            "into a new generation; searches are refused until then"
        )


class IndexRuntime:
    def __init__(
        self,
        redis: Redis,
        embedder: Embedder,
        open_index: Callable[[int], VectorIndex],
        drop_index: Callable[[int], None] | None = None,
    ) -> None:
        self.redis = redis
        self.embedder = embedder
        self.open_index = open_index
        self._drop_index = drop_index
        self.generation = -1
        self._index: VectorIndex | None = None
        self.error: Exception | None = None
        self._lock = asyncio.Lock()

    @property
    def index(self) -> VectorIndex:
        if self._index is None:
            raise self.error or RuntimeError("the vector index is not open yet")
        return self._index

    async def sync(self) -> None:
        """Open the live generation if it is not the one open now."""
        async with self._lock:
            generation = await live_index_generation(self.redis, 0)
            if generation == self.generation and self._index is not None:
                return
            try:
                await record_model(self.redis, generation, self.embedder)
            except ModelMismatch as e:
                self.error = e
                raise
            index = self.open_index(generation)
            await index.ensure(self.embedder.dimension)
            previous, previous_generation = self._index, self.generation
            self._index, self.generation, self.error = index, generation, None
            log.info("vector index generation %d is live", generation)
            if previous is not None:
                await previous.close()
                if self._drop_index is not None:
                    self._drop_index(previous_generation)

    async def watch(self, stop: asyncio.Event, interval: float = 1.0) -> None:
        """Follow generation switches and model changes; a failed check is logged, not hidden."""
        await every(interval, stop, self.sync, "index generation check", log)

    async def close(self) -> None:
        if self._index is not None:
            await self._index.close()
            self._index = None


class IndexReader(CheckpointReader):
    def __init__(self, runtime: IndexRuntime) -> None:
        super().__init__()
        self.runtime = runtime

    async def checkpoint(self, partition: int) -> tuple[int, int]:
        redis = self.runtime.redis
        keys = IndexKeys(partition, await live_index_generation(redis, partition))
        return await read_position(redis, keys.checkpoint)


async def switch_generation(redis: Redis, partitions: int, generation: int) -> None:
    """Point every partition at a new generation (queries and projections follow)."""
    async with redis.pipeline(transaction=False) as pipe:
        for p in range(partitions):
            pipe.set(IndexKeys(p, 0).live, generation)
        await pipe.execute()


def edge_directory(data_dir: Path, generation: int) -> Path:
    return data_dir / "index" / f"g{generation}"


def drop_edge_directory(data_dir: Path) -> Callable[[int], None]:
    def drop(generation: int) -> None:
        shutil.rmtree(edge_directory(data_dir, generation), ignore_errors=True)

    return drop
