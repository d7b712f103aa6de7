"""What the index projection makes of a batch of events, apart from any I/O: the fold of the
events into each note's ``NoteMeta`` and the text to embed (``fold_batch``), then the points the
embedded pieces become (``build_points``). ``IndexProjection`` reads what this needs (the
projection's state, turns and names from the store, the vectors) and writes what it answers."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import msgspec

from engram_ledger.contracts import events
from engram_ledger.services.application.ports import LogEntry
from engram_ledger.services.application.ranking import context_text, context_vector
from engram_ledger.services.application.terms import sparse_document
from engram_ledger.services.application.vector_index import CONVERSATION, MEMORY, IndexPoint, Sparse

_POINT_NAMESPACE = uuid.UUID("0b6d7c55-5c7e-4b0e-8d6f-6a2f4e1c9b21")


def point_id(user_id: str, note_id: str, chunk: int) -> str:
    return str(uuid.uuid5(_POINT_NAMESPACE, f"{user_id}/{note_id}/{chunk}"))


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
    # A turn's context point (its words after the turns before it): its chunk number, the last.
    context_chunk: int | None = None

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


def _ts(at: datetime) -> float:
    return at.timestamp()


def indexed_text(name: str | None, content: str) -> str:
    """A turn as embedded (who said it, then what was said), or a note's chunk as BM25 indexes
    it (whom it is about, then the text): names carry much of the evidence (README: LoCoMo)."""
    return f"{name}: {content}" if name else content


class TurnWindow(Protocol):
    """The last turns of each conversation the batch records messages in (loaded beforehand)."""

    def before(self, event: events.MessageRecorded) -> list[str]: ...

    def retract(self, event: events.MessageRetracted) -> None: ...

    def forget(self, user_id: str, session_id: str) -> None: ...


@dataclass
class BatchChanges:
    """A batch folded per note (by the key of its state). ``texts``: what to embed, (user,
    note, text); ``contexts``: a turn's key -> the text of the turns before it; ``retext``: notes
    whose subject changed and not their content (their text is read from the store);
    ``names``: a note's subject as its latest event names it (a BM25 keyword of its chunks);
    ``touched``: every note the batch changed, (user, note); ``old_chunks``: how many chunks each
    had before."""

    texts: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    contexts: dict[str, list[str]] = field(default_factory=dict)
    retext: dict[str, tuple[str, str]] = field(default_factory=dict)
    names: dict[str, str | None] = field(default_factory=dict)
    forgotten: set[str] = field(default_factory=set)
    touched: dict[str, tuple[str, str]] = field(default_factory=dict)
    old_chunks: dict[str, int] = field(default_factory=dict)


# Told of each event the fold applies, with its log entry, its note's key and the note's meta
# right after it (the timeline plans its versions from these).
Applied = Callable[[LogEntry, str, NoteMeta], None]


def fold_batch(
    batch: Sequence[LogEntry],
    metas: dict[str, NoteMeta | None],
    key_of: Callable[[str, str], str],
    subject_key: Callable[[str, str | None], str | None],
    turns: TurnWindow,
    applied: Applied | None = None,
) -> BatchChanges:
    """Fold the batch into ``metas`` (updated in place) and what the index must change. Events at
    or below a note's indexed version are skipped: a note never goes back."""
    changes = BatchChanges()
    for entry in batch:
        event = entry.event
        if isinstance(event, events.SessionForgotten):
            turns.forget(event.user_id, event.session_id)
        if events.is_control_stream(event.note_id):
            continue  # an erased user's or session's notes each had their own NoteForgotten
        key = key_of(event.user_id, event.note_id)
        meta = metas.get(key)
        if meta is not None and event.version <= meta.version:
            continue
        if meta is not None and meta.subject is not None:
            meta.subject_key, meta.subject = subject_key(event.user_id, meta.subject), None
        if key not in changes.old_chunks:
            changes.old_chunks[key] = meta.chunks if meta is not None else 0
        meta = apply_event(event, key, meta, changes, subject_key, turns)
        if meta is None:
            continue  # an event for a note the index never saw saved: nothing to update
        metas[key] = meta
        changes.touched[key] = (event.user_id, event.note_id)
        if applied is not None:
            applied(entry, key, meta)
    return changes


