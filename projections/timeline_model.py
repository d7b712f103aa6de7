"""The timeline index's pure part: which versions of which notes a batch of events opens, each
with the time it held from and, when the batch also ends it, until; which open versions it
ends; which notes leave the timeline altogether; when each turn it records was said.
``projections/timeline.py`` folds a batch as the live index does (``index_model.fold_batch``),
with a ``TimelinePlanner`` told of every event applied, and writes the plan.

The timeline index holds every version of every note a search of the past may rank, as points
like the live index's (same chunks, same payload fields), each with the moment it began and the
moment it ended (``OPEN`` while it is current), both as a time (microseconds) and as a log
position (``position_value``), so a search as of a time or of a token filters on the one it has
(the fields: ``services/application/vector_index.py``, ``bounds``).
Only changes a search can tell apart begin a new version there: new text, a new category or
subject, a supersede or a revert. A forget or a retraction drops every point of the note.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from engram_ledger.contracts.events import MessageRecorded, NoteReverted, NoteSaved, NoteSuperseded, NoteUpdated
from engram_ledger.projections.index_model import NoteMeta
from engram_ledger.services.application.ports import LogEntry
from engram_ledger.services.application.vector_index import CONVERSATION, OPEN, bounds, position_value, time_value


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


@dataclass
class TimelinePlan:
    """``opened``: versions to write (their end set when the batch ends them); ``closed``: notes
    whose version current before the batch ends, and when; ``dropped``: notes whose points all
    go (forgotten or retracted); ``recorded``: when each turn the batch records was said (its
    points hold from then: a turn has one version)."""

    opened: list[Version] = field(default_factory=list)
    closed: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    dropped: set[tuple[str, str]] = field(default_factory=set)
    recorded: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)


class TimelinePlanner:
    """The ``applied`` of ``fold_batch``: told of each event the fold applies, with its note's
    meta right after it, it builds the batch's ``plan``. Events the fold skips (at or below a
    note's applied version) were planned before."""

    def __init__(self) -> None:
        self.plan = TimelinePlan()
        self._current: dict[str, Version] = {}

    def __call__(self, entry: LogEntry, key: str, meta: NoteMeta) -> None:
        event = entry.event
        ids = (event.user_id, event.note_id)
        at = (time_value(event.at), position_value(entry.position))
        if meta.status == "forgotten":  # forgotten, or a turn retracted
            self._drop(key, ids)
        elif meta.record == CONVERSATION:
            if isinstance(event, MessageRecorded):
                self.plan.recorded[ids] = at
        elif _begins_version(event):
            self._open(key, ids, event, meta, at)

    def _open(self, key: str, ids: tuple[str, str], event: Any, meta: NoteMeta, at: tuple[float, float]) -> None:
        before = self._current.get(key)
        if before is not None:
            before.ended = at
        elif not isinstance(event, NoteSaved):
            self.plan.closed[ids] = at
        version = Version(*ids, event.version, msgspec.structs.replace(meta), at)
        _text_of(event, before, version)
        self._current[key] = version
        self.plan.opened.append(version)

    def _drop(self, key: str, ids: tuple[str, str]) -> None:
        self.plan.dropped.add(ids)
        self.plan.opened = [v for v in self.plan.opened if (v.user_id, v.note_id) != ids]
        self.plan.closed.pop(ids, None)
        self._current.pop(key, None)


def _begins_version(event: Any) -> bool:
    if isinstance(event, NoteSaved | NoteSuperseded | NoteReverted):
        return True
    return isinstance(event, NoteUpdated) and any(
        getattr(event, f) is not None for f in ("content", "category", "subject")
    )


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
