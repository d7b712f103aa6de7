"""The timeline index's pure part: which versions of which notes a batch of events opens, each
with the time it held from and, when the batch also ends it, until; which open versions it
ends; which notes leave the timeline altogether. ``projections/timeline.py`` writes it.

The timeline index holds every version of every note a search of the past may rank, as points
like the live index's (same chunks, same payload fields), each with the moment it began and the
moment it ended (``OPEN`` while it is current), both as a time (microseconds) and as a log
position (``position_value``), so a search as of a time or of a token filters on the one it has.
Only changes a search can tell apart begin a new version there: new text, a new category or
subject, a supersede or a revert. A forget or a retraction drops every point of the note.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from engram_ledger.contracts.events import (
    MessageRecorded,
    MessageRetracted,
    NoteForgotten,
    NoteReverted,
    NoteSaved,
    NoteSuperseded,
    NoteUpdated,
    is_control_stream,
)
from engram_ledger.projections.index_model import BatchChanges, NoteMeta, apply_event
from engram_ledger.services.application.as_of import (
    FROM_AT,
    FROM_POSITION,
    UNTIL_AT,
    UNTIL_POSITION,
    position_value,
    time_value,
)
from engram_ledger.services.application.ports import LogEntry

# The end of a version that is still current: later than any time or position.
OPEN = 1e18


@dataclass
class Version:
    """One version of a note as the timeline holds it. ``text``/``subject``: what it said and
    about whom (None: not in the batch; read from the store by ``version``)."""

    user_id: str
    note_id: str
    version: int
    meta: NoteMeta
    began: tuple[float, float]
    ended: tuple[float, float] = (OPEN, OPEN)
    text: str | None = None
    subject: str | None = None
    known: bool = False

    def bounds(self) -> dict[str, Any]:
        return bounds(self.began, self.ended)


def bounds(began: tuple[float, float], ended: tuple[float, float] = (OPEN, OPEN)) -> dict[str, float]:
    """The payload fields saying when a version held: (time, position) it began and ended."""
    return {FROM_AT: began[0], FROM_POSITION: began[1], UNTIL_AT: ended[0], UNTIL_POSITION: ended[1]}


@dataclass
class TimelinePlan:
    """``opened``: versions to write (their end set when the batch ends them); ``closed``: notes
    whose version current before the batch ends, and when; ``dropped``: notes whose points all
    go (forgotten or retracted)."""

    opened: list[Version] = field(default_factory=list)
    closed: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    dropped: set[tuple[str, str]] = field(default_factory=set)


class _NoTurns:
    """Memory notes only reach ``apply_event``'s memory branches; turns are mirrored, not planned."""

    def before(self, event: MessageRecorded) -> list[str]:
        return []

    def retract(self, event: MessageRetracted) -> None:
        return None

    def forget(self, user_id: str, session_id: str) -> None:
        return None


def _begins_version(event: Any) -> bool:
    if isinstance(event, NoteSaved | NoteSuperseded | NoteReverted):
        return True
    return isinstance(event, NoteUpdated) and any(
        getattr(event, f) is not None for f in ("content", "category", "subject")
    )


def plan_timeline(
    batch: Sequence[LogEntry],
    metas: dict[str, NoteMeta | None],
    key_of: Callable[[str, str], str],
    subject_key: Callable[[str, str | None], str | None],
) -> TimelinePlan:
    """The timeline's changes for a batch of memory-note events, from the index projection's
    state before the batch (``metas``, not changed). Events at or below a note's indexed
    version were applied before, as for the live index."""
    plan = TimelinePlan()
    metas = {k: (msgspec.structs.replace(m) if m is not None else None) for k, m in metas.items()}
    current: dict[str, Version] = {}
    for entry in batch:
        event = entry.event
        if is_control_stream(event.note_id) or isinstance(event, MessageRecorded | MessageRetracted):
            if isinstance(event, MessageRetracted):
                plan.dropped.add((event.user_id, event.note_id))
            continue
        key = key_of(event.user_id, event.note_id)
        meta = metas.get(key)
        if meta is not None and event.version <= meta.version:
            continue
        meta = apply_event(event, key, meta, BatchChanges(), subject_key, _NoTurns())
        if meta is None:
            continue
        metas[key] = meta
        ids = (event.user_id, event.note_id)
        at = (time_value(event.at), position_value(entry.position))
        if isinstance(event, NoteForgotten):
            plan.dropped.add(ids)
            plan.opened = [v for v in plan.opened if (v.user_id, v.note_id) != ids]
            plan.closed.pop(ids, None)
            current.pop(key, None)
            continue
        if not _begins_version(event):
            continue
        before = current.get(key)
        if before is not None:
            before.ended = at
        elif not isinstance(event, NoteSaved):
            plan.closed[ids] = at
        version = Version(*ids, event.version, msgspec.structs.replace(meta), at)
        _text_of(event, before, version)
        current[key] = version
        plan.opened.append(version)
    return plan


def _text_of(event: Any, before: Version | None, version: Version) -> None:
    """What the version says and about whom, when the batch tells: the event's own, else the
    version before it in the batch."""
    if isinstance(event, NoteSaved | NoteReverted):
        version.text, version.subject, version.known = event.content, event.subject, True
        return
    if before is None or not before.known:
        return
    version.text, version.subject, version.known = before.text, before.subject, True
    if isinstance(event, NoteUpdated):
        version.text = event.content if event.content is not None else before.text
        version.subject = event.subject if event.subject is not None else before.subject