def apply_event(
    event: Any,
    key: str,
    meta: NoteMeta | None,
    changes: BatchChanges,
    subject_key: Callable[[str, str | None], str | None],
    turns: TurnWindow,
) -> NoteMeta | None:
    """One event on its note's meta (None: a note the index never saw saved), by its type's rule.
    An event the table does not name changes nothing the index shows (``_UNSHOWN``)."""
    rule = _RULES.get(type(event), _UNSHOWN)
    return rule(event, meta, _Applying(key, changes, subject_key, turns))


@dataclass
class _Applying:
    """What an event's rule works with besides its note's meta: the note's key (in ``changes``),
    the batch's changes, how a subject is hashed, and the turns before each new one."""

    key: str
    changes: BatchChanges
    subject_key: Callable[[str, str | None], str | None]
    turns: TurnWindow


_Rule = Callable[[Any, NoteMeta | None, _Applying], NoteMeta | None]


def _saved(event: events.NoteSaved, meta: NoteMeta | None, at: _Applying) -> NoteMeta:
    at.changes.names[at.key] = event.subject
    at.changes.texts[at.key] = (event.user_id, event.note_id, event.content)
    at.changes.forgotten.discard(at.key)
    return NoteMeta(
        version=event.version,
        status="active",
        category=event.category,
        kind=event.kind.value,
        subject_key=at.subject_key(event.user_id, event.subject),
        created_at=_ts(event.at),
        time=_ts(event.occurred_at or event.at),
    )


def _recorded(event: events.MessageRecorded, meta: NoteMeta | None, at: _Applying) -> NoteMeta:
    at.changes.texts[at.key] = (event.user_id, event.note_id, indexed_text(event.speaker, event.content))
    before = at.turns.before(event)
    if before:
        at.changes.contexts[at.key] = before
    return NoteMeta(
        version=event.version,
        status="active",
        category="conversation",
        kind="message",
        created_at=_ts(event.at),
        record=CONVERSATION,
        session_id=event.session_id,
        time=_ts(event.sent_at or event.at),
    )


def _indexed(change: Callable[[Any, NoteMeta, _Applying], None]) -> _Rule:
    """The rule of an event that changes a note the index has (its version, then ``change``); for
    a note it never saw saved, nothing."""

    def rule(event: Any, meta: NoteMeta | None, at: _Applying) -> NoteMeta | None:
        if meta is None:
            return None
        meta.version = event.version
        change(event, meta, at)
        return meta

    return rule


def _updated(event: events.NoteUpdated, meta: NoteMeta, at: _Applying) -> None:
    meta.category = event.category or meta.category
    renamed = False
    if event.subject is not None:
        new_key = at.subject_key(event.user_id, event.subject)
        renamed, meta.subject_key = new_key != meta.subject_key, new_key
        at.changes.names[at.key] = event.subject
    if event.content is not None:
        at.changes.texts[at.key] = (event.user_id, event.note_id, event.content)
    elif renamed:
        at.changes.retext[at.key] = (event.user_id, event.note_id)


def _reverted(event: events.NoteReverted, meta: NoteMeta, at: _Applying) -> None:
    meta.category = event.category
    meta.status = "active"
    meta.subject_key = at.subject_key(event.user_id, event.subject)
    at.changes.names[at.key] = event.subject
    at.changes.texts[at.key] = (event.user_id, event.note_id, event.content)


def _superseded(event: events.NoteSuperseded, meta: NoteMeta, at: _Applying) -> None:
    meta.status = "superseded"


