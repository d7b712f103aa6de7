"""Promises 1 and 2 against the real Redis: exactly once in the log, no lost update."""

from __future__ import annotations

import asyncio
import hashlib

import msgspec
import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts.commands import RequestForget, SaveNote, UpdateNote
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.queries import ForgetReply, NoteWritten
from engram_ledger.services.application.unit_of_work import request_body
from engram_ledger.services.bus.client import EngramClient
from tests.support import log_events


async def test_same_command_id_twice_appends_once_and_replies_the_same(client: EngramClient, redis_url: str) -> None:
    first = await client.save("alice", "I prefer Friday due dates", command_id="cmd-1")
    again = await client.save("alice", "I prefer Friday due dates", command_id="cmd-1")
    assert (again.note_id, again.version, again.token) == (first.note_id, first.version, first.token)
    assert not first.replayed and again.replayed
    assert [e.command_id for e in await log_events(redis_url)] == ["cmd-1"]


async def test_a_command_id_reused_for_a_different_request_is_refused_and_writes_nothing(
    client: EngramClient, redis_url: str
) -> None:
    # given a note saved under a command id
    first = await client.save("alice", "X", command_id="abc-1")
    # when another request arrives under the same id (other text; another note to update)
    with pytest.raises(EngramError) as other_text:
        await client.save("alice", "Y", command_id="abc-1")
    with pytest.raises(EngramError) as other_kind:
        await client.update("alice", first.note_id, content="Z", command_id="abc-1")
    # then each is IDEMPOTENCY_CONFLICT, in words, and nothing was written
    for refused in (other_text.value, other_kind.value):
        assert refused.code is ErrorCode.IDEMPOTENCY_CONFLICT
        assert "'abc-1' was already used for a different request" in refused.message
    assert [e.command_id for e in await log_events(redis_url)] == ["abc-1"]
    notes = await client.list_notes("alice", after=first.token)
    assert [n.content for n in notes.notes] == ["X"]
    # and the identical retry still replays the first outcome
    again = await client.save("alice", "X", command_id="abc-1")
    assert again.replayed and (again.note_id, again.token) == (first.note_id, first.token)


async def test_same_command_id_sent_concurrently_appends_once(client: EngramClient, redis_url: str) -> None:
    command = SaveNote(command_id="cmd-burst", user_id="alice", content="Has a dog named Max")
    replies = await asyncio.gather(*[client.execute(command, object) for _ in range(20)])  # type: ignore[arg-type]
    assert len({(r.note_id, r.version, r.token) for r in replies}) == 1  # type: ignore[attr-defined]
    assert sum(not r.replayed for r in replies) == 1  # type: ignore[attr-defined]
    assert len(await log_events(redis_url)) == 1


async def test_copies_of_one_update_sent_at_once_all_answer_its_outcome(client: EngramClient, redis_url: str) -> None:
    """The copies that lose the race see the note already at the new version: they must answer
    the first outcome, not VERSION_CONFLICT against their own write."""
    note = await client.save("alice", "Works at the bakery", advise=False, command_id="save-1")
    command = UpdateNote(
        command_id="upd-burst",
        user_id="alice",
        note_id=note.note_id,
        content="Works at the library",
        expected_version=1,
    )
    replies = await asyncio.gather(*[client.execute(command, NoteWritten) for _ in range(12)])
    assert {(r.note_id, r.version, r.token) for r in replies} == {(note.note_id, 2, replies[0].token)}
    assert [e.command_id for e in await log_events(redis_url)] == ["save-1", "upd-burst"]


async def test_copies_of_one_forget_request_sent_at_once_all_answer_its_outcome(
    client: EngramClient, redis_url: str
) -> None:
    """A copy deciding after the first one made the note pending would read as a confirmation:
    it must answer the first outcome (pending), and the note must not be deleted."""
    note = await client.save("alice", "Lives near the river", advise=False)
    command = RequestForget(command_id="fgt-burst", user_id="alice", note_ids=[note.note_id])
    replies = await asyncio.gather(*[client.execute(command, ForgetReply) for _ in range(12)])
    assert {(r.status, r.token) for r in replies} == {("confirmation_required", replies[0].token)}
    assert {r.pending[0].preview for r in replies} == {"Lives near the river"}
    assert (await client.get_note("alice", note.note_id)).status == "active"
    assert [type(e).__name__ for e in await log_events(redis_url)] == ["NoteSaved", "ForgetRequested"]


