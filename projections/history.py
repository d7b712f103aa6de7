"""The history read model in Redis: each note's current view, every version, a deterministic
per-user listing and a recency listing.

Keys live under a *generation* (``engram:{p}:hist:<gen>:...``); ``engram:{p}:hist:live`` names the
generation queries read. A rebuild fills a fresh generation from position zero and switches the
pointer, so queries never see a half-built model. Every write transaction WATCHes the live pointer
and the checkpoint (``projections/tracking.py``): a stale writer (an old generation after a
switch, or a second worker that lost its lease) aborts instead of writing.

Views, turns and versions are stored with what the user said sealed under the note's own data
key (``projections/history_records.py``), read with the wrapped key in the same round trip; a
keyed note is found by a keyed hash of its key. What stays readable: ids, times, statuses,
versions, scores and categories (the listings are ordered by category), as in the log.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from engram_ledger.contracts import channels
from engram_ledger.contracts.channels import HistoryKeys, SagaKeys
from engram_ledger.contracts.events import (
    MessageRecorded,
    MessageRetracted,
    NoteForgotten,
    NoteSaved,
    NoteSuperseded,
    SessionForgotten,
    UserForgotten,
    is_control_stream,
)
from engram_ledger.contracts.model import MessageView, NoteStatus, NoteView, VersionView
from engram_ledger.projections.forget_saga import member as saga_member
from engram_ledger.projections.history_model import (
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
from engram_ledger.projections.history_records import (
    MESSAGES,
    NOTES,
    VERSIONS,
    message_label,
    note_label,
    version_label,
)
from engram_ledger.projections.tracking import CheckpointReader, GenerationalProjection, read_generation, read_position
from engram_ledger.services.adapters.crypto import KeyedFields, MasterKey, RecordKey, RecordKeys
from engram_ledger.services.adapters.redis_conn import transaction_client, unlink_prefix
from engram_ledger.services.application.ports import LogEntry


async def live_generation(redis: Redis, partition: int) -> int:
    return await read_generation(redis, HistoryKeys(partition, 0).live)


class _Writes(msgspec.Struct):
    views: dict[str, NoteView]
    # Per note (user, id): its new versions, by version number.
    versions: dict[tuple[str, str], dict[str, VersionView]]
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
    # The keyed hash of each keyed note's key (by view key name): kept beside the sealed view,
    # so the lookup can be dropped when the note is forgotten and its key is no longer readable.
    digests: dict[str, str] = msgspec.field(default_factory=dict)
    # Each touched note's data key (None: forgotten), to seal what is written.
    ciphers: dict[tuple[str, str], Any] = msgspec.field(default_factory=dict)


class HistoryProjection(GenerationalProjection[_Writes]):
    """Writes one generation of one partition's history read model. Besides the checkpoint, an
    event whose note is already at its version or later is skipped, so a replay from a lost
    checkpoint, or out of order, changes nothing either."""

    name = "history"

    def __init__(self, redis: Redis, partition: int, generation: int, master: MasterKey) -> None:
        self.keys = HistoryKeys(partition, generation)
        super().__init__(redis, partition, generation, self.keys)
        self._data_keys = RecordKeys(master)
        self._fields = KeyedFields.from_master(master)

    def _state_keys(self, batch: Sequence[LogEntry]) -> list[str]:
        notes, messages = _touched(batch)
        # The notes' wrapped data keys are read in the same round trip as their views.
        wrapped = [channels.data_key(self.partition, u, n) for u, n in {**notes, **messages}]
        return [
            *(self.keys.note(u, n) for u, n in notes),
            *(self.keys.message(u, n) for u, n in messages),
            *wrapped,
        ]

    async def _plan(self, batch: Sequence[LogEntry], state: dict[str, bytes | None]) -> _Writes:
        notes, messages = _touched(batch)
        ciphers = {
            (u, n): self._data_keys.of(state.get(channels.data_key(self.partition, u, n)), u, n)
            for u, n in {**notes, **messages}
        }
        views: dict[str, NoteView | None] = {}
        digests: dict[str, str] = {}
        for u, n in notes:
            name = self.keys.note(u, n)
            raw = state.get(name)
            views[name] = None
            if raw is not None:
                stored = NOTES.read(raw, ciphers[(u, n)], note_label(u, n))
                views[name] = stored.view
                if stored.keyed is not None:
                    digests[name] = stored.keyed
        turns = {}
        for u, n in messages:
            raw = state.get(self.keys.message(u, n))
            if raw is not None:
                turns[self.keys.message(u, n)] = MESSAGES.read(raw, ciphers[(u, n)], message_label(u, n)).view
        # An erased user's conversation listings, named where their turns were recorded.
        listings = {
            e.event.user_id: {m.decode() for m in await self._redis.smembers(self.keys.sessions(e.event.user_id))}  # type: ignore[misc]
            for e in batch
            if isinstance(e.event, UserForgotten)
        }
        writes = _fold(batch, views, self.keys, self._fields, listings, turns, digests)
        writes.ciphers = ciphers
        return writes

    def _queue(self, pipe: Pipeline, writes: _Writes) -> None:
        keys = self.keys
        ciphers: dict[tuple[str, str], RecordKey | None] = writes.ciphers
        # Erasures first: what the batch wrote before one is already left out of ``writes``,
        # and what it wrote after one (a conversation cleared, then spoken in again) must stay.
        if writes.erased:
            pipe.delete(*writes.erased)
        for user_id, members in writes.stale_members.items():
            pipe.zrem(keys.order(user_id, True), *members)
            pipe.zrem(keys.order(user_id, False), *members)
        for key, view in writes.views.items():
            # A tombstone holds nothing to seal, and its key is gone.
            forgotten = view.status is NoteStatus.FORGOTTEN
            cipher = None if forgotten else ciphers.get((view.user_id, view.id))
            digest = None if forgotten else writes.digests.get(key)
            pipe.set(key, NOTES.encode(view, cipher, note_label(view.user_id, view.id), digest))
            _index(pipe, keys, view)
        for key, message in writes.messages.items():
            cipher = ciphers.get((message.user_id, message.id))
            pipe.set(key, MESSAGES.encode(message, cipher, message_label(message.user_id, message.id)))
        for (user_id, owner), entries in writes.versions.items():
            cipher = ciphers.get((user_id, owner))
            sealed = {
                number: VERSIONS.encode(version, cipher, version_label(user_id, owner, number))
                for number, version in entries.items()
            }
            pipe.hset(keys.versions(user_id, owner), mapping=sealed)  # type: ignore[arg-type]
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


def _touched(batch: Sequence[LogEntry]) -> tuple[dict[tuple[str, str], None], dict[tuple[str, str], None]]:
    """The notes (user, id) whose views a batch reads or writes, and the turns, once each."""
    notes: dict[tuple[str, str], None] = {}
    messages: dict[tuple[str, str], None] = {}
    for entry in batch:
        event = entry.event
        if is_control_stream(event.note_id):
            continue
        if isinstance(event, MessageRecorded | MessageRetracted):
            messages[(event.user_id, event.note_id)] = None
            continue
        notes[(event.user_id, event.note_id)] = None
        if isinstance(event, NoteSuperseded):
            notes[(event.user_id, event.superseded_by)] = None
    return notes, messages


def _fold(
    batch: Sequence[LogEntry],
    views: dict[str, NoteView | None],
    keys: HistoryKeys,
    fields: KeyedFields,
    listings: dict[str, set[str]] | None = None,
    turns: dict[str, MessageView] | None = None,
    digests: dict[str, str] | None = None,
) -> _Writes:
    """The writes a batch makes, computed in memory in log order. ``listings``: the conversation
    listings (relative key names) of each user a batch erases; ``turns``: the read model's
    records of the batch's turns; ``digests``: the keyed hashes stored beside the views."""
    writes = _Writes(views={}, versions={}, stale_members={}, messages={}, digests=dict(digests or {}))
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
                writes.versions.pop((user, note_id), None)
                for key in (keys.note(user, note_id), keys.versions(user, note_id), keys.message(user, note_id)):
                    writes.erased.add(key)
                    writes.views.pop(key, None)
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
        _track_key(writes, keys, fields, key, current, view)
        if current is not None and order_member(current) != order_member(view):
            writes.stale_members.setdefault(event.user_id, set()).add(order_member(current))
        views[key] = view
        writes.views[key] = view
        if isinstance(event, NoteForgotten):
            writes.versions.pop((event.user_id, event.note_id), None)
            writes.dropped.add(keys.versions(event.user_id, event.note_id))
            if current is not None:
                writes.stale_members.setdefault(event.user_id, set()).add(order_member(current))
            continue
        writes.versions.setdefault((event.user_id, event.note_id), {})[str(event.version)] = version_entry(view, event)
        if isinstance(event, NoteSuperseded):
            other_key = keys.note(event.user_id, event.superseded_by)
            other = views.get(other_key)
            if other is not None:
                other = add_supersedes(other, event.note_id)
                views[other_key] = other
                writes.views[other_key] = other
    return writes


