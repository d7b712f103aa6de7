"""The search responder: embed the query (dense and BM25), ask the vector index for fused hits,
fold chunks into notes, and read each note's text from the history read model (the index holds
no text). Another user's notes are never candidates: every index query is filtered by user."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec

from contracts.errors import EngramError, ErrorCode
from contracts.model import MessageView, NoteStatus, NoteView
from contracts.queries import SearchHit, SearchNotes, SearchReply
from projections.access import AccessLog
from projections.history import HistoryReader
from projections.index import sparse_query
from projections.index_runtime import IndexReader, IndexRuntime
from projections.vector_index import CONVERSATION, DENSE, MEMORY, SPARSE, IndexHit, NearestQuery, Sparse, VectorIndex
from services.config import DEFAULT_WEIGHTS

# BM25 scores are unbounded; s / (s + 6) maps them to [0, 1): one common word (~3 here) counts
# for about a third, several rare ones for nearly all of it.
BM25_SATURATION = 6.0


def fuse(
    dense: list[IndexHit], sparse: list[IndexHit], weights: tuple[float, float] = DEFAULT_WEIGHTS
) -> list[tuple[str, float, float]]:
    """Weighted score fusion, per note: ``w_dense * cosine + w_bm25 * s / (s + 6)``, each side
    taking the note's best chunk. Returns (note id, fused score, cosine), best first.

    Score fusion rather than rank fusion (RRF): with RRF any keyword hit gets the full credit of
    its rank, so one shared common word ("work") outranks a clear paraphrase ("manager" ~
    "boss"); here a weak keyword match adds a little and a strong one (a rare name) a lot."""
    cosine: dict[str, float] = {}
    for hit in dense:
        note_id = hit.payload["note_id"]
        cosine[note_id] = max(cosine.get(note_id, -1.0), hit.score)
    keyword: dict[str, float] = {}
    for hit in sparse:
        note_id = hit.payload["note_id"]
        keyword[note_id] = max(keyword.get(note_id, 0.0), hit.score / (hit.score + BM25_SATURATION))
    w_dense, w_sparse = weights
    notes = set(cosine) | set(keyword)
    # A note found only by keyword has an unknown cosine below every dense hit; count it as 0.
    fused = [
        (n, w_dense * max(cosine.get(n, 0.0), 0.0) + w_sparse * keyword.get(n, 0.0), cosine.get(n, 0.0)) for n in notes
    ]
    return sorted(fused, key=lambda item: (-item[1], item[0]))


@dataclass(frozen=True)
class BlendPolicy:
    """``ranking="blended"``: ``relevance * fused + recency * 0.5 ** (age / half_life) +
    importance * note.importance``, where age runs from the note's last update or last access,
    whichever is later (seed 004's decay: what is used stays fresh)."""

    relevance: float = 0.7
    recency: float = 0.15
    importance: float = 0.15
    half_life_days: float = 30.0

    def score(self, fused: float, note: NoteView, now: datetime) -> float:
        last = max(note.updated_at, note.last_accessed_at or note.updated_at)
        age_days = max(0.0, (now - last).total_seconds() / 86400)
        fresh = 0.5 ** (age_days / self.half_life_days)
        return self.relevance * fused + self.recency * fresh + self.importance * note.importance


class SearchService:
    def __init__(
        self,
        runtime: IndexRuntime,
        history: HistoryReader,
        read_wait_seconds: float,
        weights: tuple[float, float] = DEFAULT_WEIGHTS,
        access: AccessLog | None = None,
        blend: BlendPolicy = BlendPolicy(),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._runtime = runtime
        self._index_reader = IndexReader(runtime)
        self._history = history
        self._wait = read_wait_seconds
        self._weights = weights
        self._access = access
        self._blend = blend
        self._clock = clock
        self._touching: set[asyncio.Task[None]] = set()

    async def search(self, query: SearchNotes) -> SearchReply:
        if query.after is not None:
            caught_up = await self._index_reader.wait_for(query.after, self._wait) and await self._history.wait_for(
                query.after, self._wait
            )
            if not caught_up:
                raise EngramError(
                    ErrorCode.TIMEOUT,
                    f"the index has not reached token {query.after} within {self._wait:g} s; retry later",
                )
        try:
            index = self._runtime.index
            (dense,) = await self._runtime.embedder.embed([query.query])
        except EngramError:
            raise
        except Exception as e:
            raise EngramError(ErrorCode.EMBEDDING_ERROR, f"cannot search right now: {e}") from None
        if query.include_conversation and query.session_id is None:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER, "include_conversation needs the session_id of the conversation"
            )
        match: dict[str, str | list[str]] = {
            "record": MEMORY,
            "status": ["active", "superseded"] if query.include_superseded else "active",
        }
        if query.category is not None:
            match["category"] = query.category
        if query.kind is not None:
            match["kind"] = query.kind.value
        if query.subject is not None:
            match["subject"] = query.subject
        sparse = sparse_query(query.query)
        candidates = [(MEMORY, note) for note in await self._candidates(index, query, dense, sparse, match)]
        if query.include_conversation:
            said: dict[str, str | list[str]] = {"record": CONVERSATION, "session_id": query.session_id or ""}
            candidates += [(CONVERSATION, hit) for hit in await self._candidates(index, query, dense, sparse, said)]
        # Both kinds are scored the same way, so one ordering merges them.
        candidates.sort(key=lambda item: (-item[1][1], item[1][0]))
        wanted = query.top_k if query.ranking == "relevance" else query.top_k * 4
        results = await self._hydrate(query, candidates, wanted)
        if self._access is not None:
            results = await self._annotate(query.user_id, results)
        if query.ranking == "blended":
            now = self._clock()
            blended = [
                msgspec.structs.replace(h, score=round(self._blend.score(h.score, h.note, now), 6)) if h.note else h
                for h in results
            ]
            results = sorted(blended, key=lambda h: (-h.score, h.note_id))[: query.top_k]
        if self._access is not None and results:
            # Counted after the reply is built, off its path: a read is not worth a round trip.
            task = asyncio.create_task(
                self._access.touch(query.user_id, [h.note_id for h in results if h.note], self._clock())
            )
            self._touching.add(task)
            task.add_done_callback(self._touching.discard)
        return SearchReply(results=results)

    async def _annotate(self, user_id: str, hits: list[SearchHit]) -> list[SearchHit]:
        assert self._access is not None
        notes = [h.note for h in hits if h.note is not None]
        annotated = {n.id: n for n in await self._access.annotate(user_id, notes)}
        return [msgspec.structs.replace(h, note=annotated[h.note_id]) if h.note else h for h in hits]

    async def _candidates(
        self,
        index: VectorIndex,
        query: SearchNotes,
        dense: list[float],
        sparse: Sparse,
        match: dict[str, str | list[str]],
    ) -> list[tuple[str, float, float]]:
        # Several chunks of one long note may rank together; fetch enough to fill top_k notes.
        limit = max(50, query.top_k * 10)
        dense_hits, sparse_hits = await asyncio.gather(
            index.nearest(NearestQuery(user_id=query.user_id, using=DENSE, dense=dense, match=match, limit=limit)),
            index.nearest(NearestQuery(user_id=query.user_id, using=SPARSE, sparse=sparse, match=match, limit=limit)),
        )
        return fuse(dense_hits, sparse_hits, self._weights)

    async def _hydrate(
        self, query: SearchNotes, candidates: list[tuple[str, tuple[str, float, float]]], wanted: int
    ) -> list[SearchHit]:
        """The text comes from the read model (the index holds none), read a slice at a time in
        one round trip; a hit the read model does not have (yet, or any more) is left out, and
        so is one superseded meanwhile."""
        results: list[SearchHit] = []
        step = wanted * 2
        for start in range(0, len(candidates), step):
            window = candidates[start : start + step]
            notes, messages = await self._history.get_many(
                query.user_id,
                [record_id for source, (record_id, _, _) in window if source == MEMORY],
                [record_id for source, (record_id, _, _) in window if source == CONVERSATION],
            )
            for source, (record_id, score, similarity) in window:
                hit = _hit(query, source, record_id, round(score, 6), round(similarity, 6), notes, messages)
                if hit is not None:
                    results.append(hit)
                    if len(results) == wanted:
                        return results
        return results


def _hit(
    query: SearchNotes,
    source: str,
    record_id: str,
    score: float,
    similarity: float,
    notes: dict[str, NoteView],
    messages: dict[str, MessageView],
) -> SearchHit | None:
    if source == CONVERSATION:
        message = messages.get(record_id)
        if message is None:
            return None
        return SearchHit(
            note_id=record_id,
            content=message.content,
            score=score,
            similarity=similarity,
            source=source,
            message=message,
        )
    view = notes.get(record_id)
    if view is None or view.user_id != query.user_id:
        return None
    if view.status is not NoteStatus.ACTIVE and not query.include_superseded:
        return None
    return SearchHit(
        note_id=record_id, content=view.content, score=score, similarity=similarity, source=source, note=view
    )
