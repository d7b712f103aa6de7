"""The forget saga's state: every pending deletion and its deadline, per partition, fed from the
event log like every projection (checkpoint stored with the state, ``rebuild()`` from zero).

``ForgetRequested`` adds (or moves) a deadline; ``ForgetExpired`` and ``NoteForgotten`` remove
it. The expiry timer (``services/application/forget_timer.py``) reads the due ones and sends ``ExpireForget``.
Deadlines are in Redis, so they survive restarts; one that passed while the service was down is
due at once when it starts.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis
from redis.exceptions import WatchError

from contracts import channels
from contracts.events import ForgetExpired, ForgetRequested, NoteForgotten, SessionForgotten, UserForgotten
from projections.history import GenerationChanged, position_key
from services.adapters.event_store import LogEntry, RedisEventStore
from services.adapters.redis_conn import transaction_client


class SagaKeys:
    def __init__(self, partition: int) -> None:
        base = f"{channels.tag(partition)}:forget"
        self.checkpoint = f"{base}:checkpoint"
        self.deadlines = f"{base}:deadlines"
        self.lease = f"{base}:lease"
        self._base = base

    def pending(self, user_id: str) -> str:
        """The user's notes with a pending deletion."""
        return f"{self._base}:pending:{user_id}"


def member(user_id: str, note_id: str) -> str:
    return f"{user_id}\x00{note_id}"


class ForgetSagaProjection:
    name = "forget-saga"

    def __init__(self, redis: Redis, partition: int) -> None:
        self._redis = redis
        self.partition = partition
        self.keys = SagaKeys(partition)

    async def checkpoint(self) -> str | None:
        raw = await self._redis.get(self.keys.checkpoint)
        return raw.decode() if raw is not None else None

    async def apply(self, batch: Sequence[LogEntry]) -> None:
        keys = self.keys
        redis = await transaction_client(self._redis, keys.checkpoint)
        async with redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(keys.checkpoint)
                checkpoint = await pipe.get(keys.checkpoint)
                done = position_key(checkpoint) if checkpoint else (0, 0)
                batch = [e for e in batch if position_key(e.position) > done]
                if not batch:
                    return
                pipe.multi()
                for entry in batch:
                    event = entry.event
                    if isinstance(event, ForgetRequested):
                        score = event.expires_at.timestamp() * 1000
                        pipe.zadd(keys.deadlines, {member(event.user_id, event.note_id): score})
                        pipe.sadd(keys.pending(event.user_id), event.note_id)
                    elif isinstance(event, ForgetExpired | NoteForgotten | UserForgotten | SessionForgotten):
                        pipe.zrem(keys.deadlines, member(event.user_id, event.note_id))
                        pipe.srem(keys.pending(event.user_id), event.note_id)
                pipe.set(keys.checkpoint, batch[-1].position)
                await pipe.execute()
            except WatchError as e:
                raise GenerationChanged() from e

    async def rebuild(self, store: RedisEventStore, batch_size: int = 500) -> int:
        stale = [k async for k in self._redis.scan_iter(match=channels.matching(self.keys.pending("")))]
        await self._redis.delete(self.keys.checkpoint, self.keys.deadlines, *stale)
        after, read = "0", 0
        while batch := await store.read_log(self.partition, after, batch_size):
            await self.apply(batch)
            after = batch[-1].position
            read += len(batch)
        return read


async def due(redis: Redis, partition: int, now_ms: float, limit: int = 100) -> list[tuple[str, str, float]]:
    """Pending deletions whose deadline has passed: (user, note, deadline in ms)."""
    raw = await redis.zrangebyscore(SagaKeys(partition).deadlines, "-inf", now_ms, start=0, num=limit, withscores=True)
    out = []
    for name, score in raw:
        user_id, note_id = name.decode().split("\x00", 1)
        out.append((user_id, note_id, float(score)))
    return out


async def pending_notes(redis: Redis, partition: int, user_id: str) -> list[str]:
    return sorted(m.decode() for m in await redis.smembers(SagaKeys(partition).pending(user_id)))


async def pending_count(redis: Redis, partition: int) -> int:
    return int(await redis.zcard(SagaKeys(partition).deadlines))
