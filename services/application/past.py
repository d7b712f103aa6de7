"""Reading the read model as it was at a moment (``as_of.py`` decides, this reads): the
listing of a user's notes then, which the listing query and the memory block share."""

from __future__ import annotations

from engram_ledger.contracts.model import NoteView
from engram_ledger.services.application.as_of import (
    Listed,
    Moment,
    listed_then,
    listing_as_of,
    note_as_of,
    parse_moment,
)
from engram_ledger.services.application.ports import NoteHistory


def moment_of(history: NoteHistory, user_id: str, text: str) -> Moment:
    """An ``as_of`` as the user's partition reads it."""
    return parse_moment(text).on(history.partition_of(user_id))


class ListingThen:
    """The listing at a moment, by place (``order``), with the notes changed since as they were
    then (``changed``; the others read as they are now, unchanged since)."""

    def __init__(self, order: list[Listed], changed: dict[str, NoteView | None]) -> None:
        self.order = order
        self.changed = changed

    async def views(self, history: NoteHistory, user_id: str, page: list[Listed]) -> list[NoteView]:
        """The notes of ``page`` as they were then, in order."""
        unchanged = [e.note_id for e in page if self.changed.get(e.note_id) is None]
        views, _ = await history.get_many(user_id, unchanged)
        return [v for e in page if (v := self.changed.get(e.note_id) or views.get(e.note_id)) is not None]


async def listing_then(history: NoteHistory, user_id: str, moment: Moment, include_superseded: bool) -> ListingThen:
    """Only the notes changed since the moment are read with their histories; the listing now
    gives the rest."""
    changed_ids = await history.changed_since(user_id, moment.ms)
    found = await history.histories(user_id, changed_ids)
    changed: dict[str, NoteView | None] = {note_id: None for note_id in changed_ids}
    for note_id, (view, versions) in found.items():
        then = note_as_of(view, versions, moment)
        if then is not None and listed_then(then, moment, include_superseded):
            changed[note_id] = then
    now = await history.listing(user_id, include_superseded)
    order = listing_as_of(now, changed, await history.expired_by(user_id, moment.ms))
    return ListingThen(order, changed)
