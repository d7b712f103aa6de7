"""The vector index projection: notes (and conversation messages) chunked, embedded (dense
MiniLM + BM25) and upserted into the vector index, fed from the event log like the history one.

Its own state lives in Redis beside the log: per note the indexed version, filter fields and
chunk count, and per partition the checkpoint, written in one WATCHed transaction after the
index writes. Index writes are idempotent (point ids derive from user, note and chunk), so a
crash between the two replays the batch harmlessly; a note never goes back to an older version
because events at or below its indexed version are skipped.

Generations: ``engram:{p}:idx:live`` names the live generation; a rebuild (``engram rebuild
index``, e.g. for a new embedding model) fills a fresh shard directory or collection and
switches the pointer; queries keep using the old one until then.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from engram_ledger.contracts.channels import IndexKeys
from engram_ledger.contracts.events import (
    MessageRecorded,
    MessageRetracted,
    NoteForgotten,
    NoteSaved,
    NoteSuperseded,
    NoteUpdated,
    SessionForgotten,
    is_control_stream,
)
from engram_ledger.projections.tracking import GenerationalProjection, read_generation
from engram_ledger.services.adapters.crypto import SubjectMatcher
from engram_ledger.services.application.ports import EventStore, LogEntry
from engram_ledger.services.application.ranking import CONTEXT_TURNS, context_text, context_vector
from engram_ledger.services.application.terms import sparse_document
from engram_ledger.services.application.vector_index import (
    CONVERSATION,
    MEMORY,
    Embedder,
    IndexPoint,
    Sparse,
    VectorIndex,
)

_POINT_NAMESPACE = uuid.UUID("0b6d7c55-5c7e-4b0e-8d6f-6a2f4e1c9b21")


def point_id(user_id: str, note_id: str, chunk: int) -> str:
    return str(uuid.uuid5(_POINT_NAMESPACE, f"{user_id}/{note_id}/{chunk}"))


async def live_index_generation(redis: Redis, partition: int) -> int:
    return await read_generation(redis, IndexKeys(partition, 0).live)


class NoteMeta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the index knows of a note: enough to build payloads and skip old events. Its
    subject only as ``SubjectMatcher`` hashes it: this state is in Redis (and its AOF) until
    the projection catches up with a forget, which the AOF rewrite does not wait for."""

    version: int
    status: str
    category: str
    kind: str
    subject_key: str | None = None
    created_at: float
    chunks: int = 0
    record: str = MEMORY
    session_id: str | None = None
    # When it happened: a turn's sent_at, an episode's occurred_at, else when it was saved.
    time: float | None = None
    # The subject as written before subjects were hashed: read once, hashed, then dropped.
    subject: str | None = None

    def payload(self, user_id: str, note_id: str, chunk: int) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "user_id": user_id,
            "note_id": note_id,
            "chunk": chunk,
            "version": self.version,
            "status": self.status,
            "category": self.category,
            # The category and each path above it, so a search can take a category with all
            # those under it ("memories" finds "memories/alice").
            "category_path": category_path(self.category),
            "kind": self.kind,
            "record": self.record,
            "created_at": self.created_at,
        }
        if self.subject_key is not None:
            fields["subject_key"] = self.subject_key
        if self.session_id is not None:
            fields["session_id"] = self.session_id
        # Indexed before times were: when it was saved.
        fields["time"] = self.time if self.time is not None else self.created_at
        return fields

    def filter_fields(self) -> dict[str, Any]:
        fields = self.payload("", "", 0)
        for key in ("user_id", "note_id", "chunk"):
            del fields[key]
        return fields


def category_path(category: str) -> list[str]:
    segments = category.split("/")
    return ["/".join(segments[: i + 1]) for i in range(len(segments))]


_meta_decoder = msgspec.json.Decoder(NoteMeta)
_tail_decoder = msgspec.json.Decoder(list[str])


