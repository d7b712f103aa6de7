"""The ports the application services depend on, and the values that cross them.

The application imports nothing from ``services/adapters`` or Redis: ``RedisEventStore`` and the
Redis read models are the production adapters, ``tests/fakes.py`` has in-memory ones, and
``tests/integration/test_event_store_contract.py`` holds both event stores to one contract, and
``tests/integration/test_past_reader_contract.py`` both readers of the past.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Literal, Protocol

import msgspec

from engram_ledger.contracts.events import AnyEvent
from engram_ledger.contracts.model import MessageView, NoteView, RecallView, VersionView
from engram_ledger.services.application.as_of import Listed, Moment
from engram_ledger.services.domain.appends import StreamAppend
from engram_ledger.services.domain.note import NoteState

# -- What an accepted command leaves behind, so that a retry gets the same reply -------------------


class HeldDraft(msgspec.Struct, frozen=True, array_like=True):
    """A draft of a batch that wrote nothing: an existing note already held its text."""

    index: int
    note_id: str
    version: int


ForgetStatus = Literal["pending", "forgotten", "lapsed"]


class NoteForgetStep(msgspec.Struct, frozen=True, array_like=True):
    """What one ``RequestForget`` did to one note. No preview is stored: it would outlive a forget."""

    note_id: str
    status: ForgetStatus
    request_count: int
    expires_at: str | None  # ISO 8601, while pending


class ErasureStep(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a ``RequestForgetUser``/``RequestForgetSession`` did: asked for confirmation, or erased."""

    status: Literal["pending", "forgotten"]
    # Erased: which notes and messages, and when.
    erased: list[str] = msgspec.field(default_factory=list)
    at: str | None = None
    # Pending: the request count, its deadline and how many notes it would erase.
    count: int = 1
    expires: str | None = None
    notes: int = 0