async def test_concurrent_updates_with_the_same_expected_version_exactly_one_wins(
    client: EngramClient, redis_url: str
) -> None:
    saved = await client.save("alice", "Sarah works on the Platform team", subject="Sarah")
    for round_ in range(5):
        expected = saved.version + round_
        updates = [
            client.execute(
                UpdateNote(
                    command_id=f"u{round_}-{i}",
                    user_id="alice",
                    note_id=saved.note_id,
                    content=f"Sarah works on team {round_}-{i}",
                    expected_version=expected,
                ),
                object,
            )  # type: ignore[arg-type]
            for i in range(8)
        ]
        results = await asyncio.gather(*updates, return_exceptions=True)
        winners = [r for r in results if not isinstance(r, Exception)]
        losers = [r for r in results if isinstance(r, EngramError)]
        assert len(winners) == 1 and len(losers) == 7
        assert all(e.code is ErrorCode.VERSION_CONFLICT for e in losers)
        assert winners[0].version == expected + 1  # type: ignore[attr-defined]
    versions = [e.version for e in await log_events(redis_url)]
    assert versions == [1, 2, 3, 4, 5, 6]  # gapless, nothing lost, nothing doubled


async def test_concurrent_updates_without_expected_version_all_land_in_order(
    client: EngramClient, redis_url: str
) -> None:
    saved = await client.save("alice", "counter 0")
    await asyncio.gather(*[client.update("alice", saved.note_id, content=f"counter {i}") for i in range(1, 11)])
    events = await log_events(redis_url)
    assert [e.version for e in events] == list(range(1, 12))
    history = await client.history(
        "alice", saved.note_id, after=(await client.update("alice", saved.note_id, content="final")).token
    )
    assert [v.version for v in history.versions] == list(range(1, 13))


async def test_batch_save_is_atomic_and_idempotent(client: EngramClient, redis_url: str) -> None:
    from engram_ledger.contracts.commands import NoteDraft

    drafts = [NoteDraft(content=c) for c in ("Likes black coffee", "Allergic to peanuts", "Works as software engineer")]
    first = await client.save_many("alice", drafts, command_id="batch-1")
    again = await client.save_many("alice", drafts, command_id="batch-1")
    assert first.notes == again.notes and again.replayed and len(first.notes) == 3
    assert len(await log_events(redis_url)) == 3
    try:
        await client.save_many("alice", [NoteDraft(content="fine"), NoteDraft(content="bad\x00")], command_id="batch-2")
    except EngramError as e:
        assert e.code is ErrorCode.INVALID_PARAMETER
    assert len(await log_events(redis_url)) == 3  # nothing of the refused batch


async def test_outcome_of_a_command_id_is_scoped_to_its_user(client: EngramClient) -> None:
    a = await client.save("alice", "alice's secret", command_id="shared-id")
    b = await client.save("bob", "bob's note", command_id="shared-id")
    assert not b.replayed and b.note_id != a.note_id
    note = await client.get_note("bob", b.note_id, after=b.token)
    assert note.content == "bob's note"
    assert msgspec.json.encode(note).find(b"alice") == -1


async def test_the_same_text_saved_concurrently_under_different_command_ids_is_one_note(
    client: EngramClient, redis_url: str
) -> None:
    replies = await asyncio.gather(*[client.save("alice", "My passport expires in March 2031") for _ in range(10)])
    assert len({r.note_id for r in replies}) == 1
    assert sum(not r.duplicate for r in replies) == 1
    assert len(await log_events(redis_url)) == 1