def _track_key(
    writes: _Writes, keys: HistoryKeys, fields: KeyedFields, name: str, before: NoteView | None, after: NoteView
) -> None:
    """A keyed note is found by its key while it is active; superseded or forgotten, the key is
    free for a new note (the event store released its claim in the same append). The lookup's
    field is a keyed hash of the key: from the view when it holds its key, else the one stored
    beside it (a forgotten note's view no longer opens)."""
    stored = writes.digests.get(name)
    if after.key is not None:
        writes.digests[name] = fields.digest(after.user_id, after.category, after.key)
    # Only when it stops being active: a note superseded long ago that is forgotten now no
    # longer holds its key, which a newer note may hold.
    was_active = before is not None and before.status is NoteStatus.ACTIVE
    if was_active and before is not None and after.status is not NoteStatus.ACTIVE:
        digest = fields.digest(before.user_id, before.category, before.key) if before.key is not None else stored
        if digest is not None:
            writes.keyed[(keys.keyed(after.user_id), keyed_field(before.category, digest))] = None
    if after.key is not None and after.status is NoteStatus.ACTIVE:
        writes.keyed[(keys.keyed(after.user_id), keyed_field(after.category, writes.digests[name]))] = after.id


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
    """Reads the live generation for the query responders. A sealed value is read with its
    note's wrapped data key in the same round trip (``MGET``), so whether the key still exists
    is checked on every read: one that a forget has deleted, whose tombstone the projection has
    yet to write, reads as absent (the cache of unwrapped keys never opens it)."""

    def __init__(self, redis: Redis, partitions: int, master: MasterKey) -> None:
        super().__init__(partitions)
        self._redis = redis
        self.partitions = partitions
        self._data_keys = RecordKeys(master)
        self._fields = KeyedFields.from_master(master)

    async def _keys(self, user_id: str) -> HistoryKeys:
        p = channels.partition_of(user_id, self.partitions)
        return HistoryKeys(p, await live_generation(self._redis, p))

    def _wrapped(self, user_id: str, ids: Sequence[str]) -> list[str]:
        """The names of the notes' wrapped data keys."""
        p = channels.partition_of(user_id, self.partitions)
        return [channels.data_key(p, user_id, i) for i in ids]

    async def checkpoint(self, partition: int) -> tuple[int, int]:
        keys = HistoryKeys(partition, await live_generation(self._redis, partition))
        return await read_position(self._redis, keys.checkpoint)

    def _note(self, user_id: str, note_id: str, raw: bytes | None, wrapped: bytes | None) -> NoteView | None:
        if raw is None:
            return None
        # None when sealed and its key is gone: forgotten, its tombstone not written yet.
        return NOTES.open(raw, self._data_keys.of(wrapped, user_id, note_id), note_label(user_id, note_id))

    def _message(self, user_id: str, message_id: str, raw: bytes | None, wrapped: bytes | None) -> MessageView | None:
        if raw is None:
            return None
        key = self._data_keys.of(wrapped, user_id, message_id)
        message = MESSAGES.open(raw, key, message_label(user_id, message_id))
        return None if message is None or message.retracted else message

    async def _notes(self, keys: HistoryKeys, user_id: str, ids: Sequence[str]) -> list[NoteView | None]:
        """The views of ``ids``, in order, in one round trip (None: none, or forgotten)."""
        if not ids:
            return []
        raws = await self._redis.mget([keys.note(user_id, i) for i in ids] + self._wrapped(user_id, ids))
        return [self._note(user_id, i, raws[j], raws[len(ids) + j]) for j, i in enumerate(ids)]

    async def get_note(self, user_id: str, note_id: str) -> NoteView | None:
        keys = await self._keys(user_id)
        (view,) = await self._notes(keys, user_id, [note_id])
        return view

    async def get_many(
        self, user_id: str, note_ids: Sequence[str], message_ids: Sequence[str] = ()
    ) -> tuple[dict[str, NoteView], dict[str, MessageView]]:
        """Notes and messages by id in one read (the search hydrates its hits with it)."""
        if not note_ids and not message_ids:
            return {}, {}
        keys = await self._keys(user_id)
        ids = [*note_ids, *message_ids]
        names = [keys.note(user_id, i) for i in note_ids] + [keys.message(user_id, i) for i in message_ids]
        raws = await self._redis.mget(names + self._wrapped(user_id, ids))
        values, wrapped = raws[: len(ids)], raws[len(ids) :]
        notes = {}
        for j, note_id in enumerate(note_ids):
            if (view := self._note(user_id, note_id, values[j], wrapped[j])) is not None:
                notes[note_id] = view
        messages = {}
        for j, message_id in enumerate(message_ids, start=len(note_ids)):
            if (message := self._message(user_id, message_id, values[j], wrapped[j])) is not None:
                messages[message_id] = message
        return notes, messages

    async def get_message(self, user_id: str, message_id: str) -> MessageView | None:
        keys = await self._keys(user_id)
        raw, wrapped = await self._redis.mget(
            [keys.message(user_id, message_id), *self._wrapped(user_id, [message_id])]
        )
        return self._message(user_id, message_id, raw, wrapped)

    async def history(self, user_id: str, note_id: str) -> tuple[NoteView, list[VersionView]] | None:
        keys = await self._keys(user_id)
        # GETs, not an MGET: a Redis Cluster pipeline refuses multi-key commands.
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(keys.note(user_id, note_id))
            for name in self._wrapped(user_id, [note_id]):
                pipe.get(name)
            pipe.hgetall(keys.versions(user_id, note_id))
            raw_view, wrapped, raw_versions = await pipe.execute()
        view = self._note(user_id, note_id, raw_view, wrapped)
        if view is None:
            return None
        key = self._data_keys.of(wrapped, user_id, note_id)
        opened = (VERSIONS.open(v, key, version_label(user_id, note_id, n.decode())) for n, v in raw_versions.items())
        versions = sorted((v for v in opened if v is not None), key=lambda v: v.version)
        return view, versions

    async def get_by_key(self, user_id: str, category: str, key: str) -> NoteView | None:
        keys = await self._keys(user_id)
        digest = self._fields.digest(user_id, category, key)
        # The key itself: a read model written before keys were hashed, until it is rebuilt.
        found = await self._redis.hmget(
            keys.keyed(user_id), [keyed_field(category, digest), keyed_field(category, key)]
        )  # type: ignore[misc]
        note_id = next((n for n in found if n is not None), None)
        if note_id is None:
            return None
        view = await self.get_note(user_id, note_id.decode())
        return view if view is not None and view.status is NoteStatus.ACTIVE and view.key == key else None

    def _ranges(self, category: str | None, category_prefix: str | None) -> list[tuple[bytes, bytes]] | None:
        """The lexical ranges of the listing a filter reads: None for all of it, [] for none."""
        if category is not None:
            if category_prefix is not None and not _under(category, category_prefix):
                return []
            return [_category_range(category)]
        if category_prefix is not None:
            # The category itself, then those under it: '/' sorts after the NUL that ends a
            # category in a member, and '0' right after '/'.
            return [
                _category_range(category_prefix),
                (f"[{category_prefix}/".encode(), f"({category_prefix}0".encode()),
            ]
        return None

    async def list_notes(
        self, user_id: str, category: str | None, include_superseded: bool, category_prefix: str | None = None
    ) -> list[NoteView]:
        keys = await self._keys(user_id)
        order = keys.order(user_id, include_superseded)
        ranges = self._ranges(category, category_prefix)
        members: list[bytes] = []
        if ranges is None:
            members = await self._redis.zrange(order, 0, -1)
        for low, high in ranges or []:
            members += await self._redis.zrangebylex(order, low, high)
        return await self._views(keys, user_id, [_member_id(m) for m in members])

    async def list_page(
        self,
        user_id: str,
        category: str | None,
        include_superseded: bool,
        category_prefix: str | None,
        offset: int,
        limit: int,
        now: datetime,
    ) -> tuple[list[NoteView], int] | None:
        """A page of ``list_notes`` and how many notes the listing holds, reading only that page.
        None when the page cannot be told from the listing alone: a note whose time to live has
        run out may be in it (one on the page, or any of the user's past its expiry in the
        forget saga's state, which lists them until they are forgotten), or a note on the page
        was forgotten meanwhile; the caller then reads the whole listing."""
        keys = await self._keys(user_id)
        p = channels.partition_of(user_id, self.partitions)
        order = keys.order(user_id, include_superseded)
        ranges = self._ranges(category, category_prefix)
        if ranges == []:
            return [], 0
        now_ms = now.astimezone(UTC).timestamp() * 1000
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zrangebyscore(SagaKeys(p).expiries, "-inf", now_ms, start=0, num=_EXPIRED_SCAN)
            if ranges is None:
                pipe.zcard(order)
                pipe.zrange(order, offset, offset + limit - 1)
            else:
                for low, high in ranges:
                    pipe.zlexcount(order, low, high)
            expired, *counts = await pipe.execute()
        mine = saga_member(user_id, "").encode()
        if len(expired) == _EXPIRED_SCAN or any(m.startswith(mine) for m in expired):
            return None
        if ranges is None:
            total, members = int(counts[0]), counts[1]
        else:
            sizes = [int(c) for c in counts]
            total, skip = sum(sizes), offset
            members = []
            for (low, high), size in zip(ranges, sizes, strict=True):
                if skip >= size:
                    skip -= size
                    continue
                members += await self._redis.zrangebylex(order, low, high, start=skip, num=limit - len(members))
                skip = 0
                if len(members) >= limit:
                    break
        views = await self._notes(keys, user_id, [_member_id(m) for m in members])
        if any(v is None or (v.expires_at is not None and v.expires_at <= now) for v in views):
            return None
        return [v for v in views if v is not None], total

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
        ids = [m.decode() for m in members]
        raws = await self._redis.mget([keys.message(user_id, i) for i in ids] + self._wrapped(user_id, ids))
        listed = (self._message(user_id, i, raws[j], raws[len(ids) + j]) for j, i in enumerate(ids))
        return [m for m in listed if m is not None], int(total)

    async def list_recent(self, user_id: str, limit: int) -> tuple[list[NoteView], int]:
        keys = await self._keys(user_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zrevrange(keys.recent(user_id), 0, limit - 1)
            pipe.zcard(keys.recent(user_id))
            members, total = await pipe.execute()
        return await self._views(keys, user_id, [m.decode() for m in members]), int(total)

    async def _views(self, keys: HistoryKeys, user_id: str, ids: list[str]) -> list[NoteView]:
        return [v for v in await self._notes(keys, user_id, ids) if v is not None]


# How many of a partition's notes past their expiry ``list_page`` looks through; with more (the
# forget saga far behind), a page is read from the whole listing.
_EXPIRED_SCAN = 100


def _member_id(member: bytes) -> str:
    return member.rsplit(b"\x00", 1)[1].decode()
