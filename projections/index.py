"""The vector index projection: notes (and conversation messages) chunked, embedded (dense
MiniLM + BM25) and upserted into the vector index, fed from the event log like the history one.

Its own state lives in Redis beside the log: per note the indexed version, filter fields and
chunk count, and per partition the checkpoint, written in one WATCHed transaction after the
index writes. Index writes are idempotent (point ids derive from user, note and chunk), so a
crash between the two replays the batch harmlessly; a note never goes back to an older version
because events at or below its indexed version are skipped.

Generations: ``engram:{p}:idx:live`` names the live generation; a rebuild (``engram rebuild
index``, e.g. for a new embedding model) fills a fresh shard directory or collection and
switches the pointer; queries keep using the old one until then. The timeline of every version
(``projections/timeline.py``) is a projection of its own, with its own state and checkpoint, in
the same generations; ``PointsProjection`` is what the two share.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import msgspec
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from engram_ledger.contracts.channels import IndexKeys
from engram_ledger.contracts.events import (
    MessageRecorded,
    MessageRetracted,
    is_control_stream,
)
from engram_ledger.projections.index_model import (
    BatchChanges,
    NoteMeta,
    build_points,
    context_firsts,
    fold_batch,
    indexed_text,
    pieces_of,
)
from engram_ledger.projections.tracking import GenerationalProjection, StaleProjection, read_generation
from engram_ledger.services.adapters.crypto import SubjectMatcher
from engram_ledger.services.adapters.redis_conn import transaction_client
from engram_ledger.services.application.ports import EventStore, LogEntry
from engram_ledger.services.application.ranking import CONTEXT_TURNS
from engram_ledger.services.application.vector_index import CONVERSATION, Embedder, IndexPoint, VectorIndex


async def live_index_generation(redis: Redis, partition: int) -> int:
    return await read_generation(redis, IndexKeys(partition, 0).live)


_meta_decoder = msgspec.json.Decoder(NoteMeta)
_tail_decoder = msgspec.json.Decoder(list[str])


@dataclass
class StateWrites:
    """What a batch writes of the projection's own state: values to set (None: delete), turns
    to append to each conversation's order, orders to drop (their conversation was erased)."""

    values: dict[str, bytes | None]
    pushes: dict[str, list[str]]
    drops: set[str]