async def test_ids_holding_colons_never_share_a_key(client: EngramClient) -> None:
    """Every key joining caller-chosen parts keeps them apart (a cross-user write was lost when two
    parts ran into each other)."""
    bob = await client.save("bob", "Bob's note", command_id="x:1", advise=False)
    bob_x = await client.save("bob:x", "Bob X's note", command_id="1", advise=False)
    assert not bob_x.replayed and bob_x.note_id != bob.note_id
    assert [n.content for n in (await client.list_notes("bob:x", after=bob_x.token)).notes] == ["Bob X's note"]
    # A conversation's control stream holds its name: "x:_account" of bob is not bob:x's account.
    await client.record_message("bob", "x:_account", "said in a conversation with an awkward name")
    await client.record_message("bob:_session:x", "s", "another user's turn")
    asked = await client.forget_session("bob", "x:_account")
    assert asked.status == "confirmation_required"
    erased = await client.forget_user("bob:_session:x", confirmed=True)
    assert erased.status == "forgotten" and len(erased.forgotten) == 1
    assert (await client.forget_session("bob", "x:_account")).status == "forgotten"


async def _stored_requests(redis_url: str, user: str) -> dict[str, str]:
    """The fingerprint kept with each of the user's command outcomes (none once removed)."""
    async with aioredis.Redis.from_url(redis_url) as redis:
        found = {}
        async for key in redis.scan_iter(match=f"engram:{{*}}:cmd:{user}:*"):
            stored = msgspec.json.decode(await redis.get(key))
            found[key.decode()] = (stored.get("extra") or {}).get("request", "")
        return found


async def test_the_stored_fingerprint_of_a_request_cannot_confirm_a_guess(client: EngramClient, redis_url: str) -> None:
    """The outcome keeps a digest of what was asked, to refuse a reused command id: one a reader
    of Redis could recompute for a guess ("the victim likes zebra") would tell what was saved."""
    guess = SaveNote(command_id="victim-1", user_id="victim", content="MKCONTENTA the victim likes zebra")
    await client.execute(guess, NoteWritten)
    (kept,) = (await _stored_requests(redis_url, "victim")).values()
    unkeyed = hashlib.blake2b(request_body(guess), digest_size=16).hexdigest()
    assert kept and kept != unkeyed
    assert all(kept != hashlib.new(name, request_body(guess)).hexdigest() for name in ("sha256", "md5", "sha1"))
    # ... and a retry is still told from another request under the same id
    with pytest.raises(EngramError) as other:
        await client.execute(msgspec.structs.replace(guess, content="something else"), NoteWritten)
    assert other.value.code is ErrorCode.IDEMPOTENCY_CONFLICT


async def test_forgetting_removes_the_fingerprints_of_what_wrote_the_notes(
    client: EngramClient, redis_url: str
) -> None:
    # given a user with two notes, one updated, and a conversation turn
    zebra = await client.save("victim", "MKCONTENTA the victim likes zebra", command_id="s-1", advise=False)
    await client.update("victim", zebra.note_id, content="MKCONTENTA the victim loves zebra", command_id="u-1")
    tea = await client.save("victim", "The victim drinks tea", command_id="s-2", advise=False)
    await client.record_message("victim", "sess", "my PIN is 4411", command_id="m-1")
    assert all((await _stored_requests(redis_url, "victim")).values())
    # when one note is forgotten, its commands keep their outcomes but lose their fingerprints
    await client.forget("victim", note_ids=[zebra.note_id], confirmed=True, command_id="f-1")
    kept = {key.rsplit(":", 1)[1]: request for key, request in (await _stored_requests(redis_url, "victim")).items()}
    assert kept["s-1"] == kept["u-1"] == "" and kept["s-2"] and kept["m-1"]
    again = await client.save("victim", "MKCONTENTA the victim likes zebra", command_id="s-1", advise=False)
    assert again.replayed and again.note_id == zebra.note_id, "a late retry is still answered, not saved again"
    # and when the user is erased, none is left
    await client.forget_user("victim", command_id="e-1")
    await client.forget_user("victim", command_id="e-2")
    assert set((await _stored_requests(redis_url, "victim")).values()) == {""}
    assert tea.note_id
