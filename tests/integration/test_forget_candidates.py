"""Forget by query through the real bus: a note far below the relevance floor
(bench/bench_forget_floor.py) is not a candidate, a query that matches nothing says so, and the
count is worded in the right number."""

from __future__ import annotations

import pytest

from engram_ledger.services.application.forget import FORGET_SIMILARITY_FLOOR
from engram_ledger.services.bus.client import EngramClient

pytestmark = pytest.mark.integration

SF = "User lives in San Francisco near the Golden Gate park"
SF_VISIT = "User visited San Francisco last year for a conference"
# Cosine with "San Francisco" 0.08-0.09: the weak candidates the issue saw.
UNRELATED = ["My favourite food is ramen", "I play the cello on Sundays", "The printer on the third floor is broken"]


async def remember(client: EngramClient, *texts: str) -> tuple[list[str], str]:
    ids, token = [], ""
    for text in texts:
        written = await client.save("alice", text, advise=False)
        ids.append(written.note_id)
        token = written.token
    return ids, token


async def test_weak_matches_are_not_candidates(client: EngramClient) -> None:
    (lives, *_), token = await remember(client, SF, *UNRELATED)
    everything = await client.search("alice", "San Francisco", after=token, min_relevance=0)
    assert len(everything.results) == 4, "the floor off, the search ranks every note; forget keeps its own"
    reply = await client.forget("alice", query="San Francisco", after=token)
    assert reply.status == "candidates" and [c.note_id for c in reply.candidates] == [lives]
    assert reply.candidates[0].similarity >= FORGET_SIMILARITY_FLOOR
    assert reply.message.startswith("Found 1 memory;") and "nothing was deleted" in reply.message


async def test_several_matches_are_counted_in_the_plural(client: EngramClient) -> None:
    (lives, visited, *_), token = await remember(client, SF, SF_VISIT, *UNRELATED)
    reply = await client.forget("alice", query="San Francisco", after=token)
    assert {c.note_id for c in reply.candidates} == {lives, visited}
    assert reply.message.startswith("Found 2 memories;")


async def test_a_query_that_matches_nothing_says_so_and_deletes_nothing(client: EngramClient) -> None:
    ids, token = await remember(client, SF, *UNRELATED)
    reply = await client.forget("alice", query="quantum chromodynamics lecture", after=token)
    assert reply.status == "candidates" and reply.candidates == [] and not reply.pending and not reply.forgotten
    assert "No memory matched" in reply.message and "nothing was deleted" in reply.message
    assert [n.status for n in (await client.list_notes("alice")).notes] == ["active"] * len(ids)