class PointsProjection(GenerationalProjection[StateWrites]):
    """What the live index and its timeline (``projections/timeline.py``) share: notes and turns
    kept as points in a vector index, and in Redis, under the projection's keys, each note's
    ``NoteMeta`` and each conversation's last turns, folded from the log (``index_model``).

    The vector index is written while planning, before the transaction: its writes are
    idempotent, so a transaction that then fails replays them harmlessly. The plan is what is
    left: the projection's own keys to set (None: delete)."""

    rebuild_batch = 256
    # Where its state is kept, by partition and generation.
    keys_of: ClassVar[type[IndexKeys]]

    def __init__(
        self,
        redis: Redis,
        index: VectorIndex,
        embedder: Embedder,
        partition: int,
        generation: int,
        *,
        store: EventStore,
        subjects: SubjectMatcher,
    ) -> None:
        self.keys = self.keys_of(partition, generation)
        super().__init__(redis, partition, generation, self.keys)
        self._store = store
        self._subjects = subjects
        self.index = index
        self._embedder = embedder

    def _state_keys(self, batch: Sequence[LogEntry]) -> list[str]:
        return list(dict.fromkeys(self.keys.note(e.event.user_id, e.event.note_id) for e in batch))

    async def _loaded(
        self, batch: Sequence[LogEntry], state: dict[str, bytes | None]
    ) -> tuple[dict[str, NoteMeta | None], _Turns]:
        """The notes' metas before the batch, and the last turns of the conversations it records in."""
        metas = {k: (_meta_decoder.decode(r) if r is not None else None) for k, r in state.items()}
        turns = _Turns(self._redis, self._store, self.keys, batch)
        await turns.load()
        return metas, turns

    def _writes(self, metas: dict[str, NoteMeta | None], changed: set[str], turns: _Turns) -> StateWrites:
        values: dict[str, bytes | None] = {key: msgspec.json.encode(metas[key]) for key in changed}
        for key, tail in turns.tails().items():
            values[key] = msgspec.json.encode(tail) if tail else None
        pushes, drops = turns.orders()
        return StateWrites(values, pushes, drops)

    def _queue(self, pipe: Pipeline, writes: StateWrites) -> None:
        for key, value in writes.values.items():
            if value is None:
                pipe.delete(key)
            else:
                pipe.set(key, value)
        for key in writes.drops:  # before the pushes: a turn recorded after the erasure starts anew
            pipe.delete(key)
        for key, ids in writes.pushes.items():
            pipe.rpush(key, *ids)

    async def _points(
        self, changes: BatchChanges, metas: Mapping[str, NoteMeta | None]
    ) -> tuple[list[IndexPoint], Counter[str], dict[str, str]]:
        """The points of the texts ``changes`` holds, embedded; each note's chunk count; the turns
        that have a context point (``context_firsts``)."""
        chunked = {t: self._embedder.chunks(t) for _, _, t in changes.texts.values() if t}  # a tokenizer run each
        chunked |= {
            t: self._embedder.chunks(t) for before in changes.contexts.values() for t in before if t not in chunked
        }
        firsts = context_firsts(changes, chunked)
        earlier = {chunked[t][0] for key in firsts for t in changes.contexts[key]}
        unique = list(dict.fromkeys([p[2] for p in pieces_of(changes, chunked)] + sorted(earlier)))
        vectors = dict(zip(unique, await self._embedder.embed(unique, background=True), strict=True)) if unique else {}
        points, chunk_counts = build_points(changes, metas, chunked, vectors)
        return points, chunk_counts, firsts

    async def _drop_contexts(
        self, followers: dict[str, list[str]], turns: _Turns, metas: dict[str, NoteMeta | None]
    ) -> set[str]:
        """The turns recorded after a turn that is now retracted held its words in their context
        points (the text and the mean vector of the turns before them): those points go. The
        turns keep their own points, and a search still finds them by their own words."""
        users = {retracted: user for (user, _), retracted, _ in turns.retracted}
        wanted = {self.keys.note(users[r], t): (users[r], t) for r, after in followers.items() for t in after}
        missing = [key for key in wanted if key not in metas]
        if missing:
            for key, raw in zip(missing, await self._redis.mget(missing), strict=True):
                metas[key] = _meta_decoder.decode(raw) if raw is not None else None
        changed = set()
        for key, (user_id, note_id) in wanted.items():
            meta = metas[key]
            if meta is None or meta.context_chunk is None:
                continue
            await self.index.delete(user_id, note_id, from_chunk=meta.context_chunk)
            meta.chunks, meta.context_chunk = meta.context_chunk, None
            changed.add(key)
        return changed

    async def apply(self, batch: Sequence[LogEntry], *, live: bool = True) -> None:
        try:
            await super().apply(batch, live=live)
        except StaleProjection:
            # This writer lost the projection (its lease, a switch) after writing the index: what
            # it wrote may have landed after its successor's writes for the same notes, a
            # forget's deletions among them. The successor writes those notes again (``repair``).
            touched = {
                json.dumps([e.event.user_id, e.event.note_id]) for e in batch if not is_control_stream(e.event.note_id)
            }
            if touched:
                await self._redis.sadd(self.keys.recheck, *touched)
            raise

    async def repair(self) -> int:
        """Write again, from this projection's own state, the notes a writer that lost the
        projection reported (``apply``; ``_rewrite`` says how). In a transaction on the
        checkpoint, as ``apply``. Returns how many notes were written again."""
        reported = await self._redis.smembers(self.keys.recheck)
        if not reported:
            return 0
        notes = {self.keys.note(u, n): (u, n) for u, n in (json.loads(m) for m in reported)}
        redis = await transaction_client(self._redis, self.keys.checkpoint)
        async with redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(self.keys.checkpoint, *self._guards())
                _, *values = await pipe.mget([self.keys.checkpoint, *self._guards(), *notes])
                self._check(values[: len(self._guards())])
                stored = zip(notes, values[len(self._guards()) :], strict=True)
                metas = {k: (_meta_decoder.decode(r) if r is not None else None) for k, r in stored}
                changed = await self._rewrite(notes, metas)
                pipe.multi()
                for key in changed:
                    pipe.set(key, msgspec.json.encode(metas[key]))
                pipe.srem(self.keys.recheck, *reported)
                await pipe.execute()
            except WatchError as e:
                raise StaleProjection() from e
        return len(notes)

    @abstractmethod
    async def _rewrite(self, notes: dict[str, tuple[str, str]], metas: dict[str, NoteMeta | None]) -> set[str]:
        """Write the reported ``notes`` (by the key of their state) again outside Redis, from
        their ``metas``; the keys of the metas that changed."""

    def _subject_key(self, user_id: str, subject: str | None) -> str | None:
        return self._subjects.match_key(user_id, subject) if subject is not None else None


