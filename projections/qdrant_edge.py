"""``QdrantEdgeIndex``: the Qdrant engine in-process (``qdrant-edge-py``), one shard directory
under the data dir. Calls are synchronous and short; they run in a worker thread so the event
loop keeps serving. One process owns a shard directory (the embedded deployment); several
workers use the Qdrant server adapter instead.

Deleting a point does not erase it from the shard's files: its vectors, payload and id stay in
the segment's pages and in the write-ahead log, even after Qdrant's own optimizer has run. So a
delete leaves a mark beside the shard (``<dir>.owed``, with when the first delete it owes was
made), and ``compact`` pays it: the live points are copied into a fresh shard (``<dir>.next``),
which replaces the old one, whose files are then removed. Reads go on from the old shard while
the copy is made; writes wait for it. A crash at any step leaves either the old shard (and the
mark, so the compaction runs again) or the new one; ``_recover`` tidies what the step left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from qdrant_edge import (
    CountRequest,
    Distance,
    EdgeConfig,
    EdgeShard,
    EdgeSparseVectorParams,
    EdgeVectorParams,
    FieldCondition,
    Filter,
    IdfParams,
    MatchAny,
    MatchValue,
    Modifier,
    PayloadSchemaType,
    PayloadSelector,
    Point,
    Query,
    QueryBatchRequest,
    QueryRequest,
    RangeFloat,
    ScrollRequest,
    SearchParams,
    SparseVector,
    UpdateOperation,
)

from engram_ledger.projections.qdrant_filter import Condition, conditions
from engram_ledger.services.application.vector_index import (
    DENSE,
    FLOAT_FIELDS,
    INTEGER_FIELDS,
    KEYWORD_FIELDS,
    SPARSE,
    IndexHit,
    IndexPoint,
    NearestQuery,
    Ranges,
)
from engram_ledger.services.common.stages import profiling, record


def _filter(where: list[Condition]) -> Filter:
    """``qdrant_filter.conditions`` in this client's types."""
    return Filter(must=[_condition(c) for c in where])


def _condition(c: Condition) -> Any:
    if c.is_range:
        return FieldCondition(key=c.key, range=RangeFloat(gte=c.gte, lte=c.lte))
    if c.values is not None:
        return FieldCondition(key=c.key, match=MatchAny(c.values))
    assert c.value is not None
    return FieldCondition(key=c.key, match=MatchValue(c.value))


def _request(query: NearestQuery) -> QueryRequest:
    if query.using == SPARSE:
        assert query.sparse is not None
        vector: Any = SparseVector(query.sparse.indices, query.sparse.values)
        # BM25's term statistics over the user's own points alone (those that held then, for a
        # search of the past): no score depends on another user's notes, present or deleted.
        params = SearchParams(idf=IdfParams(corpus=_filter(conditions(query.user_id, {}, ranges=query.ranges))))
    else:
        vector = query.dense
        # Exact: an approximate (graph) search's misses would depend on the other users' points.
        params = SearchParams(exact=True)
    return QueryRequest(
        limit=query.limit,
        query=Query.Nearest(vector, using=query.using),
        filter=_filter(conditions(query.user_id, query.match, window=query.window, ranges=query.ranges)),
        score_threshold=query.threshold,
        with_payload=PayloadSelector.Include(query.fields) if query.fields is not None else True,
        params=params,
    )


def _config(dimension: int) -> EdgeConfig:
    return EdgeConfig(
        vectors={DENSE: EdgeVectorParams(size=dimension, distance=Distance.Cosine)},
        sparse_vectors={SPARSE: EdgeSparseVectorParams(modifier=Modifier.Idf)},
    )


def _create(directory: Path, dimension: int) -> EdgeShard:
    shard = EdgeShard.create(str(directory), _config(dimension))
    _index_fields(shard)
    return shard


def _index_fields(shard: EdgeShard) -> None:
    existing = shard.info().payload_schema
    for names, kind in (
        (KEYWORD_FIELDS, PayloadSchemaType.Keyword),
        (INTEGER_FIELDS, PayloadSchemaType.Integer),
        (FLOAT_FIELDS, PayloadSchemaType.Float),
    ):
        for name in names:
            if name not in existing:
                shard.update(UpdateOperation.create_field_index(name, kind))


