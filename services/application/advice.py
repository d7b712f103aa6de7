"""Advice on a save (requirements §3 and §4): which active notes the new one may contradict or
repeat, and what to do about them. It enriches the reply after the append; the save has already
succeeded, so a failure here (the model still loading, say) leaves the reply without advice."""

from __future__ import annotations

import asyncio
import logging

from engram_ledger.contracts.model import NoteStatus
from engram_ledger.contracts.queries import NoteWritten, SimilarNote
from engram_ledger.services.application.deadline import index_ready, time_left
from engram_ledger.services.application.ports import NoteHistory
from engram_ledger.services.application.vector_index import DENSE, MEMORY, NearestQuery, SearchableIndex

log = logging.getLogger("engram.advice")

# Measured with MiniLM on seed-like pairs: contradicting or updating pairs score 0.53-0.93
# ("lives in Seattle" / "moved to Austin" 0.53), unrelated pairs 0.03-0.11.
DEFAULT_SIMILAR_THRESHOLD = 0.5


class SaveAdvisor:
    def __init__(
        self,
        runtime: SearchableIndex,
        history: NoteHistory,
        threshold: float = DEFAULT_SIMILAR_THRESHOLD,
        limit: int = 5,
        timeout: float = 3.0,
    ) -> None:
        self._runtime = runtime
        self._history = history
        self._threshold = threshold
        self._limit = limit
        self._timeout = timeout

    async def advise(self, reply: NoteWritten, user_id: str, content: str, subject: str | None) -> NoteWritten:
        if reply.duplicate:
            return reply  # nothing new was saved
        try:
            # While the service starts, the advice waits for the model within the caller's wait:
            # the save itself is done, and answered without advice rather than late.
            await index_ready(self._runtime, "advice on a save", self._timeout)
            left = min(self._timeout, time_left(self._timeout))
            return await asyncio.wait_for(self._advise(reply, user_id, content, subject), left)
        except Exception as e:
            log.warning("no similarity advice for %s/%s: %r", user_id, reply.note_id, e)
            return reply

    async def _advise(self, reply: NoteWritten, user_id: str, content: str, subject: str | None) -> NoteWritten:
        # Embed while the index catches up with this save (and so with every write before it).
        embedding = asyncio.create_task(self._runtime.embedder.embed([content]))
        await self._runtime.wait_for(reply.token, self._timeout)
        (dense,) = await embedding
        index = self._runtime.index
        active: dict[str, str | list[str]] = {"record": MEMORY, "status": "active"}
        hits = await index.nearest(
            NearestQuery(
                user_id=user_id,
                using=DENSE,
                dense=dense,
                match=active,
                limit=self._limit * 3,
                threshold=self._threshold,
            )
        )
        best: dict[str, float] = {}
        for hit in hits:
            note_id = hit.payload["note_id"]
            if note_id != reply.note_id:
                best[note_id] = max(best.get(note_id, 0.0), hit.score)
        similar = []
        for note_id, similarity in sorted(best.items(), key=lambda item: -item[1])[: self._limit]:
            view = await self._history.get_note(user_id, note_id)
            if view is None or view.status is not NoteStatus.ACTIVE:
                continue
            similar.append(
                SimilarNote(
                    note_id=note_id,
                    content=view.content,
                    similarity=round(similarity, 4),
                    category=view.category,
                    subject=view.subject,
                    confidence=view.confidence,
                    source=view.source.value,
                    created_at=view.created_at,
                )
            )
        same_subject: list[str] = []
        if subject is not None:
            # By its keyed hash, case and spacing aside: the index holds no subject text.
            subject_key = self._runtime.subject_key(user_id, subject)
            about = await index.nearest(
                NearestQuery(
                    user_id=user_id,
                    using=DENSE,
                    dense=dense,
                    match={**active, "subject_key": subject_key},
                    limit=self._limit * 3,
                )
            )
            same_subject = list(
                dict.fromkeys(h.payload["note_id"] for h in about if h.payload["note_id"] != reply.note_id)
            )
        return NoteWritten(
            note_id=reply.note_id,
            version=reply.version,
            token=reply.token,
            replayed=reply.replayed,
            similar=similar,
            same_subject=same_subject[: self._limit],
            action_required=_action(reply.note_id, similar, same_subject, subject),
        )


def _action(new_id: str, similar: list[SimilarNote], same_subject: list[str], subject: str | None) -> str | None:
    steps = []
    if similar:
        old = ", ".join(s.note_id for s in similar)
        steps.append(
            f"Memory {new_id} is close to {old}. If it makes any of them outdated, call "
            f"supersede_note(note_id=<outdated id>, superseded_by={new_id}); keep the ones it complements."
        )
    if same_subject:
        which = f"Memory {same_subject[0]} is" if len(same_subject) == 1 else f"Memories {', '.join(same_subject)} are"
        steps.append(
            f"{which} also about {subject!r}: when information changes, prefer "
            f"update_note on the existing memory over a new one."
        )
    return " ".join(steps) or None
