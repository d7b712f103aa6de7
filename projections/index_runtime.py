"""The process's live vector index: opens the generation ``engram:{p}:idx:live`` names, checks
that it was built with the configured embedding model, and follows a rebuild's switch to a new
generation (opening the new one before closing the old, so queries never stop)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from engram_ledger.contracts.channels import IndexKeys, model_key
from engram_ledger.projections.index import IndexProjection, live_index_generation
from engram_ledger.projections.qdrant_edge import drop_shard
from engram_ledger.projections.tracking import CheckpointReader, read_position
from engram_ledger.services.adapters.crypto import SubjectMatcher
from engram_ledger.services.application.ports import EventStore
from engram_ledger.services.application.vector_index import Embedder, VectorIndex
from engram_ledger.services.common.periodic import every

log = logging.getLogger("engram.index")

ModelState = Literal["loading", "loaded", "failed"]
IndexState = Literal["opening", "open", "refused"]


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
    """The live index and what its writers and readers must agree on: the embedding model, and
    ``subjects``, how a subject becomes the ``subject_key`` its points are filtered by. Searching
    sees it through the application's ``SearchableIndex`` port."""

    def __init__(
        self,
        redis: Redis,
        embedder: Embedder,
        open_index: Callable[[int], VectorIndex],
        drop_before: Callable[[int], None] | None = None,
        *,
        subjects: SubjectMatcher,
        open_timeline: Callable[[int], VectorIndex] | None = None,
        purge_seconds: float = 60.0,
    ) -> None:
        """``open_timeline``: a generation's timeline index, every version of every note for
        searches of the past (None: this deployment keeps none). ``purge_seconds``: how soon
        after a delete the index's files no longer hold what was deleted (``purge``)."""
        self.redis = redis
        self.embedder = embedder
        self.subjects = subjects
        self.open_index = open_index
        self.open_timeline = open_timeline
        self._drop_index = drop_before
        self.generation = -1
        self._index: VectorIndex | None = None
        self._timeline: VectorIndex | None = None
        self.error: Exception | None = None
        self._lock = asyncio.Lock()
        # What `engram health` reports for this process (services/observability/health.py).
        self.model_state: ModelState = "loading"
        self.model_load_seconds: float | None = None
        self._reader = IndexReader(self)
        self.purge_seconds = purge_seconds
        self.purged_at: float | None = None

    def subject_key(self, user_id: str, subject: str) -> str:
        return self.subjects.match_key(user_id, subject)

    async def wait_for(self, token: str, timeout: float) -> bool:
        return await self._reader.wait_for(token, timeout)

    @property
    def index(self) -> VectorIndex:
        if self._index is None:
            raise self.error or RuntimeError("the vector index is not open yet")
        return self._index

    @property
    def timeline(self) -> VectorIndex | None:
        """The live generation's timeline index, once open (None where none is kept)."""
        return self._timeline if self._index is not None else None

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
            timeline = self.open_timeline(generation) if self.open_timeline is not None else None
            if timeline is not None:
                await timeline.ensure(self.embedder.dimension)
            previous = self._index
            previous_timeline = self._timeline
            self._index, self._timeline, self.generation, self.error = index, timeline, generation, None
            log.info("vector index generation %d is live", generation)
            if previous_timeline is not None:
                await previous_timeline.close()
            if previous is not None:
                await previous.close()
            if self._drop_index is not None:
                # Every generation before the live one: the one just replaced, and any a process
                # that stopped before it dropped its own left behind.
                self._drop_index(generation)

    async def load_model(self, stop: asyncio.Event, retry_seconds: float = 10.0) -> None:
        """Load the embedding model in the background and say when it is ready: commands and
        reads are served meanwhile, and the first embedding waits for this load. A failed load
        (a model file missing or unreadable) is logged and tried again."""
        started = time.monotonic()
        while not stop.is_set():
            try:
                await self.embedder.start()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.model_state = "failed"
                log.exception("the embedding model %s failed to load; trying again", self.embedder.model_name)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), retry_seconds)
                continue
            self.model_load_seconds = round(time.monotonic() - started, 1)
            self.model_state = "loaded"
            log.info(
                "embedding model %s loaded in %.1f s: search, save advice and the index are ready",
                self.embedder.model_name,
                self.model_load_seconds,
            )
            return

    @property
    def index_state(self) -> IndexState:
        """``open`` once the live generation is open here, ``refused`` while it was built with
        another model, else ``opening``."""
        if self._index is not None:
            return "open"
        return "refused" if isinstance(self.error, ModelMismatch) else "opening"

    async def watch(self, stop: asyncio.Event, interval: float = 1.0) -> None:
        """Follow generation switches and model changes; a failed check is logged, not hidden."""
        await every(interval, stop, self.sync, "index generation check", log)

    def purge_owed_since(self) -> float | None:
        """When the oldest delete still held in the open indexes' files was made; None if none."""
        owed = [i.owed_since() for i in self._open_indexes()]
        return min((t for t in owed if t is not None), default=None)

    def files_state(self) -> dict[str, float | None] | None:
        """What ``engram health`` says of deleted points in this process's index files (None
        where the files are a server's own): since when a removal is owed, when the last rewrite
        was made, and the bound."""
        if not self._open_indexes():
            return None
        return {"owed_since": self.purge_owed_since(), "purged_at": self.purged_at, "bound_seconds": self.purge_seconds}

    def _open_indexes(self) -> list[VectorIndex]:
        return [i for i in (self._index, self._timeline) if i is not None and i.compacts_files]

    async def purge(self, stop: asyncio.Event, on_change: Callable[[], Awaitable[None]] | None = None) -> None:
        """Rewrite the indexes' files without their deleted points: at once after a first
        delete, then at most every ``purge_seconds`` while deletes keep coming, so a forgotten
        note's vectors leave the disk within that bound (plus the rewrite itself).
        ``on_change``: told when a removal becomes owed and when one is made (the worker's
        report for `engram health`)."""
        check = min(1.0, max(self.purge_seconds / 4, 0.05))
        owed_before: float | None = None

        async def maybe() -> None:
            nonlocal owed_before
            async with self._lock:  # not while a switch of generation closes them
                owed = self.purge_owed_since()
                due = owed is not None and (
                    self.purged_at is None or time.time() - self.purged_at >= self.purge_seconds
                )
                if due:
                    started = time.monotonic()
                    for index in self._open_indexes():
                        await index.compact()
                    self.purged_at = time.time()
                    log.info("index files rewritten without deleted points in %.2f s", time.monotonic() - started)
                    owed = self.purge_owed_since()
            changed, owed_before = due or (owed is not None) != (owed_before is not None), owed
            if changed and on_change is not None:
                await on_change()

        await every(check, stop, maybe, "removing deleted points from the index's files", log)

    async def close(self) -> None:
        if self._timeline is not None:
            await self._timeline.close()
            self._timeline = None
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

    def _client(self) -> Redis | None:
        redis = self.runtime.redis
        # The tests' in-memory runtime keeps its keys in a dict: that reader is polled.
        return redis if isinstance(redis, Redis | RedisCluster) else None


