"""One contract, every adapter of the VectorIndex port: Qdrant Edge (the real engine, in-process)
and the Qdrant server adapter (against qdrant-client's local mode, its stand-in)."""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from qdrant_edge import Bm25

from engram_ledger.projections.qdrant_edge import QdrantEdgeIndex
from engram_ledger.projections.qdrant_server import QdrantServerIndex
from engram_ledger.services.application.vector_index import (
    DENSE,
    SPARSE,
    IndexHit,
    IndexPoint,
    NearestQuery,
    Sparse,
    TimeWindow,
    VectorIndex,
)

DIM = 8
bm25 = Bm25()


def unit(seed: int) -> list[float]:
    rng = random.Random(seed)
    v = [rng.gauss(0, 1) for _ in range(DIM)]
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def sparse(text: str, query: bool = False) -> Sparse:
    s = bm25.embed_query(text) if query else bm25.embed_document(text)
    return Sparse(list(s.indices), list(s.values))


def point(user: str, note: str, chunk: int, seed: int, text: str, **payload: object) -> IndexPoint:
    fields = {
        "user_id": user,
        "note_id": note,
        "chunk": chunk,
        "version": 1,
        "status": "active",
        "category": "general",
        "kind": "fact",
        "record": "memory",
    }
    fields.update(payload)
    return IndexPoint(
        id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{user}/{note}/{chunk}")),
        dense=unit(seed),
        sparse=sparse(text),
        payload=fields,
    )


@pytest.fixture(params=["edge", "server"])
async def index(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[VectorIndex]:
    adapter: VectorIndex = (
        QdrantEdgeIndex(tmp_path / "shard") if request.param == "edge" else QdrantServerIndex.from_url(":memory:")
    )
    await adapter.ensure(DIM)
    await adapter.upsert(
        [
            point("alice", "AAAAAAAA", 0, 1, "Alec is my boss at TechCorp", category="person"),
            point("alice", "AAAAAAAA", 1, 2, "second chunk of the Alec note", category="person"),
            point("alice", "BBBBBBBB", 0, 3, "The user prefers Friday due dates", category="preference"),
            point("alice", "CCCCCCCC", 0, 4, "User lives in Seattle", status="superseded"),
            point("bob", "DDDDDDDD", 0, 1, "Alec is my boss at TechCorp"),
        ]
    )
    yield adapter
    await adapter.close()


def dense(user: str, seed: int, **match: str | list[str]) -> NearestQuery:
    return NearestQuery(user_id=user, using=DENSE, dense=unit(seed), match=match, limit=10)


def keyword(user: str, text: str, **match: str | list[str]) -> NearestQuery:
    return NearestQuery(user_id=user, using=SPARSE, sparse=sparse(text, query=True), match=match, limit=10)


def notes(hits: list[IndexHit]) -> list[str]:
    return [h.payload["note_id"] for h in hits]


async def test_nearest_is_scoped_to_the_user_and_ranks_the_best_match_first(index: VectorIndex) -> None:
    hits = await index.nearest(dense("alice", 1))
    assert notes(hits)[0] == "AAAAAAAA" and hits[0].payload["chunk"] == 0
    assert hits[0].score == pytest.approx(1.0, abs=1e-4)
    assert {h.payload["user_id"] for h in hits} == {"alice"}
    assert notes(await index.nearest(dense("bob", 1))) == ["DDDDDDDD"]
    assert await index.nearest(dense("mallory", 1)) == []


async def test_bm25_finds_keywords_and_stop_words_alone_find_nothing(index: VectorIndex) -> None:
    assert notes(await index.nearest(keyword("alice", "Friday due dates"))) == ["BBBBBBBB"]
    assert notes(await index.nearest(keyword("bob", "TechCorp"))) == ["DDDDDDDD"]
    assert await index.nearest(keyword("alice", "the of and")) == []


async def test_filters_on_payload(index: VectorIndex) -> None:
    assert "CCCCCCCC" not in notes(await index.nearest(dense("alice", 4, status="active")))
    assert notes(await index.nearest(dense("alice", 4, status=["active", "superseded"])))[0] == "CCCCCCCC"
    assert set(notes(await index.nearest(dense("alice", 3, category="person")))) == {"AAAAAAAA"}


async def test_set_payload_and_delete_by_note(index: VectorIndex) -> None:
    await index.set_payload("alice", "AAAAAAAA", {"status": "superseded"})
    assert "AAAAAAAA" not in notes(await index.nearest(dense("alice", 1, status="active")))
    assert notes(await index.nearest(dense("bob", 1, status="active"))) == ["DDDDDDDD"]
    await index.delete("alice", "AAAAAAAA", from_chunk=1)
    assert await index.count("alice") == 3  # chunk 1 of AAAAAAAA is gone, chunk 0 stays
    assert "AAAAAAAA" in notes(await index.nearest(dense("alice", 1)))
    await index.delete("alice", "AAAAAAAA")
    assert await index.count("alice") == 2 and await index.count("bob") == 1 and await index.count() == 3


async def test_a_threshold_keeps_only_close_neighbours(index: VectorIndex) -> None:
    near = await index.nearest(
        NearestQuery(user_id="alice", using=DENSE, dense=unit(3), match={"status": "active"}, limit=5, threshold=0.99)
    )
    assert notes(near) == ["BBBBBBBB"] and near[0].score == pytest.approx(1.0, abs=1e-4)


async def test_upsert_of_the_same_point_replaces_it(index: VectorIndex) -> None:
    await index.upsert([point("alice", "BBBBBBBB", 0, 50, "The user prefers Monday due dates", version=2)])
    assert await index.count("alice") == 4
    hits = await index.nearest(dense("alice", 50))
    assert notes(hits)[0] == "BBBBBBBB" and hits[0].payload["version"] == 2


async def test_nearest_many_answers_each_query_in_order_as_nearest_does(index: VectorIndex) -> None:
    queries = [dense("alice", 1), keyword("alice", "Friday due dates"), keyword("alice", "the of and"), dense("bob", 1)]
    assert await index.nearest_many(queries) == [await index.nearest(q) for q in queries]


async def test_a_query_can_ask_for_some_payload_fields_only(index: VectorIndex) -> None:
    (hit, *_) = await index.nearest(msgspec.structs.replace(dense("alice", 1), fields=["note_id", "record"]))
    assert hit.payload == {"note_id": "AAAAAAAA", "record": "memory"}


async def test_a_time_window_keeps_the_points_whose_time_is_within_it(index: VectorIndex) -> None:
    await index.upsert(
        [
            point("carol", "EEEEEEEE", 0, 5, "said in May", time=1_683_500_000.0),
            point("carol", "FFFFFFFF", 0, 6, "said in June", time=1_687_000_000.0),
            point("carol", "GGGGGGGG", 0, 7, "no time recorded"),
        ]
    )

    def within(since: float | None, until: float | None) -> NearestQuery:
        return msgspec.structs.replace(dense("carol", 5), window=TimeWindow(since, until))

    assert set(notes(await index.nearest(dense("carol", 5)))) == {"EEEEEEEE", "FFFFFFFF", "GGGGGGGG"}
    assert notes(await index.nearest(within(1_686_000_000.0, None))) == ["FFFFFFFF"]
    assert notes(await index.nearest(within(None, 1_683_500_000.0))) == ["EEEEEEEE"], "bounds are inclusive"
