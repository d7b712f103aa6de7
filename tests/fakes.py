"""In-memory adapters of the ports, for unit tests. Held to the same contract as the Redis ones."""

from __future__ import annotations

import asyncio
import hmac
import math
import re
import zlib
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

import msgspec

from engram_ledger.contracts import channels
from engram_ledger.contracts.events import (
    AnyEvent,
    MessageRecorded,
    MessageRetracted,
    NoteForgotten,
    NoteReverted,
    NoteSaved,
    NoteSuperseded,
    UserForgotten,
    is_control_stream,
)
from engram_ledger.contracts.model import MessageView, NoteStatus, NoteView, VersionView
from engram_ledger.projections.history_model import (
    add_supersedes,
    changed_score,
    drop_supersedes,
    evolve_view,
    message_view,
    order_member,
    place_member,
    recent_score,
    relists,
    version_entry,
)
from engram_ledger.projections.index import IndexProjection
from engram_ledger.projections.index_runtime import IndexReader
from engram_ledger.projections.tracking import CheckpointReader
from engram_ledger.services.adapters.crypto import MasterKey, SubjectMatcher
from engram_ledger.services.adapters.event_store import decode_event, decode_outcome
from engram_ledger.services.application.as_of import Listed, Moment, listed, note_as_of
from engram_ledger.services.application.ports import (
    Appended,
    Conflict,
    ContentTaken,
    EventStore,
    ListingPage,
    LoadedNote,
    LogEntry,
    Outcome,
    OutcomeDetail,
)
from engram_ledger.services.application.vector_index import VectorIndex
from engram_ledger.services.domain.appends import StreamAppend
from engram_ledger.services.domain.note import ABSENT, NoteState, fold


class InMemoryEventStore:
    def __init__(self, partitions: int = 1) -> None:
        self.partitions = partitions
        self._notes: dict[tuple[str, str], list[tuple[bytes, str]]] = {}
        self._outcomes: dict[tuple[str, str], Outcome] = {}
        self._logs: dict[int, list[tuple[str, bytes]]] = {p: [] for p in range(partitions)}
        self._clock = 0
        self._contents: dict[tuple[str, str], str] = {}
        self._appended = asyncio.Condition()

    def partition_of(self, user_id: str) -> int:
        return channels.partition_of(user_id, self.partitions)

    async def outcome(self, user_id: str, command_id: str) -> Outcome | None:
        return self._outcomes.get((user_id, command_id))

    def fingerprint(self, user_id: str, request: bytes) -> str:
        return hmac.new(b"in-memory fingerprint key", user_id.encode() + b"\x1f" + request, "sha256").hexdigest()

    async def drop_fingerprints(self, user_id: str, note_ids: Sequence[str]) -> None:
        commands = {decode_event(raw).command_id for i in note_ids for raw, _ in self._notes.get((user_id, i), [])}
        for command_id in commands:
            if (first := self._outcomes.get((user_id, command_id))) is not None:
                detail = msgspec.structs.replace(first.detail, request="")
                self._outcomes[(user_id, command_id)] = msgspec.structs.replace(first, detail=detail)

    async def load(self, user_id: str, note_ids: Sequence[str]) -> dict[str, LoadedNote]:
        loaded = {}
        for note_id in note_ids:
            entries = self._notes.get((user_id, note_id), [])
            state = fold(decode_event(raw) for raw, _ in entries) if entries else ABSENT
            loaded[note_id] = LoadedNote(state=state, position=entries[-1][1] if entries else None)
        return loaded

    async def note_ids(self, user_id: str) -> list[str]:
        return sorted(note_id for user, note_id in self._notes if user == user_id and not is_control_stream(note_id))

    async def content_holder(self, user_id: str, digest: str) -> str | None:
        return self._contents.get((user_id, digest))

    async def append(
        self,
        user_id: str,
        command_id: str,
        appends: Sequence[StreamAppend],
        detail: OutcomeDetail | None = None,
    ) -> Appended | Conflict | ContentTaken:
        # No await before the writes: atomic with respect to other coroutines.
        first = self._outcomes.get((user_id, command_id))
        if first is not None:
            return Appended(outcome=first, replayed=True)
        for item in appends:
            current = len(self._notes.get((user_id, item.note_id), []))
            if current != item.expected_version:
                return Conflict(note_id=item.note_id, actual_version=current)
            for digest in item.claims:
                holder = self._contents.get((user_id, digest))
                if holder is not None and holder != item.note_id:
                    return ContentTaken(note_id=item.note_id, holder=holder)
        if not any(item.events for item in appends):
            raise ValueError("an append must carry at least one event")
        log = self._logs[self.partition_of(user_id)]
        position = ""
        notes = []
        for item in appends:
            for digest in item.releases:
                if self._contents.get((user_id, digest)) == item.note_id:
                    del self._contents[(user_id, digest)]
            for digest in item.claims:
                self._contents[(user_id, digest)] = item.note_id
            stream = self._notes.setdefault((user_id, item.note_id), [])
            for event in item.events:
                self._clock += 1
                position = f"{self._clock}-0"
                raw = msgspec.json.encode(event)
                log.append((position, raw))
                stream.append((raw, position))
            if item.events:
                notes.append((item.note_id, len(stream)))
        # Through the wire format, as the Redis store keeps it.
        outcome = decode_outcome(msgspec.json.encode(Outcome(position, notes, detail or OutcomeDetail())))
        self._outcomes[(user_id, command_id)] = outcome
        return Appended(outcome=outcome, replayed=False)

    async def read_log(self, partition: int, after: str, count: int, block_ms: int | None = None) -> list[LogEntry]:
        done = channels.parse_entry_id(after)
        entries = [(p, raw) for p, raw in self._logs[partition] if channels.parse_entry_id(p) > done][:count]
        return [LogEntry(position=p, event=decode_event(raw)) for p, raw in entries]

    async def log_head(self, partition: int) -> tuple[str | None, int]:
        log = self._logs[partition]
        return (log[-1][0] if log else None), len(log)


