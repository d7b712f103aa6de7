"""How often and how recently each note was read (requirements §5's importance and decay), kept beside
the read model rather than in the event log: a read is not a change of memory, and one event per
search hit would flood the log. Per user: a hash of counts and a hash of last-access times (ms).
Lost counts on a crash only make the recency signal a little older; nothing depends on them.
Which reads count, and what replies show, is ``services/application/reads.py``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

import msgspec
from redis.asyncio import Redis

from engram_ledger.contracts import channels
from engram_ledger.contracts.channels import AccessKeys
from engram_ledger.contracts.model import NoteView
from engram_ledger.services.application.reads import from_ms, to_ms


class AccessLog:
    def __init__(self, redis: Redis, partitions: int) -> None:
        self._redis = redis
        self._partitions = partitions

    def _keys(self, user_id: str) -> AccessKeys:
        return AccessKeys(channels.partition_of(user_id, self._partitions))

    async def touch(self, user_id: str, note_ids: Iterable[str], at: datetime) -> None:
        ids = list(dict.fromkeys(note_ids))
        if not ids:
            return
        keys = self._keys(user_id)
        ms = to_ms(at)
        async with self._redis.pipeline(transaction=False) as pipe:
            for note_id in ids:
                pipe.hincrby(keys.counts(user_id), note_id, 1)
            pipe.hset(keys.times(user_id), mapping=dict.fromkeys(ids, ms))
            await pipe.execute()

    async def annotate(self, user_id: str, views: Sequence[NoteView]) -> list[NoteView]:
        """The views with ``last_accessed_at`` and ``access_count`` filled in."""
        if not views:
            return list(views)
        keys = self._keys(user_id)
        ids = [v.id for v in views]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.counts(user_id), ids)
            pipe.hmget(keys.times(user_id), ids)
            counts, times = await pipe.execute()
        out = []
        for view, count, at in zip(views, counts, times, strict=True):
            if count is None and at is None:
                out.append(view)
                continue
            accessed = from_ms(int(at)) if at is not None else None
            out.append(msgspec.structs.replace(view, access_count=int(count or 0), last_accessed_at=accessed))
        return out

    async def forget(self, user_id: str, note_ids: Sequence[str] | None = None) -> None:
        """Drop one user's counts for some notes, or all of them."""
        keys = self._keys(user_id)
        if note_ids is None:
            await self._redis.delete(keys.counts(user_id), keys.times(user_id))
        elif note_ids:
            await self._redis.hdel(keys.counts(user_id), *note_ids)
            await self._redis.hdel(keys.times(user_id), *note_ids)
