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

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from engram_ledger.contracts import channels, events
from engram_ledger.contracts.channels import HistoryKeys
from engram_ledger.contracts.model import MessageView, NoteStatus, NoteView, RecallView, VersionView
from engram_ledger.projections.history_model import (
    add_supersedes,
    changed_score,
    drop_supersedes,
    evolve_view,
    keyed_field,
    message_view,
    order_member,
    recent_score,
    relists,
    retracted_view,
    said_score,
    version_entry,
)
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
from engram_ledger.projections.tracking import GenerationalProjection, read_generation
from engram_ledger.services.adapters.crypto import KeyedFields, MasterKey, RecordKey, RecordKeys
from engram_ledger.services.adapters.redis_conn import transaction_client, unlink_prefix
from engram_ledger.services.application.ports import LogEntry

# How long a reader may take a generation it has read to be live (``HistoryReader._keys``); a
# switch keeps the generation it replaced twice that long before dropping it.
GENERATION_SECONDS = 1.0


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
    # When each note written last changed (``HistoryKeys.changed``, ``relisted``), per user.
    changed: dict[str, dict[str, float]] = msgspec.field(default_factory=dict)
    relisted: dict[str, dict[str, float]] = msgspec.field(default_factory=dict)
    # A forgotten note's versions without their words, by versions key (see ``_plan``).
    shells: dict[str, dict[str, bytes]] = msgspec.field(default_factory=dict)
    # Recalls recorded (``MemoryRecalled``), by key, and each user's index of them by time.
    recalls: dict[str, _Recall] = msgspec.field(default_factory=dict)
    recalled: dict[str, dict[str, float]] = msgspec.field(default_factory=dict)


class _Recall:
    """A recall as the read model keeps it: everything but its query (which only the event
    store opens, with the keys of the notes it names)."""

    def __init__(self, event: events.MemoryRecalled) -> None:
        self.user_id = event.user_id
        self.recall_id = event.note_id
        self.view = RecallView(
            recall_id=event.note_id,
            at=event.at,
            kind=event.kind,
            notes=list(event.notes),
            versions=list(event.versions),
            channel=event.origin.channel if event.origin else None,
            session_id=event.origin.session_id if event.origin else None,
            asked=event.query is not None,
        )


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
            if isinstance(e.event, events.UserForgotten)
        }
        # A note forgotten keeps its versions' plain parts (times, statuses, categories) and
        # the forget's time and log position: a reading of the past places its tombstone by them.
        # Its words go with its key.
        forgotten = [
            (e.event.user_id, e.event.note_id)
            for e in batch
            if isinstance(e.event, events.NoteForgotten) and (e.event.user_id, e.event.note_id) in notes
        ]
        kept: dict[str, dict[bytes, bytes]] = {}
        if forgotten:
            async with self._redis.pipeline(transaction=False) as pipe:
                for u, n in forgotten:
                    pipe.hgetall(self.keys.versions(u, n))
                for (u, n), raws in zip(forgotten, await pipe.execute(), strict=True):
                    kept[self.keys.versions(u, n)] = raws
        writes = _fold(batch, views, self.keys, self._fields, listings, turns, digests, kept)
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
        for key, shells in writes.shells.items():
            pipe.hset(key, mapping=shells)  # type: ignore[arg-type]
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
        for user_id, scores in writes.changed.items():
            pipe.zadd(keys.changed(user_id), scores)  # type: ignore[arg-type]
        for user_id, scores in writes.relisted.items():
            pipe.zadd(keys.relisted(user_id), scores)  # type: ignore[arg-type]
        for key, recall in writes.recalls.items():
            cipher = ciphers.get((recall.user_id, recall.recall_id))
            pipe.set(key, RECALLS.encode(recall.view, cipher, recall_label(recall.user_id, recall.recall_id)))
        for user_id, scores in writes.recalled.items():
            pipe.zadd(keys.recalls(user_id), scores)  # type: ignore[arg-type]

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
        # Readers take the generation they read to be live for a moment: they read the old one
        # whole meanwhile.
        await asyncio.sleep(2 * GENERATION_SECONDS)
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
        if events.is_control_stream(event.note_id):
            continue
        if isinstance(event, events.MessageRecorded | events.MessageRetracted):
            messages[(event.user_id, event.note_id)] = None
            continue
        notes[(event.user_id, event.note_id)] = None
        if isinstance(event, events.NoteSuperseded):
            notes[(event.user_id, event.superseded_by)] = None
        if isinstance(event, events.NoteReverted) and event.replaced_by is not None:
            notes[(event.user_id, event.replaced_by)] = None
    return notes, messages