class OutcomeDetail(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a reply needs besides the notes written; each command kind fills its own field.
    ``request`` is a keyed digest of the command, so a retry can be told from a different request
    under the same command id (empty in outcomes stored before it was kept, and once a forget
    of what the command wrote has removed it)."""

    request: str = ""
    duplicates: list[HeldDraft] = msgspec.field(default_factory=list)
    forget: list[NoteForgetStep] = msgspec.field(default_factory=list)
    user: ErasureStep | None = None


class Outcome(msgspec.Struct, frozen=True):
    """What an accepted command wrote: the log position of its last event and the versions the
    notes it changed are at now (``[note_id, version]`` pairs)."""

    position: str
    notes: list[tuple[str, int]]
    # Stored under "extra" since the first release: kept so older outcomes still answer retries.
    detail: OutcomeDetail = msgspec.field(default_factory=OutcomeDetail, name="extra")


# -- What an append can answer ---------------------------------------------------------------------


class Appended(msgspec.Struct, frozen=True):
    outcome: Outcome
    # True when the command id had an outcome already: nothing was written, this is the first one.
    replayed: bool


class Conflict(msgspec.Struct, frozen=True):
    note_id: str
    actual_version: int


class ContentTaken(msgspec.Struct, frozen=True):
    """The content an append claims is already held by another active note of the user."""

    note_id: str
    holder: str


class LoadedNote(msgspec.Struct, frozen=True):
    state: NoteState
    # Log position of the note's latest event: the token for a no-op reply.
    position: str | None


class LogEntry(msgspec.Struct, frozen=True):
    position: str
    event: AnyEvent


class ListingPage(msgspec.Struct, frozen=True, kw_only=True):
    """A page of a listing: the notes of ``category`` (or of ``category_prefix`` and those under
    it), superseded ones too with ``include_superseded``, from ``offset``, at most ``limit``; a
    note whose time to live ran out by ``now`` is not in it."""

    category: str | None = None
    include_superseded: bool = False
    category_prefix: str | None = None
    offset: int = 0
    limit: int
    now: datetime


# -- The ports -------------------------------------------------------------------------------------


class EventStore(Protocol):
    partitions: int

    def partition_of(self, user_id: str) -> int: ...

    async def outcome(self, user_id: str, command_id: str) -> Outcome | None:
        """The first outcome of an accepted command, or None."""

    def fingerprint(self, user_id: str, request: bytes) -> str:
        """A digest of what a command asked (``unit_of_work.request_body``), kept with its outcome
        to tell a retry from a different request. Keyed: a guess at what was asked cannot be
        checked against it without the store's key."""

    async def drop_fingerprints(self, user_id: str, note_ids: Sequence[str]) -> None:
        """After a forget: remove the fingerprints of every command that wrote to these notes
        (their outcomes stay, so a retry is still answered, only no longer compared)."""

    async def load(self, user_id: str, note_ids: Sequence[str]) -> dict[str, LoadedNote]:
        """Each note's folded state and the log position of its latest event."""

    async def note_ids(self, user_id: str) -> list[str]:
        """Every note and message id the user has a stream for (control streams aside), sorted."""

    async def append(
        self,
        user_id: str,
        command_id: str,
        appends: Sequence[StreamAppend],
        detail: OutcomeDetail | None = None,
    ) -> Appended | Conflict | ContentTaken:
        """Atomically: return the first outcome of a seen command id; refuse if any note is not at
        its expected version or claims a content another note holds; else release and claim the
        content keys, write every event, and store and return the outcome (with ``detail``)."""

    async def content_holder(self, user_id: str, digest: str) -> str | None:
        """The active note holding a content digest, if any."""

    async def read_log(self, partition: int, after: str, count: int, block_ms: int | None = None) -> list[LogEntry]:
        """Events of one partition after a position, in log order."""

    async def log_head(self, partition: int) -> tuple[str | None, int]:
        """The last position of a partition's log and its length."""

    async def recall_queries(self, user_id: str, recall_ids: Sequence[str]) -> dict[str, str | None]:
        """Each recall's query (None: gone with a note it named or the user, or never kept)."""


class NoteHistory(Protocol):
    """The version-history read model (``projections/history.py``), read side."""

    async def checkpoint(self, partition: int) -> tuple[int, int]:
        """The last log position applied in a partition."""

    async def wait_for(self, token: str, timeout: float) -> bool:
        """Until the read model has applied the write a token names; False on timeout. A token
        that names no write (past the end of the log) raises ``INVALID_PARAMETER`` at once."""

    async def get_note(self, user_id: str, note_id: str) -> NoteView | None: ...

    async def get_many(
        self, user_id: str, note_ids: Sequence[str], message_ids: Sequence[str] = ()
    ) -> tuple[dict[str, NoteView], dict[str, MessageView]]: ...

    async def get_message(self, user_id: str, message_id: str) -> MessageView | None: ...

    async def history(self, user_id: str, note_id: str) -> tuple[NoteView, list[VersionView]] | None: ...

    async def get_by_key(self, user_id: str, category: str, key: str) -> NoteView | None:
        """The active note put under ``key`` in ``category``."""

    async def list_notes(
        self, user_id: str, category: str | None, include_superseded: bool, category_prefix: str | None = None
    ) -> list[NoteView]: ...

    async def list_page(self, user_id: str, page: ListingPage) -> tuple[list[NoteView], int] | None:
        """A page of ``list_notes`` (notes whose time to live ran out by ``page.now`` left out)
        and how many notes that listing holds, read without the rest; None when the page cannot
        be told without reading the whole listing."""

    async def categories(self, user_id: str, prefix: str | None, keyed_only: bool = False) -> list[str]:
        """The categories of the user's active notes, sorted (``prefix``: it and those under it;
        ``keyed_only``: of notes put by key)."""

    async def messages(self, user_id: str, session_id: str, limit: int | None) -> tuple[list[MessageView], int]:
        """A conversation's listed turns, oldest first (its latest ``limit``), and how many it has."""

    async def list_recent(self, user_id: str, limit: int) -> tuple[list[NoteView], int]:
        """The most recently used notes and how many notes the user has."""

    async def recalls(
        self, user_id: str, since: datetime | None, until: datetime | None, session_id: str | None, limit: int
    ) -> list[RecallView]:
        """The user's recalls, newest first, without their queries."""


class PastReader(Protocol):
    """The version-history read model as a reading of the past reads it (``as_of``, the changes
    between two moments): the notes changed since a moment, with their histories, and the
    listing as it is now, from which the listing then is told (``past.py``)."""

    def partition_of(self, user_id: str) -> int:
        """The partition whose log holds the user's changes (a token's positions compare there)."""

    async def get_many(
        self, user_id: str, note_ids: Sequence[str], message_ids: Sequence[str] = ()
    ) -> tuple[dict[str, NoteView], dict[str, MessageView]]:
        """Notes and turns as they are now: the past of those unchanged since a moment."""

    async def histories(self, user_id: str, note_ids: Sequence[str]) -> dict[str, tuple[NoteView, list[VersionView]]]:
        """Each note and every version of it, in one round trip (unknown ones left out)."""

    async def notes_at(self, user_id: str, note_ids: Sequence[str], moment: Moment) -> dict[str, NoteView | None]:
        """Each note as it was at ``moment`` (``as_of.note_as_of``; None: not saved yet), in one
        round trip: those unchanged since read as they are now."""

    async def relisted_since(self, user_id: str, ms: int) -> list[str]:
        """As ``changed_since``, for changes that can move a note in or out of a listing (saved,
        a new category, superseded, reverted, forgotten, a new expiry), not new words alone."""

    async def listing_window(
        self, user_id: str, include_superseded: bool, start: int, stop: int
    ) -> tuple[list[Listed], int]:
        """Places ``start`` to ``stop`` (exclusive) of the listing as it is now, and its size."""

    async def listing_ranks(self, user_id: str, include_superseded: bool, places: Sequence[Listed]) -> list[int]:
        """How many notes of the listing as it is now come before each place."""

    async def changed_since(self, user_id: str, ms: int) -> list[str]:
        """The user's notes changed at or after ``ms`` (milliseconds since the epoch), forgotten
        ones included: those a reading of the past cannot take as they are now."""

    async def listing(self, user_id: str, include_superseded: bool) -> list[Listed]:
        """The user's listing as it is now (``NoteHistory.list_notes``' order), by place only."""

    async def expired_by(self, user_id: str, ms: int) -> list[str]:
        """The user's notes whose time to live had run out by ``ms`` and that are not forgotten yet."""


class AccessStats(Protocol):
    """How often and when each note was read (``projections/access.py``)."""

    async def touch(self, user_id: str, note_ids: Iterable[str], at: datetime) -> None: ...

    async def annotate(self, user_id: str, views: Sequence[NoteView]) -> list[NoteView]: ...

    async def forget(self, user_id: str, note_ids: Sequence[str] | None = None) -> None:
        """Drop the counts of some notes, or of the whole user."""


class PendingDeletions(Protocol):
    """The forget saga's view of which deletions await their confirmation."""

    async def of(self, user_id: str) -> list[str]:
        """The user's notes with a pending deletion."""

    async def expiring(self, partition: int, now_ms: float) -> list[tuple[str, str, float]]:
        """Notes whose time to live has run out: (user, note, expiry in ms)."""

    async def due(self, partition: int, now_ms: float) -> list[tuple[str, str, float]]:
        """``(user_id, note_id, deadline_ms)`` of the partition's deletions past their deadline."""


class Scrub(Protocol):
    """Removes copies of plaintext that crypto-shredding cannot reach (``services/adapters/scrub.py``)."""

    async def owe(self) -> None:
        """Record that a forget happened and a quiet-moment scrub is due."""

    async def wait_until_acknowledged(self, timeout: float) -> None: ...

    async def scrub(self) -> bool: ...
