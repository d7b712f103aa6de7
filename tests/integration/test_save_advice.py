"""Store returns what it may contradict (requirements §4), the subject clash hint (requirements §3), and no new
note for an exact duplicate (requirements §5), through the real bus and index."""

from __future__ import annotations

from engram_ledger.services.bus.client import EngramClient


async def test_a_save_names_the_similar_notes_it_may_outdate(client: EngramClient) -> None:
    seattle = await client.save("alice", "User lives in Seattle", confidence=0.9)
    await client.save("alice", "Has a dog named Max")
    austin = await client.save("alice", "User moved to Austin last month")
    assert [s.note_id for s in austin.similar] == [seattle.note_id]
    (similar,) = austin.similar
    assert similar.content == "User lives in Seattle" and similar.confidence == 0.9 and similar.similarity >= 0.5
    assert austin.action_required is not None
    assert f"superseded_by={austin.note_id}" in austin.action_required and seattle.note_id in austin.action_required
    unrelated = await client.save("alice", "Allergic to peanuts")
    assert unrelated.similar == [] and unrelated.action_required is None


async def test_advice_never_names_another_users_note(client: EngramClient) -> None:
    await client.save("bob", "User lives in Seattle")
    mine = await client.save("alice", "User lives in Seattle, near the lake")
    assert mine.similar == []


async def test_a_save_about_a_known_subject_suggests_an_update(client: EngramClient) -> None:
    first = await client.save("alice", "Sarah works on the Platform team", category="person", subject="Sarah")
    second = await client.save("alice", "Sarah enjoys climbing on weekends", category="person", subject="Sarah")
    assert second.same_subject == [first.note_id]
    assert second.action_required is not None and "update_note" in second.action_required


async def test_an_exact_duplicate_names_the_existing_note(client: EngramClient) -> None:
    first = await client.save("alice", "I prefer tasks due on Friday")
    again = await client.save("alice", "i prefer TASKS due on friday")
    assert again.duplicate and again.note_id == first.note_id and again.version == 1
    assert len((await client.list_notes("alice", after=again.token)).notes) == 1