@dataclass
class _Folding:
    """A batch being folded: what it writes, and what it reads. ``views``: the notes' views, kept
    up to date as the batch goes; ``listings``: the conversation listings (relative key names) of
    each user the batch erases; ``turns``: the read model's records of the batch's turns;
    ``stored``: the stored versions of the notes the batch forgets."""

    writes: _Writes
    views: dict[str, NoteView | None]
    keys: HistoryKeys
    fields: KeyedFields
    listings: dict[str, set[str]]
    turns: dict[str, MessageView]
    stored: dict[str, dict[bytes, bytes]]


def _fold(
    batch: Sequence[LogEntry],
    views: dict[str, NoteView | None],
    keys: HistoryKeys,
    fields: KeyedFields,
    listings: dict[str, set[str]] | None = None,
    turns: dict[str, MessageView] | None = None,
    digests: dict[str, str] | None = None,
    stored: dict[str, dict[bytes, bytes]] | None = None,
) -> _Writes:
    """The writes a batch makes, computed in memory in log order, each event by its type's rule
    (``_RULES``; the arguments are ``_Folding``'s). ``digests``: the keyed hashes stored beside
    the views."""
    writes = _Writes(views={}, versions={}, stale_members={}, messages={}, digests=dict(digests or {}))
    folding = _Folding(writes, views, keys, fields, listings or {}, dict(turns or {}), stored or {})
    for entry in batch:
        rule = _RULES.get(type(entry.event))
        if rule is None:
            # Every event the log can hold has a rule here: one without is a bug, never skipped.
            raise TypeError(f"the history has no rule for {type(entry.event).__name__}")
        rule(folding, entry.event, entry.position)
    return writes


def _erase_user(folding: _Folding, event: events.UserForgotten, position: str) -> None:
    """Everything of the user goes, what the batch wrote before the erasure included."""
    keys, writes, user = folding.keys, folding.writes, event.user_id
    said = {keys.prefix + name for name in folding.listings.get(user, set()) | writes.sessions.pop(user, set())}
    writes.erased |= said | {keys.sessions(user), keys.keyed(user)}
    writes.keyed = {k: v for k, v in writes.keyed.items() if k[0] != keys.keyed(user)}
    writes.said = {k: v for k, v in writes.said.items() if k[0] not in said}
    for note_id in event.erased:
        writes.versions.pop((user, note_id), None)
        writes.shells.pop(keys.versions(user, note_id), None)
        for key in (keys.note(user, note_id), keys.versions(user, note_id), keys.message(user, note_id)):
            writes.erased.add(key)
            writes.views.pop(key, None)
            writes.messages.pop(key, None)
            folding.views.pop(key, None)
    listings = {keys.order(user, True), keys.order(user, False), keys.recent(user), keys.changed(user)}
    writes.erased |= listings | {keys.relisted(user), keys.recalls(user)} | {keys.recall(user, n) for n in event.erased}
    writes.stale_members.pop(user, None)
    writes.changed.pop(user, None)
    writes.relisted.pop(user, None)
    writes.recalled.pop(user, None)
    writes.recalls = {k: v for k, v in writes.recalls.items() if v.user_id != user}