def _sibling(directory: Path, suffix: str) -> Path:
    return directory.with_name(directory.name + suffix)


def _write_durably(path: Path, text: str) -> None:
    """``text`` in ``path``, on disk before this returns (a crash keeps it or the file before)."""
    partial = _sibling(path, ".partial")
    with open(partial, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class QdrantEdgeIndex:
    # Its files are on this machine: ``compact`` removes deleted points from them.
    compacts_files = True
    # Points copied per step of a compaction (each a scroll of the old shard and an upsert).
    COPY_BATCH = 1_000

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._shard: EdgeShard | None = None
        self._dimension = 0
        # One thread: the shard is used from one place at a time, in order.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qdrant-edge")
        # Writes and a compaction exclude each other: a write made during the copy would be
        # lost with the old shard.
        self._writing = asyncio.Lock()
        self._owed_path = _sibling(directory, ".owed")
        self._next = _sibling(directory, ".next")
        self._old = _sibling(directory, ".old")
        self.compacted_at: float | None = None
        # Called (from the shard's thread) when a delete first leaves points in the files.
        self.on_owed: Callable[[], None] | None = None

    async def _run(self, fn, *args):  # type: ignore[no-untyped-def]
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @property
    def shard(self) -> EdgeShard:
        if self._shard is None:
            raise RuntimeError("the index is not open: call ensure() first")
        return self._shard

    async def ensure(self, dimension: int) -> None:
        if self._shard is not None:
            return
        self._dimension = dimension
        self._shard = await self._run(self._open, dimension)

    def _open(self, dimension: int) -> EdgeShard:
        self._recover()
        self.directory.mkdir(parents=True, exist_ok=True)
        if not any(self.directory.iterdir()):
            return _create(self.directory, dimension)
        shard = EdgeShard.load(str(self.directory), _config(dimension))
        _index_fields(shard)
        return shard

    def _recover(self) -> None:
        """Finish or undo a compaction a crash cut short: the shard at ``directory`` is whole
        whenever it exists (the new one is moved there only once complete)."""
        if self._next.exists():
            if self.directory.exists():
                shutil.rmtree(self._next)  # a copy not finished: the mark still owes it
            else:
                os.replace(self._next, self.directory)  # cut between the two moves
        if self._old.exists():
            shutil.rmtree(self._old)

    async def upsert(self, points: list[IndexPoint]) -> None:
        if not points:
            return
        edge_points = [
            Point(
                id=p.id,
                vector={DENSE: p.dense, SPARSE: SparseVector(p.sparse.indices, p.sparse.values)},
                payload=p.payload,
            )
            for p in points
        ]
        async with self._writing:
            await self._run(self.shard.update, UpdateOperation.upsert_points(edge_points))

    async def delete(self, user_id: str, note_id: str, from_chunk: int = 0) -> None:
        async with self._writing:
            await self._run(self._delete, _filter(conditions(user_id, {}, note_id, from_chunk)))

    def _delete(self, where: Filter) -> None:
        if not self.shard.count(CountRequest(filter=where, exact=True)):
            return  # nothing there: no file to rewrite
        # The mark first: a crash after the delete still owes its compaction.
        first = not self._owed_path.exists()
        if first:
            _write_durably(self._owed_path, repr(time.time()))
        self.shard.update(UpdateOperation.delete_points_by_filter(where))
        if first and self.on_owed is not None:
            self.on_owed()

    def owed_since(self) -> float | None:
        """When the oldest delete not yet compacted away was made (seconds since the epoch);
        None when no file holds a deleted point."""
        try:
            return float(self._owed_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    async def compact(self) -> bool:
        """Rewrite the shard without what was deleted, if anything was; whether it did."""
        async with self._writing:
            if self._shard is None or self.owed_since() is None:
                return False
            # The copy reads the old shard from another thread: searches go on meanwhile.
            await asyncio.to_thread(self._copy_live_points)
            await self._run(self._swap)
            self.compacted_at = time.time()
            return True

    def _copy_live_points(self) -> None:
        if self._next.exists():
            shutil.rmtree(self._next)
        fresh = _create(self._next, self._dimension)
        offset = None
        while True:
            records, offset = self.shard.scroll(
                ScrollRequest(offset=offset, limit=self.COPY_BATCH, with_payload=True, with_vector=True)
            )
            if records:
                points = [Point(id=r.id, vector=r.vector, payload=r.payload) for r in records if r.vector is not None]
                fresh.update(UpdateOperation.upsert_points(points))
            if offset is None:
                break
        fresh.flush()
        fresh.close()
        _sync_directory(self._next.parent)

    def _swap(self) -> None:
        """The fresh shard in place of the old one, whose files then go, and the mark with them."""
        old = self.shard
        old.close()
        self._shard = None
        os.replace(self.directory, self._old)
        os.replace(self._next, self.directory)
        _sync_directory(self.directory.parent)
        self._shard = EdgeShard.load(str(self.directory), _config(self._dimension))
        shutil.rmtree(self._old)
        self._owed_path.unlink(missing_ok=True)
        _sync_directory(self.directory.parent)

    async def set_payload(
        self, user_id: str, note_id: str, fields: dict[str, Any], ranges: Ranges | None = None
    ) -> None:
        where = _filter(conditions(user_id, {}, note_id, ranges=ranges))
        operation = UpdateOperation.set_payload_by_filter(where, fields)
        async with self._writing:
            await self._run(self.shard.update, operation)

    async def nearest(self, query: NearestQuery) -> list[IndexHit]:
        (hits,) = await self.nearest_many([query])
        return hits

    async def nearest_many(self, queries: list[NearestQuery]) -> list[list[IndexHit]]:
        # A BM25 query of stop words only has no terms: nothing to match, nothing to ask.
        asked = [
            (i, _request(q)) for i, q in enumerate(queries) if q.using != SPARSE or (q.sparse and q.sparse.indices)
        ]
        requests = [r for _, r in asked]
        if not requests:
            found: list[Any] = []
        elif profiling():
            # A profile times the dense and the BM25 queries apart (the shard's thread measures them).
            found, took = await self._run(self._query_each, requests)
            for (i, _), seconds in zip(asked, took, strict=True):
                record("dense query" if queries[i].using == DENSE else "sparse query", seconds)
        else:
            found = await self._run(self._query_batch, requests)
        results: list[list[IndexHit]] = [[] for _ in queries]
        for (i, _), points in zip(asked, found, strict=True):
            results[i] = [IndexHit(point_id=str(p.id), score=p.score, payload=dict(p.payload or {})) for p in points]
        return results

    def _query_batch(self, requests: list[QueryRequest]) -> Any:
        return self.shard.query_batch(QueryBatchRequest(requests))

    def _query_each(self, requests: list[QueryRequest]) -> tuple[list[Any], list[float]]:
        found, took = [], []
        for request in requests:
            started = time.perf_counter()
            found.append(self.shard.query(request))
            took.append(time.perf_counter() - started)
        return found, took

    async def count(self, user_id: str | None = None) -> int:
        request = CountRequest(filter=_filter(conditions(user_id, {})) if user_id else None, exact=True)
        return int(await self._run(self._count, request))

    def _count(self, request: CountRequest) -> int:
        return int(self.shard.count(request))

    async def payloads(self) -> list[dict[str, Any]]:
        return await self._run(self._payloads)

    def _payloads(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        offset = None
        while True:
            records, offset = self.shard.scroll(ScrollRequest(offset=offset, limit=1000, with_payload=True))
            out.extend(dict(r.payload or {}) for r in records)
            if offset is None:
                return out

    async def flush(self) -> None:
        await self._run(self._flush)

    def _flush(self) -> None:
        if self._shard is not None:
            self._shard.flush()

    async def close(self) -> None:
        async with self._writing:
            if self._shard is not None:
                shard, self._shard = self._shard, None
                await self._run(shard.flush)
                await self._run(shard.close)
        self._executor.shutdown(wait=False)


def drop_shard(directory: Path) -> None:
    """A shard directory and whatever a compaction left beside it."""
    for path in (directory, _sibling(directory, ".next"), _sibling(directory, ".old")):
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        _sibling(directory, ".owed").unlink()
