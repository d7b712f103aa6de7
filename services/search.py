"""The search responder: embed the query (dense and BM25), ask the vector index for fused hits,
fold chunks into notes, and read each note's text from the history read model (the index holds
no text). Another user's notes are never candidates: every index query is filtered by user."""

from __future__ import annotations

import asyncio

from contracts import channels
from contracts.errors import EngramError, ErrorCode
from contracts.model import NoteStatus
from contracts.queries import SearchHit, SearchNotes, SearchReply
from projections.history import HistoryReader, position_key
from projections.index import IndexKeys, live_index_generation, sparse_query
from projections.index_runtime import IndexRuntime
from projections.vector_index import MEMORY, IndexQuery


class IndexReader:
    def __init__(self, runtime: IndexRuntime) -> None:
        self.runtime = runtime

    async def checkpoint(self, partition: int) -> tuple[int, int]:
        redis = self.runtime.redis
        keys = IndexKeys(partition, await live_index_generation(redis, partition))
        raw = await redis.get(keys.checkpoint)
        return position_key(raw) if raw else (0, 0)

    async def wait_for(self, token: str, timeout: float, poll: float = 0.002) -> bool:
        partition, position = channels.parse_token(token)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while await self.checkpoint(partition) < position:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(poll)
        return True


class SearchService:
    def __init__(
        self,
        runtime: IndexRuntime,
        history: HistoryReader,
        read_wait_seconds: float,
        weights: tuple[float, float] = (1.0, 1.0),
        rrf_k: int = 60,
    ) -> None:
        self._runtime = runtime
        self._index_reader = IndexReader(runtime)
        self._history = history
        self._wait = read_wait_seconds
        self._weights = weights
        self._rrf_k = rrf_k

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
        hits = await index.search(
            IndexQuery(
                user_id=query.user_id,
                dense=dense,
                sparse=sparse_query(query.query),
                match=match,
                # Several chunks of one long note may rank together; ask for enough to fill top_k notes.
                limit=query.top_k * 4,
                prefetch=max(50, query.top_k * 10),
                weights=self._weights,
                rrf_k=self._rrf_k,
            )
        )
        best: dict[str, tuple[float, float]] = {}
        for hit in hits:
            note_id = hit.payload["note_id"]
            score, similarity = best.get(note_id, (hit.score, hit.similarity))
            best[note_id] = (max(score, hit.score), max(similarity, hit.similarity))
        ranked = sorted(best.items(), key=lambda item: -item[1][0])[: query.top_k]
        results = []
        for note_id, (score, similarity) in ranked:
            view = await self._history.get_note(query.user_id, note_id)
            if view is None or view.user_id != query.user_id:
                continue  # indexed before the read model caught up, or forgotten meanwhile
            if view.status is not NoteStatus.ACTIVE and not query.include_superseded:
                continue  # superseded in the read model already; the index follows a moment later
            results.append(SearchHit(note=view, score=round(score, 6), similarity=round(similarity, 6)))
        return SearchReply(results=results)
