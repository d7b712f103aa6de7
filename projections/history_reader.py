"""Reading the history read model (``projections/history.py`` writes it): notes, versions,
keyed lookups, the listings by category and recency, and conversations, from the live
generation, for the query responders (the application's ``NoteHistory``), and what a reading
of the past reads (its ``PastReader``: the notes changed since a moment and their versions, the
listing's places now)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from redis.asyncio import Redis

from engram_ledger.contracts import channels
from engram_ledger.contracts.channels import HistoryKeys, SagaKeys
from engram_ledger.contracts.model import MessageView, NoteStatus, NoteView, RecallView, VersionView
from engram_ledger.projections.forget_saga import member as saga_member
from engram_ledger.projections.history import GENERATION_SECONDS, live_generation
from engram_ledger.projections.history_model import keyed_field, place_member
from engram_ledger.projections.history_records import (
    MESSAGES,
    NOTES,
    RECALLS,
    VERSIONS,
    message_label,
    note_label,
    recall_label,
    version_label,
)
from engram_ledger.projections.tracking import CheckpointReader, read_position
from engram_ledger.services.adapters.crypto import KeyedFields, MasterKey, RecordKeys
from engram_ledger.services.application.as_of import SHOWN, Listed, Moment, note_as_of
from engram_ledger.services.application.ports import ListingPage
from engram_ledger.services.common.stages import stage


def _under(category: str, prefix: str) -> bool:
    """Whether a category is ``prefix`` or below it, by whole segments."""
    return category == prefix or category.startswith(prefix + "/")


def _category_range(category: str) -> tuple[bytes, bytes]:
    return f"[{category}\x00".encode(), f"({category}\x01".encode()


class _Made(msgspec.Struct, frozen=True):
    """When a version was made, and how: what a reading of the past looks at first."""

    change: str
    created_at: datetime
    position: str | None = None


_made = msgspec.json.Decoder(_Made)

# A reading of notes at a moment, in one round trip however many notes: KEYS are the user's
# ``changed`` set, then each note's view, wrapped data key and versions hash; ARGV the moment
# (ms), then the note ids. Each note's versions come only when it changed at or after the moment
# (else false: it is as it is now). All its keys are the partition's, so one slot in a cluster.
_NOTES_AT = """
local since = tonumber(ARGV[1])
local found = {}
for i = 2, #ARGV do
  local at = 2 + (i - 2) * 3
  local changed = redis.call('ZSCORE', KEYS[1], ARGV[i])
  found[#found + 1] = redis.call('GET', KEYS[at])
  found[#found + 1] = redis.call('GET', KEYS[at + 1])
  if changed == false or tonumber(changed) >= since then
    found[#found + 1] = redis.call('HGETALL', KEYS[at + 2])
  else
    found[#found + 1] = false
  end
end
return found
"""


class HistoryReader(CheckpointReader):
    """Reads the live generation for the query responders. A sealed value is read with its
    note's wrapped data key in the same round trip (``MGET``), so whether the key still exists
    is checked on every read: one that a forget has deleted, whose tombstone the projection has
    yet to write, reads as absent (the cache of unwrapped keys never opens it)."""

    def __init__(self, redis: Redis, partitions: int, master: MasterKey) -> None:
        super().__init__(partitions)
        self._redis = redis
        # The live generation last seen, by partition, and when it was read (``_keys``).
        self._generations: dict[int, int] = {}
        self._checked: dict[int, float] = {}
        self.partitions = partitions
        self._data_keys = RecordKeys(master)
        self._fields = KeyedFields.from_master(master)
        self._notes_at = redis.register_script(_NOTES_AT)

    async def _keys(self, user_id: str) -> HistoryKeys:
        """The live generation's keys of the user's partition. The generation is read at most
        once every ``GENERATION_SECONDS`` (a read the less on almost every query): a rebuild's
        switch keeps the generation it replaced that long and more before dropping it
        (``HistoryProjection.make_live``), so a reader a little behind reads it whole."""
        p = channels.partition_of(user_id, self.partitions)
        return HistoryKeys(p, await self._live(p))

    async def _live(self, p: int) -> int:
        now = time.monotonic()
        if now - self._checked.get(p, -GENERATION_SECONDS) >= GENERATION_SECONDS:
            self._generations[p] = await live_generation(self._redis, p)
            self._checked[p] = now
        return self._generations[p]

    async def _read_many(self, user_id: str, note_ids: Sequence[str], message_ids: Sequence[str]) -> list[Any]:
        """The views' and the data keys' raw values in one MGET, with the live generation's
        pointer read in the same MGET: the generation last seen is taken to be live (one round
        trip, not two), and read again when the pointer says otherwise (after a rebuild)."""
        p = channels.partition_of(user_id, self.partitions)
        ids = [*note_ids, *message_ids]
        while True:
            generation = self._generations.get(p, 0)
            keys = HistoryKeys(p, generation)
            names = [keys.note(user_id, i) for i in note_ids] + [keys.message(user_id, i) for i in message_ids]
            *raws, live = await self._redis.mget([*names, *self._wrapped(user_id, ids), HistoryKeys(p, 0).live])
            live = int(live) if live is not None else 0
            self._generations[p] = live
            self._checked[p] = time.monotonic()
            if live == generation:
                return raws

    def _wrapped(self, user_id: str, ids: Sequence[str]) -> list[str]:
        """The names of the notes' wrapped data keys."""
        p = channels.partition_of(user_id, self.partitions)
        return [channels.data_key(p, user_id, i) for i in ids]

    async def checkpoint(self, partition: int) -> tuple[int, int]:
        keys = HistoryKeys(partition, await self._live(partition))
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
        with stage("reading hits from the read model"):
            raws = await self._read_many(user_id, note_ids, message_ids)
        ids = [*note_ids, *message_ids]
        with stage("unsealing them"):
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
        if view.status is NoteStatus.FORGOTTEN:
            return view, []  # its versions went with its words (their plain parts serve the past)
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

    async def list_page(self, user_id: str, page: ListingPage) -> tuple[list[NoteView], int] | None:
        """A page of ``list_notes`` and how many notes the listing holds, reading only that page.
        None when the page cannot be told from the listing alone: a note whose time to live has
        run out may be in it (one on the page, or any of the user's past its expiry in the
        forget saga's state, which lists them until they are forgotten), or a note on the page
        was forgotten meanwhile; the caller then reads the whole listing."""
        keys = await self._keys(user_id)
        p = channels.partition_of(user_id, self.partitions)
        order = keys.order(user_id, page.include_superseded)
        ranges = self._ranges(page.category, page.category_prefix)
        offset, limit, now = page.offset, page.limit, page.now
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

    async def recalls(
        self, user_id: str, since: datetime | None, until: datetime | None, session_id: str | None, limit: int
    ) -> list[RecallView]:
        """The user's recalls, newest first, without their queries (only the event store opens
        those). A session filter reads on until ``limit`` of that session are found."""
        keys = await self._keys(user_id)
        high = until.timestamp() * 1000 if until is not None else "+inf"
        low = f"({since.timestamp() * 1000}" if since is not None else "-inf"
        found: list[RecallView] = []
        start = 0
        while len(found) < limit:
            ids = [
                i.decode()
                for i in await self._redis.zrevrangebyscore(keys.recalls(user_id), high, low, start=start, num=limit)
            ]
            if not ids:
                break
            start += len(ids)
            raws = await self._redis.mget([keys.recall(user_id, i) for i in ids] + self._wrapped(user_id, ids))
            for j, recall_id in enumerate(ids):
                raw, wrapped = raws[j], raws[len(ids) + j]
                if raw is None:
                    continue
                key = self._data_keys.of(wrapped, user_id, recall_id)
                view = RECALLS.open(raw, key, recall_label(user_id, recall_id))
                if view is not None and (session_id is None or view.session_id == session_id):
                    found.append(view)
        return found[:limit]

    # -- The past (``PastReader``) --

    def partition_of(self, user_id: str) -> int:
        return channels.partition_of(user_id, self.partitions)

    async def histories(self, user_id: str, note_ids: Sequence[str]) -> dict[str, tuple[NoteView, list[VersionView]]]:
        if not note_ids:
            return {}
        keys = await self._keys(user_id)
        wrapped_names = self._wrapped(user_id, note_ids)
        # GETs, not MGETs: a Redis Cluster pipeline refuses multi-key commands.
        async with self._redis.pipeline(transaction=False) as pipe:
            for note_id, wrapped_name in zip(note_ids, wrapped_names, strict=True):
                pipe.get(keys.note(user_id, note_id))
                pipe.get(wrapped_name)
                pipe.hgetall(keys.versions(user_id, note_id))
            raws = await pipe.execute()
        found = {}
        for j, note_id in enumerate(note_ids):
            raw_view, wrapped, raw_versions = raws[3 * j : 3 * j + 3]
            view = self._note(user_id, note_id, raw_view, wrapped)
            if view is None:
                continue
            key = self._data_keys.of(wrapped, user_id, note_id)
            opened = (
                VERSIONS.open(v, key, version_label(user_id, note_id, n.decode())) for n, v in raw_versions.items()
            )
            found[note_id] = view, sorted((v for v in opened if v is not None), key=lambda v: v.version)
        return found

    async def notes_at(self, user_id: str, note_ids: Sequence[str], moment: Moment) -> dict[str, NoteView | None]:
        """Each note as it was at ``moment`` (None: not saved yet), in one round trip: a note
        unchanged since reads as it is now; a note changed since from its versions, opening only
        the one it was at then (the others are read in plain text: times, statuses)."""
        if not note_ids:
            return {}
        keys = await self._keys(user_id)
        names = [keys.changed(user_id)]
        for note_id, wrapped_name in zip(note_ids, self._wrapped(user_id, note_ids), strict=True):
            names += [keys.note(user_id, note_id), wrapped_name, keys.versions(user_id, note_id)]
        raws = await self._notes_at(keys=names, args=[moment.ms, *note_ids])
        found: dict[str, NoteView | None] = {}
        for j, note_id in enumerate(note_ids):
            raw_view, wrapped, flat = raws[3 * j : 3 * j + 3]
            view = self._note(user_id, note_id, raw_view, wrapped)
            if view is None or flat is None:
                found[note_id] = view
                continue
            versions = self._versions_then(user_id, note_id, wrapped, flat, moment)
            found[note_id] = None if versions is None else note_as_of(view, versions, moment)
        return found

    def _versions_then(
        self, user_id: str, note_id: str, wrapped: bytes | None, flat: list[bytes], moment: Moment
    ) -> list[VersionView] | None:
        """What ``note_as_of`` needs of the versions made by ``moment``, from a versions hash as
        a flat list (field, value, ...): the last one, opened (it holds the words then), after
        the last that changed the words, in plain parts (when they differ). None: none was made
        by then. Read newest first, each decoded only as far as when it was made."""
        raw_versions = dict(zip(flat[::2], flat[1::2], strict=True))
        then: list[VersionView] = []
        for number in sorted(raw_versions, key=int, reverse=True):
            raw = raw_versions[number]
            made = VERSIONS.plain(raw, _made)
            if not moment.covers(made.created_at, made.position):
                continue
            if not then:
                key = self._data_keys.of(wrapped, user_id, note_id)
                opened = VERSIONS.open(raw, key, version_label(user_id, note_id, number.decode()))
                then.append(opened if opened is not None else VERSIONS.shell(raw))
            elif made.change in SHOWN:
                then.insert(0, VERSIONS.shell(raw))
            if made.change in SHOWN:
                break
        return then if then or not raw_versions else None

    async def relisted_since(self, user_id: str, ms: int) -> list[str]:
        keys = await self._keys(user_id)
        return [m.decode() for m in await self._redis.zrangebyscore(keys.relisted(user_id), ms, "+inf")]

    async def listing_window(
        self, user_id: str, include_superseded: bool, start: int, stop: int
    ) -> tuple[list[Listed], int]:
        """Places ``start`` to ``stop`` (exclusive) of the listing as it is now, and its size."""
        keys = await self._keys(user_id)
        order = keys.order(user_id, include_superseded)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zrange(order, start, stop - 1) if stop > start else pipe.zrange(order, 1, 0)
            pipe.zcard(order)
            members, size = await pipe.execute()
        return [_listed(m) for m in members], int(size)

    async def listing_ranks(self, user_id: str, include_superseded: bool, places: Sequence[Listed]) -> list[int]:
        """How many notes of the listing as it is now come before each place."""
        if not places:
            return []
        keys = await self._keys(user_id)
        order = keys.order(user_id, include_superseded)
        async with self._redis.pipeline(transaction=False) as pipe:
            for place in places:
                pipe.zlexcount(order, "-", b"(" + place_member(place))
            return [int(n) for n in await pipe.execute()]

    async def changed_since(self, user_id: str, ms: int) -> list[str]:
        keys = await self._keys(user_id)
        return [m.decode() for m in await self._redis.zrangebyscore(keys.changed(user_id), ms, "+inf")]

    async def listing(self, user_id: str, include_superseded: bool) -> list[Listed]:
        keys = await self._keys(user_id)
        members = await self._redis.zrange(keys.order(user_id, include_superseded), 0, -1)
        return [_listed(m) for m in members]

    async def expired_by(self, user_id: str, ms: int) -> list[str]:
        p = channels.partition_of(user_id, self.partitions)
        mine = saga_member(user_id, "")
        due = await self._redis.zrangebyscore(SagaKeys(p).expiries, "-inf", ms)
        return [m.decode()[len(mine) :] for m in due if m.decode().startswith(mine)]

    async def _views(self, keys: HistoryKeys, user_id: str, ids: list[str]) -> list[NoteView]:
        return [v for v in await self._notes(keys, user_id, ids) if v is not None]


# How many of a partition's notes past their expiry ``list_page`` looks through; with more (the
# forget saga far behind), a page is read from the whole listing.
_EXPIRED_SCAN = 100


def _member_id(member: bytes) -> str:
    return member.rsplit(b"\x00", 1)[1].decode()


def _listed(member: bytes) -> Listed:
    category, created, note_id = member.split(b"\x00")
    return Listed(category.decode(), int(created), note_id.decode())
