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
from contracts.events import (
    MessageRecorded,
    MessageRetracted,
    NoteForgotten,
    NoteSaved,
    NoteSuperseded,
    SessionForgotten,
    UserForgotten,
    is_control_stream,
)
from contracts.model import MessageView, NoteStatus, NoteView, VersionView
from projections.history_model import (
    add_supersedes,
    evolve_view,
    keyed_field,
    message_view,
    order_member,
    recent_score,
    retracted_view,
    said_score,
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
    # Key lookups to set (a note id) or drop (None), by (hash, field), the last word in log order.
    keyed: dict[tuple[str, str], str | None] = msgspec.field(default_factory=dict)
    # Conversation listings: a turn added at its place (a score) or taken out (None).
    said: dict[tuple[str, str], float | None] = msgspec.field(default_factory=dict)
    # Each user's conversation listings, so an erasure of the user can drop them.
    sessions: dict[str, set[str]] = msgspec.field(default_factory=dict)


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
        said = f"{self.keys.prefix}msg:"
        views = {
            k: (_view_decoder.decode(r) if r is not None else None) for k, r in state.items() if not k.startswith(said)
        }
        turns = {k: _message_decoder.decode(r) for k, r in state.items() if k.startswith(said) and r is not None}
        # An erased user's conversation listings, named where their turns were recorded.
        listings = {
            e.event.user_id: {m.decode() for m in await self._redis.smembers(self.keys.sessions(e.event.user_id))}  # type: ignore[misc]
            for e in batch
            if isinstance(e.event, UserForgotten)
        }
        return _fold(batch, views, self.keys, listings, turns)

    def _queue(self, pipe: Pipeline, writes: _Writes) -> None:
        keys = self.keys
        # Erasures first: what the batch wrote before one is already left out of ``writes``,
        # and what it wrote after one (a conversation cleared, then spoken in again) must stay.
        if writes.erased:
            pipe.delete(*writes.erased)
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
        for (name, field), note_id in writes.keyed.items():
            if note_id is None:
                pipe.hdel(name, field)
            else:
                pipe.hset(name, field, note_id)
        for (name, message_id), score in writes.said.items():
            if score is None:
                pipe.zrem(name, message_id)
            else:
                pipe.zadd(name, {message_id: score})
        for user_id, listings in writes.sessions.items():
            pipe.sadd(keys.sessions(user_id), *listings)  # relative names: a rebuild's keys match

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
        if isinstance(event, MessageRecorded | MessageRetracted):
            found[keys.message(event.user_id, event.note_id)] = None
        if isinstance(event, NoteSuperseded):
            found[keys.note(event.user_id, event.superseded_by)] = None
    return list(found)


def _fold(
    batch: Sequence[LogEntry],
    views: dict[str, NoteView | None],
    keys: HistoryKeys,
    listings: dict[str, set[str]] | None = None,
    turns: dict[str, MessageView] | None = None,
) -> _Writes:
    """The writes a batch makes, computed in memory in log order. ``listings``: the conversation
    listings (relative key names) of each user a batch erases; ``turns``: the read model's
    records of the batch's turns."""
    writes = _Writes(views={}, versions={}, stale_members={}, messages={})
    turns = dict(turns or {})
    for entry in batch:
        event = entry.event
        if isinstance(event, UserForgotten):
            user = event.user_id
            said = {keys.prefix + name for name in (listings or {}).get(user, set()) | writes.sessions.pop(user, set())}
            writes.erased |= said | {keys.sessions(user), keys.keyed(user)}
            writes.keyed = {k: v for k, v in writes.keyed.items() if k[0] != keys.keyed(user)}
            writes.said = {k: v for k, v in writes.said.items() if k[0] not in said}
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
        if isinstance(event, SessionForgotten):
            said_key = keys.said(event.user_id, event.session_id)
            writes.erased.add(said_key)
            writes.said = {k: v for k, v in writes.said.items() if k[0] != said_key}
        if is_control_stream(event.note_id):
            continue  # an account or session stream: pending erasures live in the forget saga
        if isinstance(event, MessageRecorded | MessageRetracted):
            message_key = keys.message(event.user_id, event.note_id)
            known = turns.get(message_key)
            if known is not None and known.version >= event.version:
                continue  # applied before (a replay), or retracted already
            said_key = keys.said(event.user_id, event.session_id)
            if isinstance(event, MessageRecorded):
                turns[message_key] = writes.messages[message_key] = message_view(event)
                writes.said[(said_key, event.note_id)] = said_score(entry.position)
                writes.sessions.setdefault(event.user_id, set()).add(said_key[len(keys.prefix) :])
            else:
                turns[message_key] = writes.messages[message_key] = retracted_view(event)
                writes.said[(said_key, event.note_id)] = None
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
        _track_key(writes, keys, current, view)
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


def _track_key(writes: _Writes, keys: HistoryKeys, before: NoteView | None, after: NoteView) -> None:
    """A keyed note is found by its key while it is active; superseded or forgotten, the key is
    free for a new note (the event store released its claim in the same append)."""
    # Only when it stops being active: a note superseded long ago that is forgotten now no
    # longer holds its key, which a newer note may hold.
    was_active = before is not None and before.status is NoteStatus.ACTIVE
    if was_active and before is not None and before.key is not None and after.status is not NoteStatus.ACTIVE:
        writes.keyed[(keys.keyed(after.user_id), keyed_field(before.category, before.key))] = None
    if after.key is not None and after.status is NoteStatus.ACTIVE:
        writes.keyed[(keys.keyed(after.user_id), keyed_field(after.category, after.key))] = after.id


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


def _under(category: str, prefix: str) -> bool:
    """Whether a category is ``prefix`` or below it, by whole segments."""
    return category == prefix or category.startswith(prefix + "/")


def _category_range(category: str) -> tuple[bytes, bytes]:
    return f"[{category}\x00".encode(), f"({category}\x01".encode()


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
        decoded = (_message_decoder.decode(r) for r in said if r is not None)
        messages = {m.id: m for m in decoded if not m.retracted}
        return notes, messages

    async def get_message(self, user_id: str, message_id: str) -> MessageView | None:
        keys = await self._keys(user_id)
        raw = await self._redis.get(keys.message(user_id, message_id))
        message = _message_decoder.decode(raw) if raw is not None else None
        return message if message is not None and not message.retracted else None

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

    async def get_by_key(self, user_id: str, category: str, key: str) -> NoteView | None:
        keys = await self._keys(user_id)
        note_id = await self._redis.hget(keys.keyed(user_id), keyed_field(category, key))  # type: ignore[misc]
        if note_id is None:
            return None
        view = await self.get_note(user_id, note_id.decode())
        return view if view is not None and view.status is NoteStatus.ACTIVE and view.key == key else None

    async def list_notes(
        self, user_id: str, category: str | None, include_superseded: bool, category_prefix: str | None = None
    ) -> list[NoteView]:
        keys = await self._keys(user_id)
        order = keys.order(user_id, include_superseded)
        if category is not None:
            if category_prefix is not None and not _under(category, category_prefix):
                return []
            members = await self._redis.zrangebylex(order, *_category_range(category))
        elif category_prefix is not None:
            # The category itself, then those under it: '/' sorts after the NUL that ends a
            # category in a member, and '0' right after '/'.
            members = await self._redis.zrangebylex(order, *_category_range(category_prefix))
            below = f"[{category_prefix}/".encode(), f"({category_prefix}0".encode()
            members += await self._redis.zrangebylex(order, *below)
        else:
            members = await self._redis.zrange(order, 0, -1)
        ids = [m.rsplit(b"\x00", 1)[1].decode() for m in members]
        return await self._views(keys, user_id, ids)

    async def categories(self, user_id: str, prefix: str | None, keyed_only: bool = False) -> list[str]:
        """The categories of the user's active notes, read off the listing one category at a
        time: each read skips past every member of the category it found. ``keyed_only``: read
        off the key lookup instead (one entry per keyed note)."""
        keys = await self._keys(user_id)
        if keyed_only:
            keyed = {
                field.split(b"\x00", 1)[0].decode()
                async for field, _ in self._redis.hscan_iter(keys.keyed(user_id), count=1000)
            }
            return sorted(n for n in keyed if prefix is None or _under(n, prefix))
        order = keys.order(user_id, False)
        names: list[str] = []
        cursor = f"[{prefix}\x00".encode() if prefix is not None else b"-"
        while True:
            first = await self._redis.zrangebylex(order, cursor, b"+", start=0, num=1)
            if not first:
                break
            category = first[0].split(b"\x00", 1)[0]
            if prefix is not None and not _under(category.decode(), prefix):
                if category.decode() < prefix + "/":  # a sibling such as "prefix-x" lies between
                    cursor = f"[{prefix}/".encode()
                    continue
                break
            names.append(category.decode())
            cursor = b"[" + category + b"\x01"
        return names

    async def messages(self, user_id: str, session_id: str, limit: int | None) -> tuple[list[MessageView], int]:
        """A conversation's listed turns, oldest first (the latest ``limit``), and their number."""
        keys = await self._keys(user_id)
        said = keys.said(user_id, session_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zrange(said, -limit if limit else 0, -1)
            pipe.zcard(said)
            members, total = await pipe.execute()
        if not members:
            return [], int(total)
        raws = await self._redis.mget([keys.message(user_id, m.decode()) for m in members])
        listed = (_message_decoder.decode(r) for r in raws if r is not None)
        return [m for m in listed if not m.retracted], int(total)

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