def _forgotten(event: events.NoteForgotten | events.MessageRetracted, meta: NoteMeta, at: _Applying) -> None:
    meta.status = "forgotten"
    meta.subject_key = None
    at.changes.names.pop(at.key, None)
    at.changes.texts.pop(at.key, None)
    at.changes.forgotten.add(at.key)


def _retracted(event: events.MessageRetracted, meta: NoteMeta, at: _Applying) -> None:
    # A retracted turn leaves searches as a forgotten note does (its text stays in the log,
    # sealed, until its session or user is forgotten).
    at.turns.retract(event)
    _forgotten(event, meta, at)


def _nothing_shown(event: Any, meta: NoteMeta, at: _Applying) -> None:
    return None


# A pending deletion requested or lapsed, a renewal, or any event the table does not name: its
# note's version moves on, and nothing the index shows changes.
_UNSHOWN = _indexed(_nothing_shown)

# One rule per event type that the index shows: the note's meta after it, and what to embed.
_RULES: dict[type[events.AnyEvent], _Rule] = {
    events.NoteSaved: _saved,
    events.MessageRecorded: _recorded,
    events.NoteUpdated: _indexed(_updated),
    events.NoteReverted: _indexed(_reverted),
    events.NoteSuperseded: _indexed(_superseded),
    events.NoteForgotten: _indexed(_forgotten),
    events.MessageRetracted: _indexed(_retracted),
}


def pieces_of(changes: BatchChanges, chunked: Mapping[str, list[str]]) -> list[tuple[str, int, str]]:
    """Every chunk to embed, as (note key, chunk, text). A text read after its note was forgotten
    is empty (the content is shredded): it has none."""
    return [
        (key, i, piece) for key, (_, _, text) in changes.texts.items() if text for i, piece in enumerate(chunked[text])
    ]


def context_firsts(changes: BatchChanges, chunked: Mapping[str, list[str]]) -> dict[str, str]:
    """The first chunk of each turn that has turns before it: its context point's own part."""
    texts = changes.texts
    return {key: chunked[texts[key][2]][0] for key in changes.contexts if key in texts and texts[key][2]}


def build_points(
    changes: BatchChanges,
    metas: Mapping[str, NoteMeta | None],
    chunked: Mapping[str, list[str]],
    vectors: Mapping[str, list[float]],
) -> tuple[list[IndexPoint], Counter[str]]:
    """The points of the embedded pieces, and each note's chunk count. A turn is indexed twice:
    its own words, and its words after the turns before it (so "what did she say about it?"
    can match); either point finds the one turn. The context point's vector is the mean of the
    turns' own vectors, so no text is embedded twice."""
    points = []
    pieces = pieces_of(changes, chunked)
    for key, chunk, piece in pieces:
        meta = metas[key]
        # A note's subject is a keyword of every chunk; not of its vector, where it blurs the
        # meaning of the text (docs/performance.md). A turn's speaker is already in its text.
        keywords = indexed_text(changes.names.get(key) if meta and meta.record == MEMORY else None, piece)
        points.append(_point(changes.touched[key], meta, chunk, vectors[piece], sparse_document(keywords)))
    chunk_counts = Counter(p[0] for p in pieces)
    for key, first in context_firsts(changes, chunked).items():
        before = changes.contexts[key]
        window = [vectors[chunked[t][0]] for t in before] + [vectors[first]]
        sparse = sparse_document(context_text(changes.texts[key][2], before))
        point = _point(changes.touched[key], metas[key], chunk_counts[key], context_vector(window), sparse)
        points.append(msgspec.structs.replace(point, payload=point.payload | {"context": True}))
        chunk_counts[key] += 1
    return points, chunk_counts


def _point(ids: tuple[str, str], meta: NoteMeta | None, chunk: int, dense: list[float], sparse: Sparse) -> IndexPoint:
    assert meta is not None
    user_id, note_id = ids
    payload = meta.payload(user_id, note_id, chunk)
    return IndexPoint(id=point_id(user_id, note_id, chunk), dense=dense, sparse=sparse, payload=payload)