# -- Read models and the other ports -------------------------------------------------------------


class InMemoryHistory(CheckpointReader):
    """The history read model (``projections/history.py``) in memory, following an event
    store's logs with the pure rules of ``projections/history_model.py``: the application's
    ``NoteHistory`` and ``PastReader`` (``tests/integration/test_past_reader_contract.py`` holds
    it and ``HistoryReader`` to one contract). ``following``: every read first applies what is
    new (a projection that is never behind); otherwise only ``catch_up()`` does, so a test can
    hold the read model behind the log."""

    def __init__(self, store: EventStore, following: bool = True) -> None:
        super().__init__(known_partitions=store.partitions)
        self._store = store
        self.following = following
        self._applied: dict[int, str] = {}
        self._views: dict[tuple[str, str], NoteView] = {}
        self._versions: dict[tuple[str, str], dict[int, VersionView]] = {}
        self._messages: dict[tuple[str, str], MessageView] = {}
        # When each note last changed, and last changed in a way that can move it in or out of
        # a listing (``HistoryKeys.changed``, ``relisted``): milliseconds.
        self._changed: dict[tuple[str, str], float] = {}
        self._relisted: dict[tuple[str, str], float] = {}

    async def catch_up(self) -> int:
        """Apply every event not applied yet; returns how many."""
        applied = 0
        for p in range(self._store.partitions):
            batch = await self._store.read_log(p, self._applied.get(p, "0"), 1 << 30)
            for entry in batch:
                self._apply(entry.event, entry.position)
            if batch:
                self._applied[p] = batch[-1].position
            applied += len(batch)
        return applied

    def _apply(self, event: AnyEvent, position: str) -> None:
        # As HistoryProjection._fold: erasures, control streams, messages, then the note's view.
        if isinstance(event, UserForgotten):
            for note_id in event.erased:
                for model in (self._views, self._versions, self._messages, self._changed, self._relisted):
                    model.pop((event.user_id, note_id), None)
            return
        if is_control_stream(event.note_id):
            return
        key = (event.user_id, event.note_id)
        if isinstance(event, MessageRecorded):
            self._messages[key] = message_view(event)
            return
        if isinstance(event, MessageRetracted):
            self._messages.pop(key, None)
            return
        if isinstance(event, NoteForgotten):
            self._messages.pop(key, None)
        current = self._views.get(key)
        if (current is not None and current.version >= event.version) or (
            current is None and not isinstance(event, NoteSaved)
        ):
            return
        view = self._views[key] = evolve_view(current, event)
        self._changed[key] = changed_score(event, position)
        if relists(event):
            self._relisted[key] = changed_score(event, position)
        self._versions.setdefault(key, {})[event.version] = version_entry(view, event, position)
        if isinstance(event, NoteForgotten):
            # Its versions stay without their words, with the forget's own entry: as the log keeps them.
            blank = {"content": "", "subject": None, "value": None, "origin": None}
            self._versions[key] = {n: msgspec.structs.replace(v, **blank) for n, v in self._versions[key].items()}
            return
        if isinstance(event, NoteSuperseded):
            other = self._views.get((event.user_id, event.superseded_by))
            if other is not None:
                self._views[(event.user_id, event.superseded_by)] = add_supersedes(other, event.note_id)
        if isinstance(event, NoteReverted) and event.replaced_by is not None:
            other = self._views.get((event.user_id, event.replaced_by))
            if other is not None:
                self._views[(event.user_id, event.replaced_by)] = drop_supersedes(other, event.note_id)

    async def _follow(self) -> None:
        if self.following:
            await self.catch_up()

    async def checkpoint(self, partition: int) -> tuple[int, int]:
        await self._follow()
        applied = self._applied.get(partition)
        return channels.parse_entry_id(applied) if applied else (0, 0)

    async def get_note(self, user_id: str, note_id: str) -> NoteView | None:
        await self._follow()
        return self._views.get((user_id, note_id))

    async def get_many(
        self, user_id: str, note_ids: Sequence[str], message_ids: Sequence[str] = ()
    ) -> tuple[dict[str, NoteView], dict[str, MessageView]]:
        await self._follow()
        notes = {i: v for i in note_ids if (v := self._views.get((user_id, i))) is not None}
        return notes, {i: m for i in message_ids if (m := self._messages.get((user_id, i))) is not None}

    async def get_message(self, user_id: str, message_id: str) -> MessageView | None:
        await self._follow()
        return self._messages.get((user_id, message_id))

    async def history(self, user_id: str, note_id: str) -> tuple[NoteView, list[VersionView]] | None:
        await self._follow()
        view = self._views.get((user_id, note_id))
        if view is None:
            return None
        if view.status is NoteStatus.FORGOTTEN:
            return view, []  # its versions went with its words (their plain parts serve the past)
        return view, self._versions_of(user_id, note_id)

    def _versions_of(self, user_id: str, note_id: str) -> list[VersionView]:
        versions = self._versions.get((user_id, note_id), {})
        return [versions[v] for v in sorted(versions)]

    async def get_by_key(self, user_id: str, category: str, key: str) -> NoteView | None:
        await self._follow()
        found = [
            v
            for (user, _), v in self._views.items()
            if user == user_id and v.status is NoteStatus.ACTIVE and v.key == key and v.category == category
        ]
        return found[0] if found else None

    async def list_notes(
        self, user_id: str, category: str | None, include_superseded: bool, category_prefix: str | None = None
    ) -> list[NoteView]:
        await self._follow()
        listed = [
            v
            for (user, _), v in self._views.items()
            if user == user_id
            and (v.status is NoteStatus.ACTIVE or (include_superseded and v.status is NoteStatus.SUPERSEDED))
            and (category is None or v.category == category)
            and (category_prefix is None or f"{v.category}/".startswith(f"{category_prefix}/"))
        ]
        return sorted(listed, key=order_member)

    async def list_page(self, user_id: str, page: ListingPage) -> tuple[list[NoteView], int] | None:
        listed = await self.list_notes(user_id, page.category, page.include_superseded, page.category_prefix)
        if any(v.expires_at is not None and v.expires_at <= page.now for v in listed):
            return None  # as the real one when a note has lapsed: the caller reads the listing
        return listed[page.offset : page.offset + page.limit], len(listed)

    async def categories(self, user_id: str, prefix: str | None, keyed_only: bool = False) -> list[str]:
        listed = await self.list_notes(user_id, None, False, prefix)
        return sorted({v.category for v in listed if v.key is not None or not keyed_only})

    async def messages(self, user_id: str, session_id: str, limit: int | None) -> tuple[list[MessageView], int]:
        await self._follow()
        # Recorded order: the log's, which the fake keeps as insertion order of the dict.
        said = [m for (user, _), m in self._messages.items() if user == user_id and m.session_id == session_id]
        return (said[-limit:] if limit else said), len(said)

    async def list_recent(self, user_id: str, limit: int) -> tuple[list[NoteView], int]:
        await self._follow()
        active = [v for (user, _), v in self._views.items() if user == user_id and v.status is NoteStatus.ACTIVE]
        # As ZREVRANGE: the highest score first, ties by member (the id), also descending.
        active.sort(key=lambda v: (recent_score(v), v.id), reverse=True)
        return active[:limit], len(active)

    # -- The past (``PastReader``) --

    def partition_of(self, user_id: str) -> int:
        return self._store.partition_of(user_id)

    async def histories(self, user_id: str, note_ids: Sequence[str]) -> dict[str, tuple[NoteView, list[VersionView]]]:
        await self._follow()
        found = {n: self._views.get((user_id, n)) for n in note_ids}
        return {n: (view, self._versions_of(user_id, n)) for n, view in found.items() if view is not None}

    async def notes_at(self, user_id: str, note_ids: Sequence[str], moment: Moment) -> dict[str, NoteView | None]:
        found = await self.histories(user_id, note_ids)
        return {n: note_as_of(*found[n], moment) if n in found else None for n in note_ids}

    async def changed_since(self, user_id: str, ms: int) -> list[str]:
        await self._follow()
        return self._since(self._changed, user_id, ms)

    async def relisted_since(self, user_id: str, ms: int) -> list[str]:
        await self._follow()
        return self._since(self._relisted, user_id, ms)

    @staticmethod
    def _since(scores: dict[tuple[str, str], float], user_id: str, ms: int) -> list[str]:
        # As ZRANGEBYSCORE: by score, ties by member.
        return [n for (u, n), at in sorted(scores.items(), key=lambda x: (x[1], x[0][1])) if u == user_id and at >= ms]

    async def listing(self, user_id: str, include_superseded: bool) -> list[Listed]:
        return [listed(v) for v in await self.list_notes(user_id, None, include_superseded)]

    async def listing_window(
        self, user_id: str, include_superseded: bool, start: int, stop: int
    ) -> tuple[list[Listed], int]:
        places = await self.listing(user_id, include_superseded)
        return places[start:stop], len(places)

    async def listing_ranks(self, user_id: str, include_superseded: bool, places: Sequence[Listed]) -> list[int]:
        listing = [place_member(p) for p in await self.listing(user_id, include_superseded)]
        return [sum(m < place_member(p) for m in listing) for p in places]

    async def expired_by(self, user_id: str, ms: int) -> list[str]:
        await self._follow()
        # As the forget saga's expiries: notes put with a time to live, until they are forgotten.
        return sorted(
            (
                v.id
                for (u, _), v in self._views.items()
                if u == user_id
                and v.status is not NoteStatus.FORGOTTEN
                and v.expires_at is not None
                and v.expires_at.timestamp() * 1000 <= ms
            ),
        )


