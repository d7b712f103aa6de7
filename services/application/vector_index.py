"""The index ports: what the index projection and the search responder need from Qdrant
(``VectorIndex``), from the embedding model (``Embedder``), and from the running index as a whole
(``SearchableIndex``).

Points are chunks of notes (or conversation messages). Their payload holds ids, version, status
and filter fields, never the text: deleting a point in Qdrant does not erase its payload from
disk (Qdrant keeps it in its segment files until they are rewritten), so text lives only in the
read model, which can really delete it.
Adapters: ``QdrantEdgeIndex`` (embedded, in-process) and ``QdrantServerIndex`` (qdrant-client).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

import msgspec

DENSE = "dense"
SPARSE = "bm25"

# Payload fields with an index: the tenant first, then every filter a search can use. A subject
# is personal data that a deleted point's payload would keep on disk: it is filtered on as
# ``subject_key``, its keyed hash (``engram_ledger.services.adapters.crypto.SubjectMatcher``).
KEYWORD_FIELDS = (
    "user_id",
    "note_id",
    "status",
    "category",
    "category_path",
    "kind",
    "subject_key",
    "record",
    "session_id",
)
INTEGER_FIELDS = ("chunk", "version")
# The timeline index's own fields (``projections/timeline_model.py``): when the version a point
# belongs to began and ended, as a time (``time_value``) and as a log position (``position_value``),
# so a search as of a time or of a token filters on the one it has.
FROM_AT, UNTIL_AT, FROM_POSITION, UNTIL_POSITION = "from_at", "until_at", "from_position", "until_position"
# When a point's note or turn happened (seconds since the epoch): sent_at, occurred_at or saved;
# in the timeline index, also its version's bounds.
FLOAT_FIELDS = ("time", FROM_AT, UNTIL_AT, FROM_POSITION, UNTIL_POSITION)

MEMORY = "memory"
CONVERSATION = "conversation"


def position_value(position: str) -> float:
    """A log position as one number (milliseconds, then the sequence within one): exact for
    sequences below 1000 within one millisecond of one partition's log."""
    ms, seq = position.split("-")
    return int(ms) * 1000 + min(int(seq), 999)


def time_value(at: datetime) -> float:
    """A time as the timeline index keeps it: microseconds since the epoch."""
    return float(round(at.timestamp() * 1_000_000))


# The end of a version that is still current: later than any time or position.
OPEN = 1e18


def bounds(began: tuple[float, float], ended: tuple[float, float] = (OPEN, OPEN)) -> dict[str, float]:
    """A timeline point's fields saying when its version held: the (time, position) it began
    and ended."""
    return {FROM_AT: began[0], FROM_POSITION: began[1], UNTIL_AT: ended[0], UNTIL_POSITION: ended[1]}


class Sparse(msgspec.Struct, frozen=True):
    indices: list[int]
    values: list[float]


