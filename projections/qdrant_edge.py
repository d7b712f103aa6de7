"""``QdrantEdgeIndex``: the Qdrant engine in-process (``qdrant-edge-py``), one shard directory
under the data dir. Calls are synchronous and short; they run in a worker thread so the event
loop keeps serving. One process owns a shard directory (the embedded deployment); several
workers use the Qdrant server adapter instead."""

from __future__ import annotations

import asyncio
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
    else:
        vector = query.dense
    return QueryRequest(
        limit=query.limit,
        query=Query.Nearest(vector, using=query.using),
        filter=_filter(conditions(query.user_id, query.match, window=query.window, ranges=query.ranges)),
        score_threshold=query.threshold,
        with_payload=PayloadSelector.Include(query.fields) if query.fields is not None else True,
    )


class QdrantEdgeIndex:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._shard: EdgeShard | None = None
        # One thread: the shard is used from one place at a time, in order.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qdrant-edge")

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
        self._shard = await self._run(self._open, dimension)

    def _open(self, dimension: int) -> EdgeShard:
        config = EdgeConfig(
            vectors={DENSE: EdgeVectorParams(size=dimension, distance=Distance.Cosine)},
            sparse_vectors={SPARSE: EdgeSparseVectorParams(modifier=Modifier.Idf)},
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        if any(self.directory.iterdir()):
            shard = EdgeShard.load(str(self.directory), config)
        else:
            shard = EdgeShard.create(str(self.directory), config)
        existing = shard.info().payload_schema
        for name in KEYWORD_FIELDS:
            if name not in existing:
                shard.update(UpdateOperation.create_field_index(name, PayloadSchemaType.Keyword))
        for name in INTEGER_FIELDS:
            if name not in existing:
                shard.update(UpdateOperation.create_field_index(name, PayloadSchemaType.Integer))
        for name in FLOAT_FIELDS:
            if name not in existing:
                shard.update(UpdateOperation.create_field_index(name, PayloadSchemaType.Float))
        return shard

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
        await self._run(self.shard.update, UpdateOperation.upsert_points(edge_points))

    async def delete(self, user_id: str, note_id: str, from_chunk: int = 0) -> None:
        operation = UpdateOperation.delete_points_by_filter(_filter(conditions(user_id, {}, note_id, from_chunk)))
        await self._run(self.shard.update, operation)

    async def set_payload(
        self, user_id: str, note_id: str, fields: dict[str, Any], ranges: Ranges | None = None
    ) -> None:
        where = _filter(conditions(user_id, {}, note_id, ranges=ranges))
        operation = UpdateOperation.set_payload_by_filter(where, fields)
        await self._run(self.shard.update, operation)

    async def nearest(self, query: NearestQuery) -> list[IndexHit]:
        (hits,) = await self.nearest_many([query])
        return hits

    async def nearest_many(self, queries: list[NearestQuery]) -> list[list[IndexHit]]:
        # A BM25 query of stop words only has no terms: nothing to match, nothing to ask.
        asked = [
            (i, _request(q)) for i, q in enumerate(queries) if q.using != SPARSE or (q.sparse and q.sparse.indices)
        ]
        found = await self._run(self.shard.query_batch, QueryBatchRequest([r for _, r in asked])) if asked else []
        results: list[list[IndexHit]] = [[] for _ in queries]
        for (i, _), points in zip(asked, found, strict=True):
            results[i] = [IndexHit(point_id=str(p.id), score=p.score, payload=dict(p.payload or {})) for p in points]
        return results

    async def count(self, user_id: str | None = None) -> int:
        request = CountRequest(filter=_filter(conditions(user_id, {})) if user_id else None, exact=True)
        return int(await self._run(self.shard.count, request))

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
        if self._shard is not None:
            await self._run(self._shard.flush)

    async def close(self) -> None:
        if self._shard is not None:
            shard, self._shard = self._shard, None
            await self._run(shard.flush)
            await self._run(shard.close)
        self._executor.shutdown(wait=False)
