"""``QdrantServerIndex``: a Qdrant server or cluster through ``qdrant-client`` (the scale-out
path, ``ENGRAM_QDRANT_URL``). Same collection layout as the Edge shard: named dense vector
``dense``, sparse ``bm25`` with the IDF modifier (BM25 vectors are made client-side by Edge's
``Bm25``, which matches the server's), a tenant keyword index on ``user_id``. Tests run it
against qdrant-client's local mode, a stand-in only: it filters in Python."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from qdrant_client import AsyncQdrantClient, models

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


def _filter(where: list[Condition]) -> models.Filter:
    """``qdrant_filter.conditions`` in this client's types."""
    return models.Filter(must=[_condition(c) for c in where])


def _condition(c: Condition) -> models.FieldCondition:
    if c.is_range:
        return models.FieldCondition(key=c.key, range=models.Range(gte=c.gte, lte=c.lte))
    if c.values is not None:
        return models.FieldCondition(key=c.key, match=models.MatchAny(any=c.values))
    assert c.value is not None
    return models.FieldCondition(key=c.key, match=models.MatchValue(value=c.value))


def _params(query: NearestQuery) -> models.SearchParams:
    """As the Edge adapter's: BM25's term statistics over the user's own points (those that held
    then, for a search of the past), and an exact dense search, so that nothing a user sees
    depends on another user's points."""
    if query.using == SPARSE:
        corpus = _filter(conditions(query.user_id, {}, ranges=query.ranges))
        return models.SearchParams(idf=models.IdfCorpusParams(corpus=corpus))
    return models.SearchParams(exact=True)


class QdrantServerIndex:
    # The server's files are its own: deleted points leave them when its optimizer vacuums their
    # segments (see docs/operations.md), not through Engram.
    compacts_files = False
    on_owed: Callable[[], None] | None = None

    def __init__(self, client: AsyncQdrantClient, collection: str = "engram") -> None:
        self._client = client
        self.collection = collection

    @classmethod
    def from_url(cls, url: str, collection: str = "engram", api_key: str | None = None) -> QdrantServerIndex:
        if url == ":memory:" or not url.startswith(("http://", "https://")):
            return cls(
                AsyncQdrantClient(location=url) if url == ":memory:" else AsyncQdrantClient(path=url), collection
            )
        return cls(AsyncQdrantClient(url=url, api_key=api_key), collection)

    async def ensure(self, dimension: int) -> None:
        if not await self._client.collection_exists(self.collection):
            await self._client.create_collection(
                self.collection,
                vectors_config={DENSE: models.VectorParams(size=dimension, distance=models.Distance.COSINE)},
                sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
            )
            await self._client.create_payload_index(
                self.collection,
                "user_id",
                models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True),
            )
            for name in KEYWORD_FIELDS[1:]:
                await self._client.create_payload_index(self.collection, name, models.PayloadSchemaType.KEYWORD)
            for name in INTEGER_FIELDS:
                await self._client.create_payload_index(self.collection, name, models.PayloadSchemaType.INTEGER)
            for name in FLOAT_FIELDS:
                await self._client.create_payload_index(self.collection, name, models.PayloadSchemaType.FLOAT)

    async def upsert(self, points: list[IndexPoint]) -> None:
        if not points:
            return
        await self._client.upsert(
            self.collection,
            points=[
                models.PointStruct(
                    id=p.id,
                    vector={
                        DENSE: p.dense,
                        SPARSE: models.SparseVector(indices=p.sparse.indices, values=p.sparse.values),
                    },
                    payload=p.payload,
                )
                for p in points
            ],
            wait=True,
        )

    async def delete(self, user_id: str, note_id: str, from_chunk: int = 0) -> None:
        selector = models.FilterSelector(filter=_filter(conditions(user_id, {}, note_id, from_chunk)))
        await self._client.delete(self.collection, points_selector=selector, wait=True)

    async def set_payload(
        self, user_id: str, note_id: str, fields: dict[str, Any], ranges: Ranges | None = None
    ) -> None:
        where = _filter(conditions(user_id, {}, note_id, ranges=ranges))
        await self._client.set_payload(self.collection, payload=fields, points=where, wait=True)

    async def nearest(self, query: NearestQuery) -> list[IndexHit]:
        if query.using == SPARSE:
            assert query.sparse is not None
            if not query.sparse.indices:
                return []
            vector: Any = models.SparseVector(indices=query.sparse.indices, values=query.sparse.values)
        else:
            vector = query.dense
        response = await self._client.query_points(
            self.collection,
            query=vector,
            using=query.using,
            query_filter=_filter(conditions(query.user_id, query.match, window=query.window, ranges=query.ranges)),
            limit=query.limit,
            score_threshold=query.threshold,
            with_payload=query.fields if query.fields is not None else True,
            search_params=_params(query),
        )
        return [IndexHit(point_id=str(p.id), score=p.score, payload=dict(p.payload or {})) for p in response.points]

    async def nearest_many(self, queries: list[NearestQuery]) -> list[list[IndexHit]]:
        return list(await asyncio.gather(*(self.nearest(q) for q in queries)))

    async def count(self, user_id: str | None = None) -> int:
        result = await self._client.count(
            self.collection, count_filter=_filter(conditions(user_id, {})) if user_id else None, exact=True
        )
        return int(result.count)

    async def payloads(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        offset = None
        while True:
            records, offset = await self._client.scroll(self.collection, offset=offset, limit=1000, with_payload=True)
            out.extend(dict(r.payload or {}) for r in records)
            if offset is None:
                return out

    async def flush(self) -> None:
        """The server persists on its own."""

    def owed_since(self) -> float | None:
        return None

    async def compact(self) -> bool:
        return False

    async def close(self) -> None:
        await self._client.close()
