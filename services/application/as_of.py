"""The memory as it was at a moment, and what changed between two, from the read model's
version histories (each version keeps its time and its log position). Pure functions: the
query responders read, these decide.

A moment is a time (every change made at or before it counts, to the microsecond) or a
consistency token (every change at or before that log position counts, exactly, on the token's
partition). A forget is a change like the others: a forgotten note's history keeps the forget's
time and log position, so the token a forget returned names the moment right after it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

import msgspec

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import TOKEN_PATTERN, parse_time
from engram_ledger.contracts.model import NoteChange, NoteStatus, NoteView, VersionView
from engram_ledger.services.application.vector_index import (
    FROM_AT,
    FROM_POSITION,
    UNTIL_AT,
    UNTIL_POSITION,
    position_value,
    time_value,
)
from engram_ledger.services.domain.note import version_fields

_TOKEN = re.compile(TOKEN_PATTERN)
# The changes a diff shows; the others (a deletion requested or lapsed, a renewal) change no
# content.
SHOWN = {"saved", "updated", "superseded", "reverted"}
# What a version's history entry has kept only since a later release (``VersionView``).
_KEPT_LATER = ("confidence", "importance", "expires_at", "valid_from", "valid_until")
FORGOTTEN = "forgotten"


class Moment(msgspec.Struct, frozen=True):
    """``at``: the moment's time; ``position``: a token's log position, compared on ``partition``."""

    at: datetime
    position: tuple[int, int] | None = None
    partition: int | None = None

    @property
    def ms(self) -> int:
        return int(self.at.timestamp() * 1000)

    def on(self, partition: int) -> Moment:
        """The moment as the user's partition reads it: a token of another partition by its time."""
        return self if self.partition == partition else Moment(self.at)

    def covers(self, at: datetime, position: str | None) -> bool:
        """Whether a change made at ``at``, at log ``position``, had happened by this moment."""
        if self.position is not None and position is not None:
            return channels.parse_entry_id(position) <= self.position
        return at <= self.at


def current_at(moment: Moment) -> dict[str, tuple[float | None, float | None]]:
    """The timeline index's bounds for the versions current at ``moment``: begun at or before
    it, ended after it (by log position for a token, else by time)."""
    if moment.position is not None:
        ms, seq = moment.position
        value = position_value(f"{ms}-{seq}")
        return {FROM_POSITION: (None, value), UNTIL_POSITION: (value + 1, None)}
    value = time_value(moment.at)
    return {FROM_AT: (None, value), UNTIL_AT: (value + 1, None)}


def parse_moment(text: str, name: str = "as_of") -> Moment:
    """An ``AsOf`` value: a token or an ISO 8601 time (without a zone, UTC). ``name``: the
    field it was given as, for the refusal."""
    if _TOKEN.match(text):
        partition, (ms, seq) = channels.parse_token(text)
        return Moment(datetime.fromtimestamp(ms / 1000, UTC), (ms, seq), partition)
    try:
        return Moment(parse_time(text))
    except EngramError:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"{name}: {text!r} is neither an ISO 8601 time (2026-11-24T09:00, UTC if no zone) "
            "nor a consistency token (0:1795612601879-0)",
        ) from None


def note_as_of(view: NoteView, versions: Sequence[VersionView], moment: Moment) -> NoteView | None:
    """The note as it was at ``moment`` (None: not saved yet). A note forgotten since is its
    tombstone: its words went with its key (``versions`` then hold only times, statuses and
    categories), and it is placed by the category it had then."""
    if view.status is NoteStatus.FORGOTTEN:
        shells = [v for v in versions if moment.covers(v.created_at, v.position)]
        if not versions:
            return view if view.created_at <= moment.at else None
        return msgspec.structs.replace(view, category=shells[-1].category) if shells else None
    then = [v for v in versions if moment.covers(v.created_at, v.position)]
    if not then:
        return None
    last = then[-1]
    changed = next((v for v in reversed(then) if v.change in SHOWN), last)
    held = version_fields(last, value=view.key is not None) | {"expires_at": last.expires_at}
    if last.confidence is None:
        # A version recorded before its entry kept these: the current ones stand in.
        held |= {name: getattr(view, name) for name in _KEPT_LATER}
    return msgspec.structs.replace(
        view,
        version=last.version,
        status=last.status,
        superseded_by=last.superseded_by,
        **held,
        updated_at=changed.created_at,
        # Reads are not in the log: what was read when is not part of the past.
        last_accessed_at=None,
        access_count=0,
    )


