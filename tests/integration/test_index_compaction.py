"""The embedded index's rewrite without deleted points (``QdrantEdgeIndex.compact``) survives a
crash at any step, and the generations a rebuild replaced are removed whole."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from engram_ledger.projections.index_runtime import drop_edge_generations
from engram_ledger.projections.qdrant_edge import QdrantEdgeIndex
from tests.integration.test_vector_index_contract import DIM, dense, notes, point


async def _index_with_two_notes(directory: Path) -> QdrantEdgeIndex:
    index = QdrantEdgeIndex(directory)
    await index.ensure(DIM)
    await index.upsert([point("alice", "KEEPKEEP", 0, 1, "kept"), point("alice", "GONEGONE", 0, 2, "gone")])
    await index.delete("alice", "GONEGONE")
    await index.flush()
    return index


async def test_a_copy_cut_short_is_thrown_away_and_the_debt_kept(tmp_path: Path) -> None:
    shard = tmp_path / "g0"
    index = await _index_with_two_notes(shard)
    await index.close()
    # as a crash leaves it during the copy: a partial new shard beside the whole old one
    partial = tmp_path / "g0.next"
    partial.mkdir()
    (partial / "half-written").write_bytes(b"x")
    reopened = QdrantEdgeIndex(shard)
    await reopened.ensure(DIM)
    assert not partial.exists()
    assert reopened.owed_since() is not None, "the old shard still holds the deleted point"
    assert notes(await reopened.nearest(dense("alice", 1))) == ["KEEPKEEP"]
    assert await reopened.compact() and reopened.owed_since() is None
    await reopened.close()


async def test_a_swap_cut_between_its_two_moves_is_finished(tmp_path: Path) -> None:
    shard = tmp_path / "g0"
    index = await _index_with_two_notes(shard)
    await index.close()
    # as a crash leaves it between moving the old shard aside and the new one in
    shutil.copytree(shard, tmp_path / "g0.next")
    os.replace(shard, tmp_path / "g0.old")
    reopened = QdrantEdgeIndex(shard)
    await reopened.ensure(DIM)
    assert shard.exists() and not (tmp_path / "g0.next").exists() and not (tmp_path / "g0.old").exists()
    assert notes(await reopened.nearest(dense("alice", 1))) == ["KEEPKEEP"]
    await reopened.close()


async def test_writes_made_while_a_compaction_runs_are_kept(tmp_path: Path) -> None:
    import asyncio

    index = await _index_with_two_notes(tmp_path / "g0")
    compacting = asyncio.create_task(index.compact())
    await index.upsert([point("alice", "DURINGCP", 0, 3, "written meanwhile")])
    assert await compacting
    assert set(notes(await index.nearest(dense("alice", 3)))) == {"KEEPKEEP", "DURINGCP"}
    await index.close()


def test_the_generations_before_the_live_one_are_removed_whole(tmp_path: Path) -> None:
    root = tmp_path / "index"
    for name in ("g0", "g0-timeline", "g0.next", "g0-timeline.old", "g1", "g1-timeline", "g2"):
        (root / name).mkdir(parents=True)
    (root / "g0.owed").write_text("1")
    drop_edge_generations(tmp_path)(2)
    assert sorted(p.name for p in root.iterdir()) == ["g2"]