class InMemoryAccess:
    """``AccessStats`` (``projections/access.py``): counts and last-access times per note, at the
    millisecond precision Redis keeps."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.times: dict[tuple[str, str], datetime] = {}

    async def touch(self, user_id: str, note_ids: Iterable[str], at: datetime) -> None:
        ms = datetime.fromtimestamp(int(at.timestamp() * 1000) / 1000, UTC)
        for note_id in dict.fromkeys(note_ids):
            self.counts[(user_id, note_id)] = self.counts.get((user_id, note_id), 0) + 1
            self.times[(user_id, note_id)] = ms

    async def annotate(self, user_id: str, views: Sequence[NoteView]) -> list[NoteView]:
        out = []
        for view in views:
            key = (user_id, view.id)
            if key not in self.counts and key not in self.times:
                out.append(view)
            else:
                count, at = self.counts.get(key, 0), self.times.get(key)
                out.append(msgspec.structs.replace(view, access_count=count, last_accessed_at=at))
        return out

    async def forget(self, user_id: str, note_ids: Sequence[str] | None = None) -> None:
        for model in (self.counts, self.times):
            for key in [k for k in model if k[0] == user_id and (note_ids is None or k[1] in note_ids)]:
                del model[key]


class InMemoryPendingDeletions:
    """``PendingDeletions`` (the forget saga's view) derived from the store's folded states: a
    stream whose state has ``forget_expires_at`` set awaits its confirmation. As in the saga,
    the account and session streams a pending erasure lives on count too."""

    def __init__(self, store: InMemoryEventStore) -> None:
        self._store = store

    async def _deadlines(self, user_id: str) -> dict[str, datetime]:
        log = await self._store.read_log(self._store.partition_of(user_id), "0", 1 << 30)
        streams = list(dict.fromkeys(e.event.note_id for e in log if e.event.user_id == user_id))
        loaded = await self._store.load(user_id, streams)
        return {i: at for i, n in loaded.items() if (at := n.state.forget_expires_at) is not None}

    async def of(self, user_id: str) -> list[str]:
        return sorted(await self._deadlines(user_id))

    async def due(self, partition: int, now_ms: float) -> list[tuple[str, str, float]]:
        return await self._passed(partition, now_ms, lambda s: s.forget_expires_at)

    async def expiring(self, partition: int, now_ms: float) -> list[tuple[str, str, float]]:
        return await self._passed(partition, now_ms, lambda s: None if s.forgotten else s.expires_at)

    async def _passed(
        self, partition: int, now_ms: float, when: Callable[[NoteState], datetime | None]
    ) -> list[tuple[str, str, float]]:
        log = await self._store.read_log(partition, "0", 1 << 30)
        found = []
        for user_id in dict.fromkeys(e.event.user_id for e in log):
            streams = list(dict.fromkeys(e.event.note_id for e in log if e.event.user_id == user_id))
            for note_id, loaded in (await self._store.load(user_id, streams)).items():
                at = when(loaded.state)
                if at is not None and (deadline := at.timestamp() * 1000) <= now_ms:
                    found.append((user_id, note_id, deadline))
        return sorted(found, key=lambda d: d[2])


class RecordingScrub:
    """``Scrub``: records its calls (``owe``, ``wait``, ``scrub``); ``scrubbed`` is set by a scrub."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.scrubbed = asyncio.Event()

    async def owe(self) -> None:
        self.calls.append("owe")

    async def wait_until_acknowledged(self, timeout: float) -> None:
        self.calls.append("wait")

    async def scrub(self) -> bool:
        self.calls.append("scrub")
        self.scrubbed.set()
        return True


# -- The search's side: a stand-in embedder and the index runtime -------------------------------


class HashEmbedder:
    """A deterministic stand-in for MiniLM: a text's words hashed into a unit vector, so texts
    that share words are near and texts that share none are orthogonal or nearly so."""

    model_name = "tests/hashed-words"
    dimension = 64
    ready = True
    loading_seconds = 0.0

    async def start(self) -> None:
        pass

    async def embed(self, texts: Sequence[str], *, background: bool = False) -> list[list[float]]:
        return [self._vector(t) for t in texts]

    def chunks(self, text: str) -> list[str]:
        return [text]

    def _vector(self, text: str) -> list[float]:
        vector = [0.0] * self.dimension
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            vector[zlib.crc32(word.encode()) % self.dimension] += 1.0
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        return [x / norm for x in vector]


class _ProjectionKeys:
    """The index projection's own keys (its note states, conversation tails and checkpoint) in a
    dict: the reads it and ``IndexReader`` make of Redis."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.lists: dict[str, list[bytes]] = {}

    async def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    async def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self.values.get(k) for k in keys]

    async def lpos(self, key: str, value: str) -> int | None:
        found = self.lists.get(key, [])
        return found.index(value.encode()) if value.encode() in found else None

    async def lrange(self, key: str, start: int, end: int) -> list[bytes]:
        return self.lists.get(key, [])[start : end + 1]


class InMemoryIndexRuntime:
    """The application's ``SearchableIndex`` port as ``IndexRuntime`` offers it (``index``,
    ``embedder``, ``subject_key``, and ``wait_for`` through the real ``IndexReader``, which reads
    the checkpoint from ``redis``), over a real vector index.
    ``catch_up()`` runs the real ``IndexProjection``'s plan over the store's logs, so the points
    and payloads are the production ones; its state and checkpoint are kept in a dict."""

    def __init__(self, store: InMemoryEventStore, index: VectorIndex, embedder: HashEmbedder) -> None:
        self.redis = _ProjectionKeys()
        self.index = index
        # This runtime keeps no past (searches as of a moment are refused, as where none is kept).
        self.timeline = None
        self.embedder = embedder
        self.subjects = SubjectMatcher.from_master(MasterKey(bytes(32)))
        self.generation = 0
        self._store = store
        self._projections = [
            IndexProjection(self.redis, index, embedder, p, 0, store=store, subjects=self.subjects)  # type: ignore[arg-type]
            for p in range(store.partitions)
        ]

    def subject_key(self, user_id: str, subject: str) -> str:
        return self.subjects.match_key(user_id, subject)

    opened = True

    async def wait_opened(self) -> None:
        return

    async def wait_for(self, token: str, timeout: float) -> bool:
        return await IndexReader(self).wait_for(token, timeout)  # type: ignore[arg-type]

    async def wait_for_past(self, token: str, timeout: float) -> bool:
        """It keeps no timeline: a search of the past is refused once the live index is there."""
        return await self.wait_for(token, timeout)

    async def catch_up(self) -> int:
        """Index every event not indexed yet; returns how many."""
        applied = 0
        for projection in self._projections:
            after = await projection.checkpoint() or "0"
            batch = await self._store.read_log(projection.partition, after, 1 << 30)
            if not batch:
                continue
            keys = projection._state_keys(batch)
            writes = await projection._plan(batch, dict(zip(keys, await self.redis.mget(keys), strict=True)))
            for key, value in writes.values.items():
                if value is None:
                    self.redis.values.pop(key, None)
                else:
                    self.redis.values[key] = value
            for key in writes.drops:
                self.redis.lists.pop(key, None)
            for key, ids in writes.pushes.items():
                self.redis.lists.setdefault(key, []).extend(i.encode() for i in ids)
            self.redis.values[projection.keys.checkpoint] = batch[-1].position.encode()
            applied += len(batch)
        return applied


class ManualClock:
    """A clock the test moves by hand (``clock.now = ...``)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now