class Listed(NamedTuple):
    """A note's place in a listing: category, then when it was created (ms), then id."""

    category: str
    created_ms: int
    note_id: str


def listed(view: NoteView) -> Listed:
    return Listed(view.category, int(view.created_at.timestamp() * 1000), view.id)


def listed_as_of(
    view: NoteView, versions: Sequence[VersionView], moment: Moment, include_superseded: bool
) -> NoteView | None:
    """The note as a listing at ``moment`` shows it, or None if it was not in that listing: a
    note forgotten since is its tombstone there if it was listed then (active, or superseded
    with ``include_superseded``, its time to live not run out)."""
    then = note_as_of(view, versions, moment)
    if then is None:
        return None
    if then.status is NoteStatus.FORGOTTEN:
        if forgotten_by(view, versions, moment):
            return None  # forgotten by the moment: gone then too
        shells = [v for v in versions if moment.covers(v.created_at, v.position)]
        if shells:
            last = shells[-1]
            if last.expires_at is not None and last.expires_at <= moment.at:
                return None
            if not (last.status is NoteStatus.ACTIVE or (include_superseded and last.status is NoteStatus.SUPERSEDED)):
                return None
        return then
    return then if listed_then(then, moment, include_superseded) else None


def listed_then(view: NoteView, moment: Moment, include_superseded: bool) -> bool:
    """Whether a note, as it was at ``moment``, was in a listing (a tombstone never is: whether
    its note was is read from its history, ``listed_as_of``)."""
    if view.expires_at is not None and view.expires_at <= moment.at:
        return False  # its time to live had run out
    return view.status is NoteStatus.ACTIVE or (include_superseded and view.status is NoteStatus.SUPERSEDED)


def forget_of(view: NoteView, versions: Sequence[VersionView]) -> tuple[datetime, str | None]:
    """When a forgotten note was forgotten, and at which log position (None: a history recorded
    before the forget's position was kept, placed by its time alone)."""
    forget = next((v for v in reversed(versions) if v.change == FORGOTTEN), None)
    return (forget.created_at, forget.position) if forget is not None else (view.updated_at, None)


def forgotten_by(view: NoteView, versions: Sequence[VersionView], moment: Moment) -> bool:
    """Whether a forgotten note's forget had happened by ``moment``: by its log position for a
    token, so the forget's own token includes it and the token before does not, even within one
    millisecond (the forget's time, taken by the worker, need not be its entry's)."""
    return moment.covers(*forget_of(view, versions))


def in_categories(category: str, only: str | None, prefix: str | None) -> bool:
    if only is not None and category != only:
        return False
    return prefix is None or category == prefix or category.startswith(prefix + "/")


def listing_as_of(
    now: Sequence[Listed],
    changed: Mapping[str, NoteView | None],
    expired: Iterable[str],
) -> list[Listed]:
    """The listing at a moment: the listing now without the notes changed since (or expired by
    then), with those notes as they were then (``changed``: None, not listed then)."""
    gone = set(changed) | set(expired)
    kept = [entry for entry in now if entry.note_id not in gone]
    then = [listed(view) for view in changed.values() if view is not None]
    return sorted(kept + then)


def changes_between(
    view: NoteView, versions: Sequence[VersionView], since: Moment, until: Moment | None
) -> list[NoteChange]:
    """A note's changes after ``since`` and at or before ``until``, each with the note just
    before and right after. A forget is placed by its own time and log position
    (``forget_of``); the rest of a forgotten note's history went with its key."""

    def within(at: datetime, position: str | None) -> bool:
        return not since.covers(at, position) and (until is None or until.covers(at, position))

    if view.status is NoteStatus.FORGOTTEN:
        at, position = forget_of(view, versions)
        if within(at, position):
            return [NoteChange(note_id=view.id, change=FORGOTTEN, version=view.version, at=at)]
        return []
    changes = []
    before: VersionView | None = None
    for version in versions:
        if version.change in SHOWN and within(version.created_at, version.position):
            changes.append(
                NoteChange(
                    note_id=view.id,
                    change=version.change,
                    version=version.version,
                    at=version.created_at,
                    before=before,
                    after=version,
                )
            )
        before = version
    return changes


def holds_at(view: NoteView, at: datetime) -> bool:
    """Whether what a note says held in the world at ``at`` (a note without bounds always holds)."""
    return (view.valid_from is None or view.valid_from <= at) and (view.valid_until is None or at < view.valid_until)
