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
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TypeVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from engram_ledger.contracts.channels import IndexKeys, TimelineKeys, model_key
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.projections.index import PointsProjection, live_index_generation
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
        self._past_reader = IndexReader(self, TimelineKeys)
        self.purge_seconds = purge_seconds
        self.purged_at: float | None = None
        # Set once a live generation is open (``wait_opened``); made in the loop that waits.
        self._opened: asyncio.Event | None = None
        # Wakes the purge (set while it runs): a delete left points in the files.
        self._wake: Callable[[], None] | None = None

    def subject_key(self, user_id: str, subject: str) -> str:
        return self.subjects.match_key(user_id, subject)

    async def wait_for(self, token: str, timeout: float) -> bool:
        return await self._reader.wait_for(token, timeout)

    async def wait_for_past(self, token: str, timeout: float) -> bool:
        """Until the timeline has applied the write ``token`` names (a search of the past ranks
        its points): its own projection, which may be behind the live index or ahead of it."""
        return await self._past_reader.wait_for(token, timeout)

    @property
    def index(self) -> VectorIndex:
        if self._index is None:
            raise self.error or RuntimeError("the vector index is not open yet")
        return self._index

    @property
    def opened(self) -> bool:
        return self._index is not None

    async def wait_opened(self) -> None:
        """Until the live index is open; ``EMBEDDING_ERROR`` at once while it is refused (built
        with another model: waiting would not open it)."""
        if self._opened is None:
            self._opened = asyncio.Event()
        while self._index is None:
            if isinstance(self.error, ModelMismatch):
                raise EngramError(ErrorCode.EMBEDDING_ERROR, f"cannot search right now: {self.error}")
            await self._opened.wait()
            self._opened.clear()

    @property
    def timeline(self) -> VectorIndex | None:
        """The live generation's timeline index, once open (None where none is kept)."""
        return self._timeline if self._index is not None else None

    def index_of(self, projection: str) -> VectorIndex | None:
        """The open index the projection ``projection`` writes: the live one (``index``) or its
        ``timeline``."""
        return self.timeline if projection == "timeline" else self.index

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
                if self._opened is not None:
                    self._opened.set()  # the waiters learn it is refused
                raise
            index = self.open_index(generation)
            await index.ensure(self.embedder.dimension)
            timeline = self.open_timeline(generation) if self.open_timeline is not None else None
            if timeline is not None:
                await timeline.ensure(self.embedder.dimension)
            previous = self._index
            previous_timeline = self._timeline
            self._index, self._timeline, self.generation, self.error = index, timeline, generation, None
            for opened in self._open_indexes():
                opened.on_owed = self._wake
            if self._opened is not None:
                self._opened.set()
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

    def files_state(self) -> dict[str, str | float | None] | None:
        """What ``engram health`` says of deleted points in this process's index files (None
        where the files are a server's own): since when a removal is owed, when the last rewrite
        was made (times in ISO 8601, UTC), and the bound in seconds."""
        if not self._open_indexes():
            return None
        owed = self.purge_owed_since()
        return {
            "owed_since": iso_time(owed) if owed is not None else None,
            "rewritten_at": iso_time(self.purged_at) if self.purged_at is not None else None,
            "bound_seconds": self.purge_seconds,
        }

    def _open_indexes(self) -> list[VectorIndex]:
        return [i for i in (self._index, self._timeline) if i is not None and i.compacts_files]

    async def purge(self, stop: asyncio.Event, on_change: Callable[[], Awaitable[None]] | None = None) -> None:
        """Rewrite the indexes' files without their deleted points: at once after a first
        delete, then at most every ``purge_seconds`` while deletes keep coming, so a forgotten
        note's vectors leave the disk within that bound (plus the rewrite itself). A delete wakes
        it (``VectorIndex.on_owed``); it also looks every second. ``on_change``: told when a
        removal becomes owed and when one is made (the worker's report for `engram health`)."""
        self._owed_signal = asyncio.Event()
        loop = asyncio.get_running_loop()
        signal = self._owed_signal

        def wake() -> None:
            loop.call_soon_threadsafe(signal.set)

        self._wake = wake
        for index in self._open_indexes():
            index.on_owed = self._wake
        owed_before: float | None = None
        while not stop.is_set():
            try:
                owed, purged = await self._purge_if_due()
                changed = purged or (owed is not None) != (owed_before is not None)
                owed_before = owed
                if changed and on_change is not None:
                    await on_change()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("removing deleted points from the index's files failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._owed_signal.wait(), min(1.0, max(self.purge_seconds, 0.05)))
            self._owed_signal.clear()

    async def _purge_if_due(self) -> tuple[float | None, bool]:
        """(when the oldest removal still owed was made, whether a rewrite was made now)."""
        async with self._lock:  # not while a switch of generation closes the indexes
            owed = self.purge_owed_since()
            if owed is None or (self.purged_at is not None and time.time() - self.purged_at < self.purge_seconds):
                return owed, False
            started = time.monotonic()
            for index in self._open_indexes():
                await index.compact()
            self.purged_at = time.time()
            log.info("index files rewritten without deleted points in %.2f s", time.monotonic() - started)
            return self.purge_owed_since(), True

    async def close(self) -> None:
        if self._timeline is not None:
            await self._timeline.close()
            self._timeline = None
        if self._index is not None:
            await self._index.close()
            self._index = None


class IndexReader(CheckpointReader):
    """How far the live generation of the index (or, with ``keys=TimelineKeys``, of its timeline)
    has got."""

    def __init__(self, runtime: IndexRuntime, keys: Callable[[int, int], IndexKeys] = IndexKeys) -> None:
        super().__init__()
        self.runtime = runtime
        self._keys = keys

    async def checkpoint(self, partition: int) -> tuple[int, int]:
        redis = self.runtime.redis
        keys = self._keys(partition, await live_index_generation(redis, partition))
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


def iso_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


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


P = TypeVar("P", bound=PointsProjection)


def live_projection(
    kind: type[P], redis: Redis, store: EventStore, runtime: IndexRuntime, partition: int
) -> Callable[[], Awaitable[P]]:
    """Opens the projection ``kind`` (``IndexProjection``, or ``TimelineProjection`` where the
    runtime keeps a timeline) of the partition's live generation, for its runner, after
    following a switch of generation."""

    async def open_live() -> P:
        await runtime.sync()
        index = runtime.index_of(kind.name)
        if index is None:
            raise RuntimeError(f"this index keeps no {kind.name}")
        return kind(
            redis, index, runtime.embedder, partition, runtime.generation, store=store, subjects=runtime.subjects
        )

    return open_live
