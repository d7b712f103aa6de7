"""The timeline projection: every version of every note (and every turn), with when it held, in
the timeline index a search of the past ranks (``projections/timeline_model.py`` says what a
batch means). A projection of its own beside the live index: its state (each note's meta, each
conversation's last turns) under ``TimelineKeys``, its checkpoint, its lease and its runner, in
the index's generations (a rebuild of the index fills both; the index's pointer names the live
one of both). A reader waiting for a token before a search of the past waits for its checkpoint.

Its writes are idempotent as the live index's (point ids from user, note, version and chunk),
so a batch replayed after a crash writes the same points again.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

import msgspec

from engram_ledger.contracts.channels import TimelineKeys
from engram_ledger.projections.index import PointsProjection, StateWrites
from engram_ledger.projections.index_model import BatchChanges, NoteMeta, fold_batch, indexed_text
from engram_ledger.projections.timeline_model import TimelinePlan, TimelinePlanner, Version
from engram_ledger.services.application.ports import LogEntry
from engram_ledger.services.application.ranking import CONTEXT_TURNS
from engram_ledger.services.application.terms import sparse_document
from engram_ledger.services.application.vector_index import (
    CONVERSATION,
    OPEN,
    UNTIL_AT,
    UNTIL_POSITION,
    IndexPoint,
    bounds,
)

_NAMESPACE = uuid.UUID("6f1d2c7e-3a44-4f0b-9c3e-2b7d9a51e0c4")


def version_point_id(user_id: str, note_id: str, version: int, chunk: int) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{user_id}/{note_id}/{version}/{chunk}"))


class TimelineProjection(PointsProjection):
    """Folds each batch as the live index does (the same metas, the same turns before each turn)
    and writes what held when: memory notes as versions (``TimelinePlanner``), turns as the live
    index has them, held from when they were said."""

    name = "timeline"
    keys_of = TimelineKeys

    async def _plan(self, batch: Sequence[LogEntry], state: dict[str, bytes | None]) -> StateWrites:
        metas, turns = await self._loaded(batch, state)
        planner = TimelinePlanner()
        changes = fold_batch(batch, metas, self.keys.note, self._subject_key, turns, applied=planner)
        await self._write_turns(changes, metas, planner.plan.recorded)
        changed = {key for key in changes.touched if metas[key] is not None}
        changed |= await self._drop_contexts(await turns.followers(2 * CONTEXT_TURNS), turns, metas)
        await self._write_versions(planner.plan)
        return self._writes(metas, changed, turns)

    async def _write_turns(
        self,
        changes: BatchChanges,
        metas: dict[str, NoteMeta | None],
        recorded: Mapping[tuple[str, str], tuple[float, float]],
    ) -> None:
        """The points of the turns the batch records (their words, and in the context of the
        turns before them), held from when each was said; a turn forgotten or retracted has none
        (the plan drops it)."""
        said = {key for key, ids in changes.touched.items() if ids in recorded and key in changes.texts}
        turns = BatchChanges(
            texts={key: changes.texts[key] for key in said},
            contexts={key: before for key, before in changes.contexts.items() if key in said},
            touched={key: changes.touched[key] for key in said},
        )
        points, chunk_counts, firsts = await self._points(turns, metas)
        held = [msgspec.structs.replace(p, payload=p.payload | bounds(recorded[_ids(p)])) for p in points]
        await self.index.upsert(held)
        for key in said:
            meta = metas[key]
            assert meta is not None and meta.record == CONVERSATION
            meta.chunks = chunk_counts[key]
            meta.context_chunk = chunk_counts[key] - 1 if key in firsts else None

    async def _write_versions(self, plan: TimelinePlan) -> None:
        """Drop what is forgotten, end the versions the batch ends, then write the versions it
        begins (each already ended if the batch ends it too)."""
        for user_id, note_id in plan.dropped:
            await self.index.delete(user_id, note_id)
        for (user_id, note_id), (at, position) in plan.closed.items():
            ended = {UNTIL_AT: at, UNTIL_POSITION: position}
            await self.index.set_payload(user_id, note_id, ended, ranges={UNTIL_POSITION: (OPEN, None)})
        versions = [v for v in await self._with_text(plan.opened) if v.text]
        chunked = {v.text: self._embedder.chunks(v.text) for v in versions if v.text}
        pieces = list(dict.fromkeys(p for chunks in chunked.values() for p in chunks))
        vectors = dict(zip(pieces, await self._embedder.embed(pieces, background=True), strict=True)) if pieces else {}
        await self.index.upsert([p for v in versions for p in _points(v, chunked, vectors)])

    async def _with_text(self, opened: list[Version]) -> list[Version]:
        """The versions whose words the batch did not tell, read from the store: each version's
        snapshot in the note's folded state. A note forgotten since has none (its forget, later
        in the log, drops it)."""
        unknown = [v for v in opened if not v.known]
        for user_id in {v.user_id for v in unknown}:
            mine = [v for v in unknown if v.user_id == user_id]
            loaded = await self._store.load(user_id, list(dict.fromkeys(v.note_id for v in mine)))
            for version in mine:
                snapshot = loaded[version.note_id].state.at_version(version.version)
                if snapshot is not None:
                    version.text, version.subject, version.known = snapshot.content, snapshot.subject, True
        return opened

    async def _rewrite(self, notes: dict[str, tuple[str, str]], metas: dict[str, NoteMeta | None]) -> set[str]:
        """Every point of a note this projection's state says is forgotten or retracted deleted
        again: the lost writer's points may have landed after its successor's deletions."""
        for key, (user_id, note_id) in notes.items():
            meta = metas[key]
            if meta is None or meta.status == "forgotten":
                await self.index.delete(user_id, note_id)
        return set()


def _ids(point: IndexPoint) -> tuple[str, str]:
    return point.payload["user_id"], point.payload["note_id"]


def _points(version: Version, chunked: Mapping[str, list[str]], vectors: Mapping[str, list[float]]) -> list[IndexPoint]:
    assert version.text
    points = []
    for chunk, piece in enumerate(chunked[version.text]):
        payload = version.meta.payload(version.user_id, version.note_id, chunk) | {"version": version.version}
        points.append(
            IndexPoint(
                id=version_point_id(version.user_id, version.note_id, version.version, chunk),
                dense=vectors[piece],
                # A note's subject is one of its keywords, as in the live index.
                sparse=sparse_document(indexed_text(version.subject, piece)),
                payload=payload | version.bounds(),
            )
        )
    return points