class IndexProjection(GenerationalProjection[dict[str, bytes | None]]):
    """The vector index is written while planning, before the transaction: its writes are
    idempotent, so a transaction that then fails replays them harmlessly. The plan is what is
    left: the projection's own keys to set (None: delete)."""

    name = "index"
    rebuild_batch = 256

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
        self.keys = IndexKeys(partition, generation)
        super().__init__(redis, partition, generation, self.keys)
        self._store = store
        self._subjects = subjects
        self.index = index
        self._embedder = embedder

    def _state_keys(self, batch: Sequence[LogEntry]) -> list[str]:
        return list(dict.fromkeys(self.keys.note(e.event.user_id, e.event.note_id) for e in batch))

    async def _plan(self, batch: Sequence[LogEntry], state: dict[str, bytes | None]) -> dict[str, bytes | None]:
        metas = {k: (_meta_decoder.decode(r) if r is not None else None) for k, r in state.items()}
        turns = _Turns(self._redis, self._store, self.keys, batch)
        await turns.load()
        changed = await self._write_index(batch, metas, turns)
        writes: dict[str, bytes | None] = {key: msgspec.json.encode(metas[key]) for key in changed}
        for key, tail in turns.tails().items():
            writes[key] = msgspec.json.encode(tail) if tail else None
        return writes

    def _queue(self, pipe: Pipeline, writes: dict[str, bytes | None]) -> None:
        for key, value in writes.items():
            if value is None:
                pipe.delete(key)
            else:
                pipe.set(key, value)

    async def _write_index(
        self, batch: Sequence[LogEntry], metas: dict[str, NoteMeta | None], turns: _Turns
    ) -> set[str]:
        """Fold the batch per note, then write each changed note's final state to the index:
        re-embed notes whose text changed, set payload on notes whose fields changed."""
        texts: dict[str, tuple[str, str, str]] = {}  # note key -> (user, note, text)
        contexts: dict[str, list[str]] = {}  # a turn's key -> the text of the turns before it
        retext: dict[str, tuple[str, str]] = {}  # notes whose subject changed, not their content
        # A note's subject as its latest event in the batch names it: a BM25 keyword of its
        # chunks (the meta keeps only its hash; the store is asked for the others).
        names: dict[str, str | None] = {}
        forgotten: set[str] = set()
        touched: dict[str, tuple[str, str]] = {}
        old_chunks: dict[str, int] = {}
        for entry in batch:
            event = entry.event
            if isinstance(event, SessionForgotten):
                turns.forget(event.user_id, event.session_id)
            if is_control_stream(event.note_id):
                continue  # an erased user's or session's notes each had their own NoteForgotten
            key = self.keys.note(event.user_id, event.note_id)
            meta = metas.get(key)
            if meta is not None and event.version <= meta.version:
                continue
            if meta is not None and meta.subject is not None:
                meta.subject_key, meta.subject = self._subject_key(event.user_id, meta.subject), None
            if key not in old_chunks:
                old_chunks[key] = meta.chunks if meta is not None else 0
            if isinstance(event, NoteSaved):
                meta = NoteMeta(
                    version=event.version,
                    status="active",
                    category=event.category,
                    kind=event.kind.value,
                    subject_key=self._subject_key(event.user_id, event.subject),
                    created_at=_ts(event.at),
                    time=_ts(event.occurred_at or event.at),
                )
                names[key] = event.subject
                texts[key] = (event.user_id, event.note_id, event.content)
                forgotten.discard(key)
            elif isinstance(event, MessageRecorded):
                meta = NoteMeta(
                    version=event.version,
                    status="active",
                    category="conversation",
                    kind="message",
                    created_at=_ts(event.at),
                    record=CONVERSATION,
                    session_id=event.session_id,
                    time=_ts(event.sent_at or event.at),
                )
                own = indexed_text(event.speaker, event.content)
                texts[key] = (event.user_id, event.note_id, own)
                before = turns.before(event)
                if before:
                    contexts[key] = before
            elif meta is None:
                continue  # an event for a note the index never saw saved: nothing to update
            elif isinstance(event, NoteUpdated):
                meta.version = event.version
                meta.category = event.category or meta.category
                renamed = False
                if event.subject is not None:
                    subject_key = self._subject_key(event.user_id, event.subject)
                    renamed, meta.subject_key = subject_key != meta.subject_key, subject_key
                    names[key] = event.subject
                if event.content is not None:
                    texts[key] = (event.user_id, event.note_id, event.content)
                elif renamed:
                    retext[key] = (event.user_id, event.note_id)
            elif isinstance(event, NoteSuperseded):
                meta.version = event.version
                meta.status = "superseded"
            elif isinstance(event, NoteForgotten | MessageRetracted):
                if isinstance(event, MessageRetracted):
                    turns.retract(event)
                # A retracted turn leaves searches as a forgotten note does (its text stays in
                # the log, sealed, until its session or user is forgotten).
                meta.version = event.version
                meta.status = "forgotten"
                meta.subject_key = None
                names.pop(key, None)
                texts.pop(key, None)
                forgotten.add(key)
            else:  # a pending deletion requested or lapsed, a renewal: nothing the index shows changes
                meta.version = event.version
            metas[key] = meta
            touched[key] = (event.user_id, event.note_id)

        await self._from_store(retext, texts, names, forgotten, metas)
        # A turn is indexed twice: its own words, and its words after the turns before it (so
        # "what did she say about it?" can match); either point finds the one turn. The context
        # point's vector is the mean of the turns' own vectors, so no text is embedded twice.
        chunked = {t: self._embedder.chunks(t) for _, _, t in texts.values() if t}  # a tokenizer run each
        chunked |= {t: self._embedder.chunks(t) for key in contexts for t in contexts[key] if t not in chunked}
        pieces: list[tuple[str, int, str]] = []  # (note key, chunk, text)
        for key, (_, _, text) in texts.items():
            if text:  # empty when read after its note was forgotten: the content is shredded
                pieces += [(key, i, piece) for i, piece in enumerate(chunked[text])]
        firsts = {key: chunked[texts[key][2]][0] for key in contexts if key in texts and texts[key][2]}
        earlier = {chunked[t][0] for key in firsts for t in contexts[key]}
        unique = list(dict.fromkeys([p[2] for p in pieces] + sorted(earlier)))
        vectors = dict(zip(unique, await self._embedder.embed(unique, background=True), strict=True)) if unique else {}
        points = []
        for key, chunk, piece in pieces:
            meta = metas[key]
            # A note's subject is a keyword of every chunk; not of its vector, where it blurs
            # the meaning of the text (measured: README). A turn's speaker is already in its text.
            keywords = indexed_text(names.get(key) if meta and meta.record == MEMORY else None, piece)
            points.append(self._point(touched[key], meta, chunk, vectors[piece], sparse_document(keywords)))
        chunk_counts = Counter(p[0] for p in pieces)
        for key, first in firsts.items():
            window = [vectors[chunked[t][0]] for t in contexts[key]] + [vectors[first]]
            sparse = sparse_document(context_text(texts[key][2], contexts[key]))
            point = self._point(touched[key], metas[key], chunk_counts[key], context_vector(window), sparse)
            points.append(msgspec.structs.replace(point, payload=point.payload | {"context": True}))
            chunk_counts[key] += 1
        await self.index.upsert(points)
        for key, (user_id, note_id) in touched.items():
            meta = metas[key]
            assert meta is not None
            if key in forgotten:
                await self.index.delete(user_id, note_id)
                meta.chunks = 0
            elif key in texts:
                chunks = chunk_counts[key]
                if old_chunks[key] > chunks:
                    await self.index.delete(user_id, note_id, from_chunk=chunks)
                meta.chunks = chunks
            else:
                await self.index.set_payload(user_id, note_id, meta.filter_fields())
        return set(touched)

    def _subject_key(self, user_id: str, subject: str | None) -> str | None:
        return self._subjects.match_key(user_id, subject) if subject is not None else None

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

    @staticmethod
    def _point(
        ids: tuple[str, str], meta: NoteMeta | None, chunk: int, dense: list[float], sparse: Sparse
    ) -> IndexPoint:
        assert meta is not None
        user_id, note_id = ids
        payload = meta.payload(user_id, note_id, chunk)
        return IndexPoint(id=point_id(user_id, note_id, chunk), dense=dense, sparse=sparse, payload=payload)


def _ts(at: datetime) -> float:
    return at.timestamp()


def indexed_text(name: str | None, content: str) -> str:
    """A turn as embedded (who said it, then what was said), or a note's chunk as BM25 indexes
    it (whom it is about, then the text): names carry much of the evidence (README: LoCoMo)."""
    return f"{name}: {content}" if name else content


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
        return texts

    def retract(self, event: MessageRetracted) -> None:
        """A retracted turn is no context for the turns after it. (Turns indexed before it was
        retracted keep it in their context points; an agent framework retracts the latest.)"""
        session = (event.user_id, event.session_id)
        recent = self._recent.setdefault(session, [])
        recent[:] = [(i, text) for i, text in recent if i != event.note_id]
        self._changed.add(session)

    def forget(self, user_id: str, session_id: str) -> None:
        """The session was erased: a turn recorded in it later starts afresh."""
        self._recent[(user_id, session_id)] = []
        self._changed.add((user_id, session_id))

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