class IndexProjection(PointsProjection):
    """The live index: each note's current text and filter fields, each turn's words."""

    name = "index"
    keys_of = IndexKeys

    async def _plan(self, batch: Sequence[LogEntry], state: dict[str, bytes | None]) -> StateWrites:
        """Fold the batch per note, then write each changed note's final state to the index."""
        metas, turns = await self._loaded(batch, state)
        changes = fold_batch(batch, metas, self.keys.note, self._subject_key, turns)
        changed = await self._write_changes(changes, metas)
        changed |= await self._drop_contexts(await turns.followers(2 * CONTEXT_TURNS), turns, metas)
        return self._writes(metas, changed, turns)

    async def _write_changes(self, changes: BatchChanges, metas: dict[str, NoteMeta | None]) -> set[str]:
        """Re-embed notes whose text changed, set payload on notes whose fields changed, delete
        the points of notes forgotten."""
        await self._from_store(changes.retext, changes.texts, changes.names, changes.forgotten, metas)
        points, chunk_counts, firsts = await self._points(changes, metas)
        await self.index.upsert(points)
        for key, (user_id, note_id) in changes.touched.items():
            meta = metas[key]
            if meta is None or key in changes.forgotten:
                await self.index.delete(user_id, note_id)
                if meta is not None:
                    meta.chunks = 0
            elif key in changes.texts:
                chunks = chunk_counts[key]
                if changes.old_chunks[key] > chunks:
                    await self.index.delete(user_id, note_id, from_chunk=chunks)
                meta.chunks = chunks
                meta.context_chunk = chunks - 1 if key in firsts else None
            else:
                await self.index.set_payload(user_id, note_id, meta.filter_fields())
        return {key for key in changes.touched if metas[key] is not None}

    async def _rewrite(self, notes: dict[str, tuple[str, str]], metas: dict[str, NoteMeta | None]) -> set[str]:
        """A forgotten note's points deleted, a live note's re-embedded from the store (a turn's
        without the turns before it: its context point goes until the turn is indexed again)."""
        return await self._write_changes(await self._as_stored(notes, metas), metas)

    async def _as_stored(self, notes: dict[str, tuple[str, str]], metas: dict[str, NoteMeta | None]) -> BatchChanges:
        """The changes that write each note as this projection's state and the store hold it."""
        changes = BatchChanges()
        for user_id in {u for u, _ in notes.values()}:
            mine = {k: n for k, (u, n) in notes.items() if u == user_id}
            loaded = await self._store.load(user_id, list(mine.values()))
            for key, note_id in mine.items():
                meta, state = metas[key], loaded[note_id].state
                changes.touched[key] = (user_id, note_id)
                changes.old_chunks[key] = meta.chunks if meta is not None else 0
                if meta is None or meta.status == "forgotten" or not state.content:
                    changes.forgotten.add(key)
                elif meta.record == CONVERSATION:
                    changes.texts[key] = (user_id, note_id, indexed_text(state.speaker, state.content))
                else:
                    changes.texts[key] = (user_id, note_id, state.content)
                    changes.names[key] = state.subject
        return changes

    async def _from_store(
        self,
        retext: dict[str, tuple[str, str]],
        texts: dict[str, tuple[str, str, str]],
        names: dict[str, str | None],
        forgotten: set[str],
        metas: dict[str, NoteMeta | None],
    ) -> None:
        """What the index keeps no text of is read from the event store. A note renamed (a new
        subject, the same content) is indexed again (its subject is one of its keywords), with
        its content; a note whose content changed is indexed with its subject. The store may be
        further on (a later update or forget), whose own event then settles the note. The
        vectors come from the embedder's cache."""
        wanted = {k: ids for k, ids in retext.items() if k not in texts and k not in forgotten}
        unnamed = {
            k: (u, n)
            for k, (u, n, _) in texts.items()
            if k not in names and (meta := metas.get(k)) is not None and meta.subject_key is not None
        }
        for user_id in {u for u, _ in (wanted | unnamed).values()}:
            mine = {k: n for k, (u, n) in (wanted | unnamed).items() if u == user_id}
            loaded = await self._store.load(user_id, list(mine.values()))
            for key, note_id in mine.items():
                state = loaded[note_id].state
                if key in unnamed:
                    names[key] = state.subject
                elif state.content and metas[key] is not None:
                    texts[key] = (user_id, note_id, state.content)