async def switch_generation(redis: Redis, partitions: int, generation: int) -> None:
    """Point every partition at a new generation (queries and projections follow)."""
    async with redis.pipeline(transaction=False) as pipe:
        for p in range(partitions):
            pipe.set(IndexKeys(p, 0).live, generation)
        await pipe.execute()


def edge_directory(data_dir: Path, generation: int) -> Path:
    return data_dir / "index" / f"g{generation}"


def timeline_directory(data_dir: Path, generation: int) -> Path:
    return data_dir / "index" / f"g{generation}-timeline"


def drop_edge_generations(data_dir: Path) -> Callable[[int], None]:
    """Removes the shard directories of every generation before a given one (what a compaction
    left beside them too)."""

    def drop_before(live: int) -> None:
        root = data_dir / "index"
        found = {int(m.group(1)) for p in root.glob("g*") if (m := re.match(r"g(\d+)", p.name))}
        for generation in sorted(g for g in found if g < live):
            drop_shard(edge_directory(data_dir, generation))
            drop_shard(timeline_directory(data_dir, generation))

    return drop_before


def live_index(
    redis: Redis, store: EventStore, runtime: IndexRuntime, partition: int
) -> Callable[[], Awaitable[IndexProjection]]:
    """Opens the index projection of the partition's live generation (for its runner), after
    following a switch of generation."""

    async def open_live() -> IndexProjection:
        await runtime.sync()
        return IndexProjection(
            redis,
            runtime.index,
            runtime.embedder,
            partition,
            runtime.generation,
            store=store,
            subjects=runtime.subjects,
            timeline=runtime.timeline,
        )

    return open_live
