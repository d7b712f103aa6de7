"""A note's reads (``access_count``, ``last_accessed_at``) through the real bus: a get and a search
hit count one each, and every reply of the present (a get, a search, a listing, the recent notes,
the console's look) shows the same count and time for the same note; a listing, the console and
readings of the past count none."""

from __future__ import annotations

from datetime import datetime

from engram_ledger.contracts.model import NoteView, Origin
from engram_ledger.contracts.queries import GetNote, NoteReply
from engram_ledger.services.application.recalls import CONSOLE
from engram_ledger.services.bus.client import EngramClient
from tests.support import eventually

LOOKING = Origin(channel=CONSOLE)


def reads(view: NoteView | None) -> tuple[int, datetime | None]:
    assert view is not None
    return view.access_count, view.last_accessed_at


async def listed(client: EngramClient, user: str) -> tuple[tuple[int, datetime | None], tuple[int, datetime | None]]:
    """The note's reads as the listing and the recent notes show them (the user has one note)."""
    (in_list,) = (await client.list_notes(user)).notes
    (in_recent,) = (await client.list_recent(user)).notes
    return reads(in_list), reads(in_recent)


async def test_a_get_a_search_the_listings_and_the_console_agree_on_a_notes_reads(client: EngramClient) -> None:
    saved = await client.save("alice", "Alec is my boss at TechCorp", subject="Alec")
    assert await listed(client, "alice") == ((0, None), (0, None))

    got = await client.get_note("alice", saved.note_id, after=saved.token)
    assert got.access_count == 1 and got.last_accessed_at is not None
    assert await listed(client, "alice") == (reads(got), reads(got)), "a listing shows the get, and counts nothing"

    (hit,) = (await client.search("alice", "Alec", after=saved.token, min_relevance=0.0)).results
    assert hit.note is not None and hit.note.access_count == 2
    assert hit.note.last_accessed_at is not None and hit.note.last_accessed_at >= got.last_accessed_at
    # The search's read is written off its reply's path: the listings show it once written.
    await eventually(lambda: _shows(client, "alice", reads(hit.note)), what="the listings showing the search's read")

    looked = (await client.ask(GetNote(user_id="alice", note_id=saved.note_id, origin=LOOKING), NoteReply)).note
    (seen,) = (await client.search("alice", "Alec", min_relevance=0.0, origin=LOOKING)).results
    assert reads(looked) == reads(seen.note) == reads(hit.note), "the console shows the reads"

    then = await client.get_note("alice", saved.note_id, as_of=saved.token)
    (listed_then,) = (await client.list_notes("alice", as_of=saved.token)).notes
    assert reads(then) == reads(listed_then) == (0, None), "a reading of the past shows no reads"

    again = await client.get_note("alice", saved.note_id)
    assert again.access_count == 3, "neither the console's looks nor the readings of the past counted"
    assert await listed(client, "alice") == (reads(again), reads(again))


async def _shows(client: EngramClient, user: str, expected: tuple[int, datetime | None]) -> bool:
    return await listed(client, user) == (expected, expected)