def _erase_session(folding: _Folding, event: events.SessionForgotten, position: str) -> None:
    said_key = folding.keys.said(event.user_id, event.session_id)
    folding.writes.erased.add(said_key)
    folding.writes.said = {k: v for k, v in folding.writes.said.items() if k[0] != said_key}


def _recall(folding: _Folding, event: events.MemoryRecalled, position: str) -> None:
    folding.writes.recalls[folding.keys.recall(event.user_id, event.note_id)] = _Recall(event)
    folding.writes.recalled.setdefault(event.user_id, {})[event.note_id] = event.at.timestamp() * 1000


def _new_turn(folding: _Folding, event: events.MessageRecorded | events.MessageRetracted) -> str | None:
    """The turn's record key, unless the read model has this event's version of it already (a
    replay) or a later one (retracted already)."""
    message_key = folding.keys.message(event.user_id, event.note_id)
    known = folding.turns.get(message_key)
    return None if known is not None and known.version >= event.version else message_key


def _recorded(folding: _Folding, event: events.MessageRecorded, position: str) -> None:
    if (message_key := _new_turn(folding, event)) is None:
        return
    writes, said_key = folding.writes, folding.keys.said(event.user_id, event.session_id)
    folding.turns[message_key] = writes.messages[message_key] = message_view(event)
    writes.said[(said_key, event.note_id)] = said_score(position)
    writes.sessions.setdefault(event.user_id, set()).add(said_key[len(folding.keys.prefix) :])


def _retracted(folding: _Folding, event: events.MessageRetracted, position: str) -> None:
    if (message_key := _new_turn(folding, event)) is None:
        return
    folding.turns[message_key] = folding.writes.messages[message_key] = retracted_view(event)
    folding.writes.said[(folding.keys.said(event.user_id, event.session_id), event.note_id)] = None


def _of_a_note(folding: _Folding, event: events.AnyEvent) -> bool:
    """Whether the event is on a note's own stream (or a turn's, for a forget). On a recall's
    stream it can only say that its user was erased: the recall's record and place go."""
    if events.is_control_stream(event.note_id):
        return False  # an account or session stream: pending erasures live in the forget saga
    if events.is_recall(event.note_id):
        folding.writes.erased.add(folding.keys.recall(event.user_id, event.note_id))
        folding.writes.recalls.pop(folding.keys.recall(event.user_id, event.note_id), None)
        return False
    return True


def _apply_to_note(folding: _Folding, event: events.AnyEvent, position: str) -> tuple[NoteView | None, NoteView] | None:
    """The note's view before and after the event, written with when it changed and where it is
    listed; None when the view has this version already, or the note was never saved."""
    keys, writes = folding.keys, folding.writes
    key = keys.note(event.user_id, event.note_id)
    current = folding.views.get(key)
    if current is not None and current.version >= event.version:
        return None
    if current is None and not isinstance(event, events.NoteSaved):
        # An event whose note was never saved cannot be applied; the log is the authority, so
        # this means corruption. Skipping keeps the projection flowing; rebuild will agree.
        return None
    view = evolve_view(current, event)
    _track_key(writes, keys, folding.fields, key, current, view)
    if current is not None and order_member(current) != order_member(view):
        writes.stale_members.setdefault(event.user_id, set()).add(order_member(current))
    folding.views[key] = writes.views[key] = view
    writes.changed.setdefault(event.user_id, {})[event.note_id] = changed_score(event, position)
    if relists(event):
        writes.relisted.setdefault(event.user_id, {})[event.note_id] = changed_score(event, position)
    return current, view


def _changed(folding: _Folding, event: events.AnyEvent, position: str) -> bool:
    """A note's change, and its entry in the note's history; whether it was applied."""
    if not _of_a_note(folding, event):
        return False
    applied = _apply_to_note(folding, event, position)
    if applied is None:
        return False
    entry = version_entry(applied[1], event, position)
    folding.writes.versions.setdefault((event.user_id, event.note_id), {})[str(event.version)] = entry
    return True


