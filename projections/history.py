"""The history read model in Redis: each note's current view, every version, a deterministic
per-user listing and a recency listing.

Keys live under a *generation* (``engram:{p}:hist:<gen>:...``); ``engram:{p}:hist:live`` names the
generation queries read. A rebuild fills a fresh generation from position zero and switches the
pointer, so queries never see a half-built model. Every write transaction WATCHes the live pointer
and the checkpoint (``projections/tracking.py``): a stale writer (an old generation after a
switch, or a second worker that lost its lease) aborts instead of writing.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from contracts import channels
from contracts.channels import HistoryKeys
from contracts.events import MessageRecorded, NoteForgotten, NoteSaved, NoteSuperseded, UserForgotten, is_control_stream
from contracts.model import MessageView, NoteStatus, NoteView, VersionView
from projections.history_model import (
    add_supersedes,
    evolve_view,
    message_view,
    order_member,
    recent_score,
    version_entry,
)
from projections.tracking import CheckpointReader, GenerationalProjection, read_generation, read_position
from services.adapters.redis_conn import transaction_client, unlink_prefix
from services.application.ports import LogEntry

_view_decoder = msgspec.json.Decoder(NoteView)
_version_decoder = msgspec.json.Decoder(VersionView)
_message_decoder = msgspec.json.Decoder(MessageView)


async def live_generation(redis: Redis, partition: int) -> int:
    return await read_generation(redis, HistoryKeys(partition, 0).live)


class _Writes(msgspec.Struct):
    views: dict[str, NoteView]
    versions: dict[str, dict[str, bytes]]
    # Listing members a category change left behind, per user.
    stale_members: dict[str, set[bytes]]
    messages: dict[str, MessageView]
    # Version histories of forgotten notes: deleted, content and all.
    dropped: set[str] = msgspec.field(default_factory=set)
    # Every key of an erased user's notes and messages, and their listings (RequestForgetUser).
    erased: set[str] = msgspec.field(default_factory=set)


class HistoryProjection(GenerationalProjection[_Writes]):
    """Writes one generation of one partition's history read model. Besides the checkpoint, an
    event whose note is already at its version or later is skipped, so a replay from a lost
    checkpoint, or out of order, changes nothing either."""

    name = "history"

    def __init__(self, redis: Redis, partition: int, generation: int) -> None:
        self.keys = HistoryKeys(partition, generation)
        super().__init__(redis, partition, generation, self.keys)

    def _state_keys(self, batch: Sequence[LogEntry]) -> list[str]:
        return _note_keys(self.keys, batch)

    async def _plan(self, batch: Sequence[LogEntry], state: dict[str, bytes | None]) -> _Writes:
        views = {k: (_view_decoder.decode(r) if r is not None else None) for k, r in state.items()}
        return _fold(batch, views, self.keys)

    def _queue(self, pipe: Pipeline, writes: _Writes) -> None:
        keys = self.keys
        for user_id, members in writes.stale_members.items():
            pipe.zrem(keys.order(user_id, True), *members)
            pipe.zrem(keys.order(user_id, False), *members)
        for key, view in writes.views.items():
            pipe.set(key, msgspec.json.encode(view))
            _index(pipe, keys, view)
        for key, message in writes.messages.items():
            pipe.set(key, msgspec.json.encode(message))
        for key, entries in writes.versions.items():
            pipe.hset(key, mapping=entries)
        for key in writes.dropped:
            pipe.delete(key)
        if writes.erased:
            pipe.delete(*writes.erased)

    async def make_live(self, previous: int) -> bool:
        """Switch queries to this generation if ``previous`` is still live; then drop the old one."""
        redis = await transaction_client(self._redis, self.keys.live)
        async with redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(self.keys.live)
                if await live_generation(pipe, self.partition) != previous:  # type: ignore[arg-type]
                    return False
                pipe.multi()
                pipe.set(self.keys.live, self.generation)
                await pipe.execute()
            except WatchError:
                return False
        await drop_generation(self._redis, self.partition, previous)
        return True


async def drop_generation(redis: Redis, partition: int, generation: int) -> int:
    """Delete every key of an old generation of the read model."""
    return await unlink_prefix(redis, HistoryKeys(partition, generation).prefix)


def _note_keys(keys: HistoryKeys, batch: Sequence[LogEntry]) -> list[str]:
    """The read-model keys of every note a batch touches, once each."""
    found: dict[str, None] = {}
    for entry in batch:
        event = entry.event
        found[keys.note(event.user_id, event.note_id)] = None
        if isinstance(event, NoteSuperseded):
            found[keys.note(event.user_id, event.superseded_by)] = None
    return list(found)


def _fold(batch: Sequence[LogEntry], views: dict[str, NoteView | None], keys: HistoryKeys) -> _Writes:
    """The writes a batch makes, computed in memory in log order."""
    writes = _Writes(views={}, versions={}, stale_members={}, messages={})
    for entry in batch:
        event = entry.event
        if isinstance(event, UserForgotten):
            user = event.user_id
            for note_id in event.erased:
                for key in (keys.note(user, note_id), keys.versions(user, note_id), keys.message(user, note_id)):
                    writes.erased.add(key)
                    writes.views.pop(key, None)
                    writes.versions.pop(key, None)
                    writes.messages.pop(key, None)
                    views.pop(key, None)
            writes.erased |= {keys.order(user, True), keys.order(user, False), keys.recent(user)}
            writes.stale_members.pop(user, None)
            continue
        if is_control_stream(event.note_id):
            continue  # an account or session stream: pending erasures live in the forget saga
        if isinstance(event, MessageRecorded):
            writes.messages[keys.message(event.user_id, event.note_id)] = message_view(event)
            continue
        if isinstance(event, NoteForgotten):
            # A forgotten message (its session or its user erased) leaves the read model too.
            message_key = keys.message(event.user_id, event.note_id)
            writes.messages.pop(message_key, None)
            writes.erased.add(message_key)
        key = keys.note(event.user_id, event.note_id)
        current = views.get(key)
        if current is not None and current.version >= event.version:
            continue
        if current is None and not isinstance(event, NoteSaved):
            # An event whose note was never saved cannot be applied; the log is the authority, so
            # this means corruption. Skipping keeps the projection flowing; rebuild will agree.
            continue
        view = evolve_view(current, event)
        if current is not None and order_member(current) != order_member(view):
            writes.stale_members.setdefault(event.user_id, set()).add(order_member(current))
        views[key] = view
        writes.views[key] = view
        versions_key = keys.versions(event.user_id, event.note_id)
        if isinstance(event, NoteForgotten):
            writes.versions.pop(versions_key, None)
            writes.dropped.add(versions_key)
            if current is not None:
                writes.stale_members.setdefault(event.user_id, set()).add(order_member(current))
            continue
        writes.versions.setdefault(versions_key, {})[str(event.version)] = msgspec.json.encode(
            version_entry(view, event)
        )
        if isinstance(event, NoteSuperseded):
            other_key = keys.note(event.user_id, event.superseded_by)
            other = views.get(other_key)
            if other is not None:
                other = add_supersedes(other, event.note_id)
                views[other_key] = other
                writes.views[other_key] = other
    return writes


def _index(pipe: Pipeline, keys: HistoryKeys, view: NoteView) -> None:
    member = order_member(view)
    if view.status is NoteStatus.FORGOTTEN:
        pipe.zrem(keys.order(view.user_id, True), member)
        pipe.zrem(keys.order(view.user_id, False), member)
        pipe.zrem(keys.recent(view.user_id), view.id)
        return
    pipe.zadd(keys.order(view.user_id, True), {member: 0})
    if view.status is NoteStatus.ACTIVE:
        pipe.zadd(keys.order(view.user_id, False), {member: 0})
        pipe.zadd(keys.recent(view.user_id), {view.id: recent_score(view)})
    else:
        pipe.zrem(keys.order(view.user_id, False), member)
        pipe.zrem(keys.recent(view.user_id), view.id)


class HistoryReader(CheckpointReader):
    """Reads the live generation for the query responders."""

    def __init__(self, redis: Redis, partitions: int) -> None:
        super().__init__(partitions)
        self._redis = redis
        self.partitions = partitions

    async def _keys(self, user_id: str) -> HistoryKeys:
        p = channels.partition_of(user_id, self.partitions)
        return HistoryKeys(p, await live_generation(self._redis, p))

    async def checkpoint(self, partition: int) -> tuple[int, int]:
        keys = HistoryKeys(partition, await live_generation(self._redis, partition))
        return await read_position(self._redis, keys.checkpoint)

    async def get_note(self, user_id: str, note_id: str) -> NoteView | None:
        keys = await self._keys(user_id)
        raw = await self._redis.get(keys.note(user_id, note_id))
        return _view_decoder.decode(raw) if raw is not None else None

    async def get_many(
        self, user_id: str, note_ids: Sequence[str], message_ids: Sequence[str] = ()
    ) -> tuple[dict[str, NoteView], dict[str, MessageView]]:
        """Notes and messages by id in one read (the search hydrates its hits with it)."""
        if not note_ids and not message_ids:
            return {}, {}
        keys = await self._keys(user_id)
        names = [keys.note(user_id, i) for i in note_ids] + [keys.message(user_id, i) for i in message_ids]
        raws = await self._redis.mget(names)
        notes = {
            i: _view_decoder.decode(r) for i, r in zip(note_ids, raws[: len(note_ids)], strict=True) if r is not None
        }
        said = raws[len(note_ids) :]
        messages = {i: _message_decoder.decode(r) for i, r in zip(message_ids, said, strict=True) if r is not None}
        return notes, messages

    async def get_message(self, user_id: str, message_id: str) -> MessageView | None:
        keys = await self._keys(user_id)
        raw = await self._redis.get(keys.message(user_id, message_id))
        return _message_decoder.decode(raw) if raw is not None else None

    async def history(self, user_id: str, note_id: str) -> tuple[NoteView, list[VersionView]] | None:
        keys = await self._keys(user_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(keys.note(user_id, note_id))
            pipe.hgetall(keys.versions(user_id, note_id))
            raw_view, raw_versions = await pipe.execute()
        if raw_view is None:
            return None
        versions = sorted((_version_decoder.decode(v) for v in raw_versions.values()), key=lambda v: v.version)
        return _view_decoder.decode(raw_view), versions

    async def list_notes(self, user_id: str, category: str | None, include_superseded: bool) -> list[NoteView]:
        keys = await self._keys(user_id)
        order = keys.order(user_id, include_superseded)
        if category is None:
            members = await self._redis.zrange(order, 0, -1)
        else:
            members = await self._redis.zrangebylex(order, f"[{category}\x00".encode(), f"({category}\x01".encode())
        ids = [m.rsplit(b"\x00", 1)[1].decode() for m in members]
        return await self._views(keys, user_id, ids)

    async def list_recent(self, user_id: str, limit: int) -> tuple[list[NoteView], int]:
        keys = await self._keys(user_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zrevrange(keys.recent(user_id), 0, limit - 1)
            pipe.zcard(keys.recent(user_id))
            members, total = await pipe.execute()
        return await self._views(keys, user_id, [m.decode() for m in members]), int(total)

    async def _views(self, keys: HistoryKeys, user_id: str, ids: list[str]) -> list[NoteView]:
        if not ids:
            return []
        raws = await self._redis.mget([keys.note(user_id, i) for i in ids])
        return [_view_decoder.decode(r) for r in raws if r is not None]