class IndexPoint(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    dense: list[float]
    sparse: Sparse
    payload: dict[str, Any]


class TimeWindow(msgspec.Struct, frozen=True):
    """Inclusive bounds on a point's ``time`` (seconds since the epoch); ``None``: open."""

    since: float | None = None
    until: float | None = None


ANY_TIME = TimeWindow()

# Inclusive bounds on float payload fields, by field (``None``: open on that side).
Ranges = dict[str, tuple[float | None, float | None]]


class NearestQuery(msgspec.Struct, frozen=True, kw_only=True):
    """Nearest neighbours of one user's points by one vector: ``dense`` (cosine) or ``bm25``
    (sparse, IDF-weighted). ``match`` maps a payload field to a value or to any of a list."""

    user_id: str
    using: str
    dense: list[float] | None = None
    sparse: Sparse | None = None
    match: dict[str, str | list[str]]
    limit: int
    threshold: float | None = None
    window: TimeWindow = ANY_TIME
    # Further bounds on float payload fields (a search of the past: the versions current then).
    ranges: Ranges = msgspec.field(default_factory=dict)
    # The payload fields to return (fewer is faster); None: all of them.
    fields: list[str] | None = None


class IndexHit(msgspec.Struct, frozen=True, kw_only=True):
    point_id: str
    score: float
    payload: dict[str, Any]


class VectorIndex(Protocol):
    async def ensure(self, dimension: int) -> None:
        """Create the collection (or shard) and its payload indexes if missing."""

    async def upsert(self, points: list[IndexPoint]) -> None: ...

    async def delete(self, user_id: str, note_id: str, from_chunk: int = 0) -> None:
        """Delete a note's points with ``chunk >= from_chunk``."""

    async def set_payload(
        self, user_id: str, note_id: str, fields: dict[str, Any], ranges: Ranges | None = None
    ) -> None:
        """Set payload fields on every point of a note (with ``ranges``: those within them)."""

    async def nearest(self, query: NearestQuery) -> list[IndexHit]:
        """Chunk-level hits, best first. Fusing dense and BM25 is the search service's job."""

    async def nearest_many(self, queries: list[NearestQuery]) -> list[list[IndexHit]]:
        """Several ``nearest`` at once (one round trip, one planned batch), results in order."""

    async def count(self, user_id: str | None = None) -> int: ...

    async def payloads(self) -> list[dict[str, Any]]:
        """Every point's payload (for rebuild checks and diagnostics; reads the whole index)."""

    # Whether ``compact`` removes deleted points from the index's files (False where the files
    # are a server's own).
    compacts_files: bool
    # Set by whoever compacts it: called, from any thread, when a delete first leaves points in
    # the files (so that a compaction, and what is reported of it, need not wait for a poll).
    on_owed: Callable[[], None] | None

    def owed_since(self) -> float | None:
        """When the oldest delete whose point is still in the index's files was made (seconds
        since the epoch); None when none is."""

    async def compact(self) -> bool:
        """Rewrite the index's files without the points deleted from it (their vectors, payload
        and ids), if any were; whether it did."""

    async def close(self) -> None: ...


class Embedder(Protocol):
    model_name: str
    dimension: int

    async def start(self) -> None:
        """Load the model, once (later calls wait for that load or return at once)."""

    @property
    def ready(self) -> bool:
        """Whether the model is loaded."""

    @property
    def loading_seconds(self) -> float:
        """How long the model has been loading (0 when it is not loading)."""

    async def embed(self, texts: Sequence[str], *, background: bool = False) -> list[list[float]]:
        """Unit-length vectors, one per text. ``background``: bulk work (the index projection's
        batches), encoded after every waiting query and in slices, so that a query's embedding
        never waits behind a batch."""

    def chunks(self, text: str) -> list[str]:
        """The text cut into pieces that fit the model's window (one piece for short text)."""


class SearchableIndex(Protocol):
    """The live index as searching sees it: the index, the model that embeds queries, how a
    subject becomes the ``subject_key`` points are filtered by, and the wait for a write's token."""

    @property
    def index(self) -> VectorIndex: ...

    @property
    def embedder(self) -> Embedder: ...

    @property
    def timeline(self) -> VectorIndex | None:
        """Every version of every note with when it held (``projections/timeline_model.py``):
        what a search of the past ranks. None where this index keeps no past."""

    def subject_key(self, user_id: str, subject: str) -> str: ...

    @property
    def opened(self) -> bool:
        """Whether the live index is open (searches can be asked of it)."""

    async def wait_opened(self) -> None:
        """Until the live index is open."""

    async def wait_for(self, token: str, timeout: float) -> bool:
        """True once the live index has applied the write ``token`` names; False after ``timeout``."""

    async def wait_for_past(self, token: str, timeout: float) -> bool:
        """As ``wait_for``, for the ``timeline``: a projection of its own, which a search of the
        past must wait for."""