def _superseded(folding: _Folding, event: events.NoteSuperseded, position: str) -> None:
    """The replacement's view learns which note it supersedes."""
    if _changed(folding, event, position):
        _change_other(folding, event.user_id, event.superseded_by, lambda other: add_supersedes(other, event.note_id))


def _reverted(folding: _Folding, event: events.NoteReverted, position: str) -> None:
    """A note back from a supersede: its replacement no longer supersedes it."""
    if _changed(folding, event, position) and event.replaced_by is not None:
        _change_other(folding, event.user_id, event.replaced_by, lambda other: drop_supersedes(other, event.note_id))


def _change_other(folding: _Folding, user_id: str, note_id: str, change: Callable[[NoteView], NoteView]) -> None:
    key = folding.keys.note(user_id, note_id)
    other = folding.views.get(key)
    if other is not None:
        folding.views[key] = folding.writes.views[key] = change(other)


def _forgotten(folding: _Folding, event: events.NoteForgotten, position: str) -> None:
    """A note's tombstone, its versions kept without their words; a forgotten turn (its session
    or its user erased) leaves the read model."""
    keys, writes = folding.keys, folding.writes
    if not _of_a_note(folding, event):
        return
    message_key = keys.message(event.user_id, event.note_id)
    writes.messages.pop(message_key, None)
    writes.erased.add(message_key)
    applied = _apply_to_note(folding, event, position)
    if applied is None:
        return
    current, view = applied
    versions_key = keys.versions(event.user_id, event.note_id)
    written = writes.versions.pop((event.user_id, event.note_id), {})
    # The forget itself, with its log position: a reading of the past places it exactly.
    written[str(event.version)] = version_entry(view, event, position)
    writes.shells[versions_key] = _shells(folding.stored.get(versions_key, {}), written)
    writes.dropped.add(versions_key)
    if current is not None:
        writes.stale_members.setdefault(event.user_id, set()).add(order_member(current))


# One rule per event type: what the event writes into the read model, given its log position.
_RULES: dict[type[events.AnyEvent], Callable[[_Folding, Any, str], object]] = {
    events.UserForgotten: _erase_user,
    events.SessionForgotten: _erase_session,
    events.MemoryRecalled: _recall,
    events.MessageRecorded: _recorded,
    events.MessageRetracted: _retracted,
    events.NoteSaved: _changed,
    events.NoteUpdated: _changed,
    events.NoteRenewed: _changed,
    events.NoteSuperseded: _superseded,
    events.NoteReverted: _reverted,
    # A deletion requested or lapsed is a version of its note; on an account or session stream,
    # nothing here (pending erasures live in the forget saga).
    events.ForgetRequested: _changed,
    events.ForgetExpired: _changed,
    events.NoteForgotten: _forgotten,
}


def _shells(stored: dict[bytes, bytes], written: dict[str, VersionView]) -> dict[str, bytes]:
    """Versions without their words (content, subject, value and origin left blank), stored
    in plain text: what the log keeps of a forgotten note too."""
    shells = {number.decode(): VERSIONS.shell(raw) for number, raw in stored.items()} | written
    blank = {"content": "", "subject": None, "value": None, "origin": None}
    return {n: VERSIONS.encode(msgspec.structs.replace(v, **blank), None, b"") for n, v in shells.items()}


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


def live_history(redis: Redis, partition: int, master: MasterKey) -> Callable[[], Awaitable[HistoryProjection]]:
    """Opens the history projection of the partition's live generation (for its runner).
    ``master``: the read model seals what it stores under the notes' data keys, which it wraps."""

    async def open_live() -> HistoryProjection:
        return HistoryProjection(redis, partition, await live_generation(redis, partition), master)

    return open_live