class _Turns:
    """The last turns of each conversation a batch records messages in, in log order: their
    ids are kept per session in the projection's state (``IndexKeys.session``); their text is
    read from the event store (the index keeps none), so a rebuild sees the same context."""

    def __init__(self, redis: Redis, store: EventStore, keys: IndexKeys, batch: Sequence[LogEntry]) -> None:
        self._redis = redis
        self._store = store
        self._keys = keys
        self._sessions = list(
            dict.fromkeys(
                (e.event.user_id, e.event.session_id)
                for e in batch
                if isinstance(e.event, MessageRecorded | MessageRetracted)
            )
        )
        self._recent: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._changed: set[tuple[str, str]] = set()
        # The turns this batch records, per session in order, and the turns it retracts with
        # those recorded before each: what ``followers`` reads.
        self.recorded: dict[tuple[str, str], list[str]] = {}
        self.retracted: list[tuple[tuple[str, str], str, list[str]]] = []
        self._erased: set[tuple[str, str]] = set()

    async def load(self) -> None:
        if not self._sessions:
            return
        raw = await self._redis.mget([self._keys.session(u, s) for u, s in self._sessions])
        for (user_id, session_id), value in zip(self._sessions, raw, strict=True):
            ids = _tail_decoder.decode(value) if value is not None else []
            loaded = await self._store.load(user_id, ids) if ids else {}
            self._recent[(user_id, session_id)] = [
                (i, indexed_text(loaded[i].state.speaker, loaded[i].state.content))
                for i in ids
                # A forgotten turn is no context, nor is a retracted one.
                if loaded[i].state.content and not loaded[i].state.retracted
            ]

    def before(self, event: MessageRecorded) -> list[str]:
        """The text of the turns before this one in its session; then this one joins them. A
        turn read after its session was erased (its content shredded) is no context, as when
        the live projection reads it back from the store."""
        if not event.content:
            return []
        session = (event.user_id, event.session_id)
        recent = self._recent.setdefault(session, [])
        texts = [text for _, text in recent]
        recent.append((event.note_id, indexed_text(event.speaker, event.content)))
        del recent[: max(0, len(recent) - CONTEXT_TURNS)]
        self._changed.add(session)
        self.recorded.setdefault(session, []).append(event.note_id)
        return texts

    def retract(self, event: MessageRetracted) -> None:
        """A retracted turn is no context for the turns after it; those indexed before it was
        retracted lose their context points (``PointsProjection._drop_contexts``)."""
        session = (event.user_id, event.session_id)
        recent = self._recent.setdefault(session, [])
        recent[:] = [(i, text) for i, text in recent if i != event.note_id]
        self._changed.add(session)
        self.retracted.append((session, event.note_id, list(self.recorded.get(session, []))))

    def forget(self, user_id: str, session_id: str) -> None:
        """The session was erased: a turn recorded in it later starts afresh."""
        self._recent[(user_id, session_id)] = []
        self._changed.add((user_id, session_id))
        self.recorded.pop((user_id, session_id), None)
        self._erased.add((user_id, session_id))

    async def followers(self, limit: int) -> dict[str, list[str]]:
        """For each turn retracted in the batch, the turns recorded after it (and before the
        retraction), at most ``limit``: those whose context held it."""
        found = {}
        for (user_id, session_id), retracted, recorded_before in self.retracted:
            if retracted in recorded_before:
                after = recorded_before[recorded_before.index(retracted) + 1 :]
            else:
                key = self._keys.turns(user_id, session_id)
                at = await self._redis.lpos(key, retracted)
                stored = await self._redis.lrange(key, at + 1, at + limit) if at is not None else []
                after = [i.decode() for i in stored] + recorded_before
            found[retracted] = after[:limit]
        return found

    def orders(self) -> tuple[dict[str, list[str]], set[str]]:
        """The turn ids to append to each session's order, and the orders to drop (erased)."""
        pushes = {self._keys.turns(u, s): ids for (u, s), ids in self.recorded.items() if ids}
        return pushes, {self._keys.turns(u, s) for u, s in self._erased}

    def tails(self) -> dict[str, list[str]]:
        """Each changed session's last turn ids by key (empty: drop the key)."""
        return {self._keys.session(u, s): [i for i, _ in self._recent[(u, s)]] for u, s in self._changed}


def generation_dir(data_dir: Path, generation: int) -> Path:
    return data_dir / "index" / f"g{generation}"


def write_model_record(directory: Path, model: str, dimension: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "engram-index.json").write_text(json.dumps({"model": model, "dimension": dimension}))


def read_model_record(directory: Path) -> dict[str, Any] | None:
    path = directory / "engram-index.json"
    return json.loads(path.read_text()) if path.exists() else None
