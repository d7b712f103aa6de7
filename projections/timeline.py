"""Writes the timeline index (``projections/timeline_model.py`` plans it): the index projection
calls it with each batch, after the live index, with the same idempotent writes (point ids from
user, note, version and chunk), so a batch replayed after a crash writes the same points again.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import msgspec

from engram_ledger.projections.index_model import indexed_text
from engram_ledger.projections.timeline_model import (
    OPEN,
    TimelinePlan,
    Version,
    bounds,
)
from engram_ledger.services.application.as_of import UNTIL_AT, UNTIL_POSITION
from engram_ledger.services.application.ports import EventStore
from engram_ledger.services.application.terms import sparse_document
from engram_ledger.services.application.vector_index import Embedder, IndexPoint, VectorIndex

_NAMESPACE = uuid.UUID("6f1d2c7e-3a44-4f0b-9c3e-2b7d9a51e0c4")


def version_point_id(user_id: str, note_id: str, version: int, chunk: int) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{user_id}/{note_id}/{version}/{chunk}"))


class TimelineWriter:
    def __init__(self, index: VectorIndex, embedder: Embedder, store: EventStore) -> None:
        self.index = index
        self._embedder = embedder
        self._store = store

    async def write(self, plan: TimelinePlan) -> None:
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

    async def mirror(self, points: list[IndexPoint], began: Mapping[tuple[str, str], tuple[float, float]]) -> None:
        """A turn's points as the live index has them (its words, and in the context of the turns
        before it), held from when it was recorded: a turn has one version. Points of turns
        recorded in another batch (a repair) are left as they are."""
        mirrored = []
        for point in points:
            ids = (point.payload["user_id"], point.payload["note_id"])
            if ids in began:
                mirrored.append(msgspec.structs.replace(point, payload=point.payload | bounds(began[ids])))
        await self.index.upsert(mirrored)

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
