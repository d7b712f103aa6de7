"""One contract, every adapter of the VectorIndex port: Qdrant Edge (the real engine, in-process)
and the Qdrant server adapter (against qdrant-client's local mode, its stand-in)."""

from __future__ import annotations

import math
import random
import struct
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
from tests.support import files_holding

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


async def _scores(index: VectorIndex, user: str, text: str) -> list[tuple[str, float]]:
    return [(h.payload["note_id"], h.score) for h in await index.nearest(keyword(user, text))]


async def test_a_users_bm25_scores_depend_on_that_users_points_alone(index: VectorIndex) -> None:
    """Term statistics per user: another user's points, written, then deleted, move no score
    and no rank of this user's (the whole collection's statistics would: deleted points too)."""
    await index.upsert([point("dave", f"DAVE{i:04d}", 0, 100 + i, text) for i, text in enumerate(DAVES)])
    alone = {text: await _scores(index, "dave", text) for text in QUERIES}
    assert all(alone.values()) and len({s for scores in alone.values() for _, s in scores}) >= 3
    await index.upsert([point("frank", f"FRNK{i:04d}", 0, 200 + i, f"zyzzyva rowing number {i}") for i in range(40)])
    assert {text: await _scores(index, "dave", text) for text in QUERIES} == alone
    for i in range(40):
        await index.delete("frank", f"FRNK{i:04d}")
    assert await index.count("frank") == 0
    assert {text: await _scores(index, "dave", text) for text in QUERIES} == alone


async def test_the_statistics_of_the_past_are_those_of_the_points_that_held_then(index: VectorIndex) -> None:
    """Ranges (a search of the past) bound the statistics too: a point that began later counts
    for nothing at an earlier moment."""
    early = [point("erin", f"ERIN{i:04d}", 0, 300 + i, text, from_at=1.0) for i, text in enumerate(DAVES)]
    await index.upsert(early)
    then = {"from_at": (None, 5.0)}
    query = NearestQuery(
        user_id="erin", using=SPARSE, sparse=sparse("zyzzyva", query=True), match={}, limit=5, ranges=then
    )
    before = [(h.payload["note_id"], h.score) for h in await index.nearest(query)]
    await index.upsert([point("erin", f"LATE{i:04d}", 0, 400 + i, "zyzzyva again", from_at=9.0) for i in range(10)])
    assert [(h.payload["note_id"], h.score) for h in await index.nearest(query)] == before


async def test_compact_removes_deleted_points_from_the_files(index: VectorIndex, tmp_path: Path) -> None:
    """After a delete, ``compact`` leaves no byte of the deleted vectors or ids in any file of
    the index (an index whose files are a server's own says it does not, and compacts nothing)."""
    secret = point("alice", "SECRETNT", 0, 777, "zyzzyva is the password")
    await index.upsert([secret])
    assert index.owed_since() is None
    await index.delete("alice", "SECRETNT")
    if not index.compacts_files:
        assert await index.compact() is False
        return
    assert index.owed_since() is not None
    kept = point("alice", "AAAAAAAA", 0, 1, "Alec is my boss at TechCorp").dense
    assert _found_in(tmp_path, secret.dense, b"SECRETNT")  # the delete alone leaves them on disk
    assert await index.compact() is True
    assert index.owed_since() is None and await index.compact() is False
    assert not _found_in(tmp_path, secret.dense, b"SECRETNT")
    assert _found_in(tmp_path, kept, b"AAAAAAAA")  # what lives is still there, and found
    assert notes(await index.nearest(dense("alice", 1)))[0] == "AAAAAAAA"
    assert await index.count("alice") == 4 and await index.count("bob") == 1


def _found_in(root: Path, vector: list[float], note_id: bytes) -> bool:
    """Whether any file under ``root`` holds the vector (float32 or float64, either byte order;
    as stored, i.e. normalized) or the note id."""
    norm = math.sqrt(sum(x * x for x in vector))
    unit_vector = [x / norm for x in vector]
    needles = [note_id] + [struct.pack(f"{order}{DIM}{kind}", *unit_vector) for order in "<>" for kind in "fd"]
    return bool(files_holding(root, needles))


DAVES = [
    "my cat is called zyzzyva the great",
    "I like pizza on fridays with my cat",
    "the dentist appointment is on monday",
    "zyzzyva likes tuna more than pizza",
]
QUERIES = ["zyzzyva", "pizza cat", "dentist monday zyzzyva"]
