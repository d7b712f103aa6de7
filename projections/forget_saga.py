"""The forget saga's state: every pending deletion and its deadline, per partition, fed from the
event log like every projection (checkpoint stored with the state, ``rebuild()`` from zero).

``ForgetRequested`` adds (or moves) a deadline; ``ForgetExpired`` and ``NoteForgotten`` remove
it. The expiry timer (``services/application/forget_timer.py``) reads the due ones and sends ``ExpireForget``.
Deadlines are in Redis, so they survive restarts; one that passed while the service was down is
due at once when it starts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from engram_ledger.contracts import channels, events
from engram_ledger.contracts.channels import SagaKeys
from engram_ledger.projections.tracking import TrackedProjection
from engram_ledger.services.application.ports import LogEntry


def member(user_id: str, note_id: str) -> str:
    return f"{user_id}\x00{note_id}"


class ForgetSagaProjection(TrackedProjection[Sequence[LogEntry]]):
    """One state per partition, no generations: a rebuild clears it and applies the log again."""

    name = "forget-saga"

    def __init__(self, redis: Redis, partition: int) -> None:
        self.keys = SagaKeys(partition)
        super().__init__(redis, partition, self.keys.checkpoint)

    async def _start_over(self) -> None:
        stale = [k async for k in self._redis.scan_iter(match=channels.matching(self.keys.pending("")))]
        await self._redis.delete(self.keys.checkpoint, self.keys.deadlines, self.keys.expiries, *stale)

    async def _plan(self, batch: Sequence[LogEntry], state: dict[str, bytes | None]) -> Sequence[LogEntry]:
        return batch  # each event's change stands alone: nothing to read first

    def _queue(self, pipe: Pipeline, batch: Sequence[LogEntry]) -> None:
        for entry in batch:
            # An event the table does not name (a turn, a recall, a supersede...) leaves no
            # deletion pending or due.
            rule = _RULES.get(type(entry.event))
            if rule is not None:
                rule(pipe, self.keys, entry.event)


def _requested(pipe: Pipeline, keys: SagaKeys, event: events.ForgetRequested) -> None:
    pipe.zadd(keys.deadlines, {member(event.user_id, event.note_id): event.expires_at.timestamp() * 1000})
    pipe.sadd(keys.pending(event.user_id), event.note_id)


def _settled(pipe: Pipeline, keys: SagaKeys, event: events.AnyEvent) -> None:
    """A pending deletion lapsed or done: no longer pending."""
    pipe.zrem(keys.deadlines, member(event.user_id, event.note_id))
    pipe.srem(keys.pending(event.user_id), event.note_id)


def _expires(pipe: Pipeline, keys: SagaKeys, event: events.NoteSaved | events.NoteUpdated | events.NoteRenewed) -> None:
    """A note put with a time to live is due to be forgotten when it runs out."""
    if event.expires_at is not None:
        pipe.zadd(keys.expiries, {member(event.user_id, event.note_id): event.expires_at.timestamp() * 1000})


def _expiry_changed(pipe: Pipeline, keys: SagaKeys, event: events.NoteUpdated) -> None:
    """A put again: with a time to live, due again when it runs out; without one, never."""
    _expires(pipe, keys, event)
    if event.expires_at is None and event.expiry_cleared:
        pipe.zrem(keys.expiries, member(event.user_id, event.note_id))


def _forgotten(pipe: Pipeline, keys: SagaKeys, event: events.NoteForgotten) -> None:
    _settled(pipe, keys, event)
    pipe.zrem(keys.expiries, member(event.user_id, event.note_id))


# One rule per event type that changes what is pending or due.
_RULES: dict[type[events.AnyEvent], Callable[[Pipeline, SagaKeys, Any], None]] = {
    events.ForgetRequested: _requested,
    events.ForgetExpired: _settled,
    events.UserForgotten: _settled,
    events.SessionForgotten: _settled,
    events.NoteForgotten: _forgotten,
    events.NoteSaved: _expires,
    events.NoteRenewed: _expires,
    events.NoteUpdated: _expiry_changed,
}


async def due(
    redis: Redis, partition: int, now_ms: float, limit: int = 100, expiries: bool = False
) -> list[tuple[str, str, float]]:
    """Pending deletions whose deadline has passed (``expiries``: notes whose time to live has
    run out): (user, note, deadline in ms)."""
    keys = SagaKeys(partition)
    which = keys.expiries if expiries else keys.deadlines
    raw = await redis.zrangebyscore(which, "-inf", now_ms, start=0, num=limit, withscores=True)
    out = []
    for name, score in raw:
        user_id, note_id = name.decode().split("\x00", 1)
        out.append((user_id, note_id, float(score)))
    return out


async def pending_notes(redis: Redis, partition: int, user_id: str) -> list[str]:
    return sorted(m.decode() for m in await redis.smembers(SagaKeys(partition).pending(user_id)))


async def pending_count(redis: Redis, partition: int) -> int:
    return int(await redis.zcard(SagaKeys(partition).deadlines))


class SagaPendingDeletions:
    """The application's ``PendingDeletions`` port, read from the saga's state."""

    def __init__(self, redis: Redis, partitions: int) -> None:
        self._redis = redis
        self._partitions = partitions

    async def of(self, user_id: str) -> list[str]:
        return await pending_notes(self._redis, channels.partition_of(user_id, self._partitions), user_id)

    async def due(self, partition: int, now_ms: float) -> list[tuple[str, str, float]]:
        return await due(self._redis, partition, now_ms)

    async def expiring(self, partition: int, now_ms: float) -> list[tuple[str, str, float]]:
        return await due(self._redis, partition, now_ms, expiries=True)


def live_saga(redis: Redis, partition: int) -> Callable[[], Awaitable[ForgetSagaProjection]]:
    """Opens the forget saga's projection of the partition (for its runner)."""

    async def open_live() -> ForgetSagaProjection:
        return ForgetSagaProjection(redis, partition)

    return open_live
