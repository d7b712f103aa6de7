"""A note's reads (``access_count``, ``last_accessed_at``): which reads count, and what a reply
shows of them. A get and each note a search returns count; a listing, a reading of the past and
a person looking in the console do not. Every reply of the present shows the count as the read
it answers leaves it, so a get, a search, a listing and the console agree on the same note."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from engram_ledger.contracts.model import NoteView, Origin
from engram_ledger.services.application.recalls import CONSOLE


def counted(origin: Origin | None) -> bool:
    """Whether a read from ``origin`` counts: not the console's (a person looking at a user's
    memory, which its searches' recalls are not recorded as either)."""
    return origin is None or origin.channel != CONSOLE


def to_ms(at: datetime) -> int:
    """A read's time as it is kept (milliseconds since the epoch)."""
    return int(at.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def read_at(view: NoteView, at: datetime) -> NoteView:
    """``view`` (its reads so far) as a read at ``at`` leaves it: what is kept for it after."""
    return msgspec.structs.replace(view, access_count=view.access_count + 1, last_accessed_at=from_ms(to_ms(at)))
