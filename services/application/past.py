"""Reading the read model as it was at a moment (``as_of.py`` decides, this reads, through the
``PastReader`` port): the listing of a user's notes then, which the listing query and the memory
block share."""

from __future__ import annotations

import asyncio

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.model import NoteStatus, NoteView
from engram_ledger.services.application.as_of import (
    Listed,
    Moment,
    listed,
    listed_as_of,
    listing_as_of,
    parse_moment,
)
from engram_ledger.services.application.ports import PastReader


def reads_past(past: PastReader | None) -> PastReader:
    """The reader of the past, or ``UNAVAILABLE`` where the service was given none."""
    if past is None:
        raise EngramError(ErrorCode.UNAVAILABLE, "this service reads no past: as_of and diffs are not served here")
    return past


def moment_of(past: PastReader, user_id: str, text: str, name: str = "as_of") -> Moment:
    """An ``as_of`` (or another moment, ``name``) as the user's partition reads it."""
    return parse_moment(text, name).on(past.partition_of(user_id))


class ListingThen:
    """The listing at a moment, by place (``order``), with the notes changed since as they were
    then (``changed``; the others read as they are now, unchanged since)."""

    def __init__(self, order: list[Listed], changed: dict[str, NoteView | None]) -> None:
        self.order = order
        self.changed = changed

    async def views(self, past: PastReader, user_id: str, page: list[Listed]) -> list[NoteView]:
        """The notes of ``page`` as they were then, in order."""
        unchanged = [e.note_id for e in page if self.changed.get(e.note_id) is None]
        views, _ = await past.get_many(user_id, unchanged)
        return [v for e in page if (v := self.changed.get(e.note_id) or views.get(e.note_id)) is not None]


async def listing_then(past: PastReader, user_id: str, moment: Moment, include_superseded: bool) -> ListingThen:
    """Only the notes changed since the moment are read with their histories; the listing now
    gives the rest."""
    changed_ids = await past.changed_since(user_id, moment.ms)
    found = await past.histories(user_id, changed_ids)
    changed: dict[str, NoteView | None] = {note_id: None for note_id in changed_ids}
    for note_id, (view, versions) in found.items():
        changed[note_id] = listed_as_of(view, versions, moment, include_superseded)
    now = await past.listing(user_id, include_superseded)
    order = listing_as_of(now, changed, await past.expired_by(user_id, moment.ms))
    return ListingThen(order, changed)


class PageThen:
    """A page of the listing as it was at a moment, and how many notes that listing held."""

    def __init__(self, notes: list[NoteView], total: int) -> None:
        self.notes = notes
        self.total = total


async def page_then(
    past: PastReader, user_id: str, moment: Moment, include_superseded: bool, offset: int, limit: int
) -> PageThen:
    """A page of the whole listing at a moment, read in time that grows with the page and the
    notes moved in or out of the listing since, not with the listing: the listing now (``Z``)
    without the places of those notes (``R``), with their places then (``A``). A place of ``Z``
    at rank ``i`` is at rank ``i - (R before it) + (A before it)`` then, so the page's places
    from ``Z`` lie within ``Z[offset - |A| : offset + limit + |R|]``."""
    moved, expired = await asyncio.gather(past.relisted_since(user_id, moment.ms), past.expired_by(user_id, moment.ms))
    # Read at once: the histories of the notes moved since, the views of those past their time
    # to live, and the window of the listing now that holds the page's places whatever those
    # histories say (at most every moved note added before the page, or gone from it).
    start = max(0, offset - len(moved))
    found, (lapsed, _), (window, size) = await asyncio.gather(
        past.histories(user_id, moved),
        past.get_many(user_id, expired),
        past.listing_window(user_id, include_superseded, start, offset + limit + len(moved) + len(expired)),
    )
    then: dict[str, NoteView] = {}
    gone: set[Listed] = set()
    for note_id, (now, versions) in found.items():
        if listed_now(now, include_superseded):
            gone.add(listed(now))
        view = listed_as_of(now, versions, moment, include_superseded)
        if view is not None:
            then[note_id] = view
    gone |= {listed(v) for n, v in lapsed.items() if n not in found and listed_now(v, include_superseded)}
    added = sorted(listed(v) for v in then.values())
    ranked: list[tuple[int, Listed]] = []
    for i, place in enumerate(window, start=start):
        if place not in gone:
            ranked.append((i - sum(g < place for g in gone) + sum(a < place for a in added), place))
    before = await past.listing_ranks(user_id, include_superseded, added)
    for place, now_before in zip(added, before, strict=True):
        ranked.append((now_before - sum(g < place for g in gone) + sum(a < place for a in added), place))
    page = [place for rank, place in sorted(ranked) if offset <= rank < offset + limit]
    views: dict[str, NoteView | None] = {v.id: v for v in then.values()}
    views |= await past.notes_at(user_id, [p.note_id for p in page if p.note_id not in views], moment)
    shown = [v for p in page if (v := views.get(p.note_id)) is not None]
    return PageThen(shown, size - len(gone) + len(added))


def listed_now(view: NoteView, include_superseded: bool) -> bool:
    """Whether the listing as it is now holds the note."""
    return view.status is NoteStatus.ACTIVE or (include_superseded and view.status is NoteStatus.SUPERSEDED)
