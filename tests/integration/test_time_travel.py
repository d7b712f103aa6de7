"""Time travel through the real bus (real Redis, the service's read model): reads as of a moment
around updates, supersedes, expiry and forgets; what changed between two moments; undo as a
new version, racing an update."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from engram_ledger.contracts.channels import parse_token
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.model import NoteStatus
from engram_ledger.contracts.queries import NotesReply
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService
from tests.support import eventually, leaked

# One service for the module (tests/conftest.py, ``shared_service``): each test is a user of its own.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def service(shared_service: RunningService) -> RunningService:
    return shared_service


@pytest.fixture
def client(shared_client: EngramClient) -> EngramClient:
    return shared_client


async def moment() -> datetime:
    """A time strictly between what came before and what comes after (the clock is let move on
    either side of it)."""
    await asyncio.sleep(0.01)
    at = datetime.now(UTC)
    await asyncio.sleep(0.01)
    return at


async def test_a_note_and_the_listing_read_as_they_were_around_an_update_and_a_supersede(
    client: EngramClient,
    user: str,
) -> None:
    boss = await client.save(user, "Alec is my boss", category="work", subject="Alec")
    city = await client.save(user, "I live in Lisbon", category="home")
    t1 = await moment()
    update = await client.update(user, boss.note_id, content="Alec is my manager at TechCorp", category="people")
    moved = await client.save(user, "I live in Porto now", category="home")
    replaced = await client.supersede(user, city.note_id, moved.note_id)
    t2 = await moment()
    later = await client.save(user, "I started learning the cello", category="hobby")

    then = await client.get_note(user, boss.note_id, as_of=t1, after=later.token)
    assert (then.version, then.content, then.category) == (1, "Alec is my boss", "work")
    now = await client.get_note(user, boss.note_id)
    assert (now.version, now.content, now.category) == (2, "Alec is my manager at TechCorp", "people")

    # The listing then: both notes as they were, in the order of that time's categories.
    listing = await client.list_notes(user, as_of=t1, after=later.token)
    assert [(n.id, n.content, n.category) for n in listing.notes] == [
        (city.note_id, "I live in Lisbon", "home"),
        (boss.note_id, "Alec is my boss", "work"),
    ]
    assert listing.total == 2
    # Later: the superseded note is out unless asked for; the cello note, saved after, is absent.
    at_t2 = await client.list_notes(user, as_of=t2)
    assert {n.id for n in at_t2.notes} == {boss.note_id, moved.note_id}
    with_old = await client.list_notes(user, as_of=t2, include_superseded=True)
    old = next(n for n in with_old.notes if n.id == city.note_id)
    assert old.status is NoteStatus.SUPERSEDED and old.superseded_by == moved.note_id
    with pytest.raises(EngramError) as info:
        await client.get_note(user, later.note_id, as_of=t2)
    assert info.value.code is ErrorCode.MEMORY_NOT_FOUND and "did not exist" in info.value.message
    # A token names the moment right after its write, exactly.
    by_token = await client.get_note(user, boss.note_id, as_of=update.token)
    assert by_token.version == 2
    before_supersede = await client.list_notes(user, as_of=moved.token)
    assert {n.id for n in before_supersede.notes} == {boss.note_id, city.note_id, moved.note_id}
    after_supersede = await client.list_notes(user, as_of=replaced.token)
    assert {n.id for n in after_supersede.notes} == {boss.note_id, moved.note_id}
    # Category filters apply to the category a note had then.
    assert [n.id for n in (await client.list_notes(user, category="work", as_of=t1)).notes] == [boss.note_id]
    assert (await client.list_notes(user, category="work", as_of=t2)).notes == []


async def test_a_note_forgotten_since_is_a_tombstone_in_every_reading_of_the_past(
    client: EngramClient,
    service: RunningService,
    user: str,
) -> None:
    secret = await client.save(user, "my locker code is heron-7719", category="private")
    await client.update(user, secret.note_id, content="my locker code is heron-8820")
    t1 = await moment()
    gone = await client.forget(user, note_ids=[secret.note_id], confirmed=True)
    then = await client.get_note(user, secret.note_id, as_of=t1, after=gone.token)
    assert then.status is NoteStatus.FORGOTTEN and then.content == ""
    listing = await client.list_notes(user, as_of=t1)
    assert [(n.id, n.status, n.content) for n in listing.notes] == [(secret.note_id, NoteStatus.FORGOTTEN, "")]
    diff = await client.diff(user, t1)
    assert [(c.note_id, c.change, c.after) for c in diff.changes] == [(secret.note_id, "forgotten", None)]
    assert await leaked(service.settings.redis_url, b"heron-") == []


async def test_a_note_whose_time_ran_out_leaves_the_listing_of_that_moment(client: EngramClient, user: str) -> None:
    # Long enough that the moment after the put is before its expiry on a busy machine.
    put = await client.put(user, "cache", "otp", {"code": "4411"}, ttl_seconds=2.0)
    t1 = await moment()
    await asyncio.sleep(2.1)  # its time to live runs out
    t2 = await moment()

    # Read once the timer has forgotten it: a reading made while the forget is being applied
    # is not one moment of the read model (the listing and the notes are read apart).
    async def forgotten() -> bool:
        return (await client.history(user, put.note_id)).status == "forgotten"

    await eventually(forgotten, what="the note forgotten by the timer")
    assert [n.id for n in (await client.list_notes(user, as_of=t1, after=put.token)).notes] == [put.note_id]
    assert (await client.list_notes(user, as_of=t2)).notes == []
    # Every earlier reading shows its tombstone.
    earlier = await client.get_note(user, put.note_id, as_of=t1)
    assert earlier.status is NoteStatus.FORGOTTEN and earlier.value is None


async def test_diff_says_what_changed_between_two_moments_in_order(client: EngramClient, user: str) -> None:
    kept = await client.save(user, "I drink my coffee black")
    t1 = await moment()
    note = await client.save(user, "Tess works at Acme", category="people")
    await client.update(user, note.note_id, content="Tess works at Initech")
    t2 = await moment()
    await client.update(user, note.note_id, content="Tess works at Globex")
    diff = await client.diff(user, t1, t2, after=kept.token)
    assert [(c.change, c.version) for c in diff.changes] == [("saved", 1), ("updated", 2)]
    saved, updated = diff.changes
    assert saved.before is None and saved.after is not None and saved.after.content == "Tess works at Acme"
    assert updated.before is not None and updated.before.content == "Tess works at Acme"
    assert updated.after is not None and updated.after.content == "Tess works at Initech"
    everything = await client.diff(user, t1)
    assert [c.version for c in everything.changes] == [1, 2, 3]
    first = await client.diff(user, t1, limit=1)
    assert len(first.changes) == 1 and first.truncated
    with pytest.raises(EngramError) as info:
        await client.diff(user, t2, t1)
    assert info.value.code is ErrorCode.INVALID_PARAMETER and "is before since" in info.value.message
    with pytest.raises(EngramError) as bad:
        await client.diff(user, "last week")
    assert "since: 'last week' is neither an ISO 8601 time" in bad.value.message


async def test_a_revert_is_a_new_version_and_history_keeps_everything(client: EngramClient, user: str) -> None:
    note = await client.save(user, "Alec is my boss", category="work", importance=0.4)
    await client.update(user, note.note_id, content="Alec was my boss", importance=0.9)
    reverted = await client.revert(user, note.note_id, 1)
    assert reverted.version == 3
    view = await client.get_note(user, note.note_id, after=reverted.token)
    assert (view.content, view.importance, view.status) == ("Alec is my boss", 0.4, NoteStatus.ACTIVE)
    history = await client.history(user, note.note_id)
    assert [(v.version, v.change, v.content) for v in history.versions] == [
        (1, "saved", "Alec is my boss"),
        (2, "updated", "Alec was my boss"),
        (3, "reverted", "Alec is my boss"),
    ]
    assert history.versions[2].reverted_to == 1
    # The search index follows: the reverted words find it.
    hits = await client.search(user, "who is my boss?", min_relevance=0, after=reverted.token)
    assert hits.results[0].note_id == note.note_id and hits.results[0].content == "Alec is my boss"


async def test_undoing_a_supersede_restores_the_old_note_to_the_active_set(client: EngramClient, user: str) -> None:
    old = await client.save(user, "I live in Lisbon")
    new = await client.save(user, "I live in Porto")
    await client.supersede(user, old.note_id, new.note_id)
    back = await client.revert(user, old.note_id, 1)
    listing = await client.list_notes(user, after=back.token)
    assert {n.id for n in listing.notes} == {old.note_id, new.note_id}
    assert (await client.get_note(user, old.note_id)).superseded_by is None
    assert (await client.get_note(user, new.note_id)).supersedes == []
    # Active again, it holds its content: saving the same words finds it, as for any active note.
    again = await client.save(user, "I live in Lisbon")
    assert again.duplicate and again.note_id == old.note_id


async def test_a_revert_racing_an_update_keeps_optimistic_concurrency(client: EngramClient, user: str) -> None:
    note = await client.save(user, "the wifi password is on the fridge")
    await client.update(user, note.note_id, content="the wifi password is in the drawer")
    results = await asyncio.gather(
        client.revert(user, note.note_id, 1, expected_version=2),
        client.update(user, note.note_id, content="the wifi password is on the router", expected_version=2),
        return_exceptions=True,
    )
    won = [r for r in results if not isinstance(r, BaseException)]
    lost = [r for r in results if isinstance(r, EngramError)]
    assert len(won) == 1 and len(lost) == 1 and lost[0].code is ErrorCode.VERSION_CONFLICT
    history = await client.history(user, note.note_id, after=won[0].token)
    assert [v.version for v in history.versions] == [1, 2, 3]


async def test_a_forgotten_note_cannot_be_reverted(client: EngramClient, user: str) -> None:
    note = await client.save(user, "temporary thought")
    await client.update(user, note.note_id, content="another temporary thought")
    await client.forget(user, note_ids=[note.note_id], confirmed=True)
    with pytest.raises(EngramError) as info:
        await client.revert(user, note.note_id, 1)
    assert info.value.code is ErrorCode.INVALID_PARAMETER and "was forgotten" in info.value.message


async def test_a_search_of_the_past_ranks_the_versions_current_then(client: EngramClient, user: str) -> None:
    tess = await client.save(user, "Tess works at Acme as a designer", category="people", subject="Tess")
    await client.save(user, "I like climbing on weekends", category="hobby")
    t1 = await moment()
    await client.update(user, tess.note_id, content="Tess works at Initech as a product manager", category="work")
    cello = await client.save(user, "Tess plays the cello in an orchestra", category="people", subject="Tess")
    t2 = await client.save(user, "unrelated: the car needs new tyres")

    question = "where does Tess work?"
    then = await client.search(user, question, as_of=t1, min_relevance=0, after=t2.token)
    assert [(h.note_id, h.content) for h in then.results][:1] == [(tess.note_id, "Tess works at Acme as a designer")]
    assert then.results[0].note is not None and then.results[0].note.version == 1
    assert cello.note_id not in {h.note_id for h in then.results}  # saved later
    now = await client.search(user, question, min_relevance=0)
    assert now.results[0].content == "Tess works at Initech as a product manager"
    # Filters apply to what a note was then: its category then was "people".
    assert [h.note_id for h in (await client.search(user, question, as_of=t1, category="people")).results] == [
        tess.note_id
    ]
    assert (await client.search(user, question, as_of=t1, category="work", min_relevance=0)).results == []
    # A token names the moment right after its write.
    by_token = await client.search(user, "orchestra cello", as_of=cello.token, min_relevance=0)
    assert by_token.results[0].note_id == cello.note_id
    # An update ends the version before it: searched as of now, only the current words count.
    old_words = "Acme designer"
    past = {
        h.note_id: h.similarity for h in (await client.search(user, old_words, as_of=t2.token, min_relevance=0)).results
    }
    live = {h.note_id: h.similarity for h in (await client.search(user, old_words, min_relevance=0)).results}
    assert past[tess.note_id] == live[tess.note_id]


async def test_a_search_of_the_past_never_finds_what_was_forgotten_since(
    client: EngramClient,
    service: RunningService,
    user: str,
) -> None:
    secret = await client.save(user, "my bank PIN is kestrel-2290")
    await client.update(user, secret.note_id, content="my bank PIN is kestrel-3301")
    kept = await client.save(user, "my bank is the one on the corner")
    t1 = await moment()
    before = await client.search(user, "what is my bank PIN?", as_of=t1, min_relevance=0, after=kept.token)
    assert secret.note_id in {h.note_id for h in before.results}
    gone = await client.forget(user, note_ids=[secret.note_id], confirmed=True)
    after = await client.search(user, "what is my bank PIN?", as_of=t1, min_relevance=0, after=gone.token)
    assert secret.note_id not in {h.note_id for h in after.results}
    assert kept.note_id in {h.note_id for h in after.results}
    # Every version's points left the timeline too: none of the note is in the index.
    assert service.engram.index is not None
    timeline = service.engram.index.timeline
    assert timeline is not None
    assert [p for p in await timeline.payloads() if p["note_id"] == secret.note_id] == []


async def test_a_search_of_the_past_sees_a_supersede_as_it_was(client: EngramClient, user: str) -> None:
    old = await client.save(user, "I live in Lisbon")
    t1 = await moment()
    new = await client.save(user, "I moved to Porto")
    await client.supersede(user, old.note_id, new.note_id)
    t2 = await moment()
    await client.revert(user, old.note_id, 1)
    question = "which city do I live in?"
    assert [h.note_id for h in (await client.search(user, question, as_of=t1, min_relevance=0)).results] == [
        old.note_id
    ]
    at_t2 = await client.search(user, question, as_of=t2, min_relevance=0)
    assert [h.note_id for h in at_t2.results] == [new.note_id]
    with_old = await client.search(user, question, as_of=t2, min_relevance=0, include_superseded=True)
    assert {h.note_id for h in with_old.results} == {old.note_id, new.note_id}
    now = await client.search(user, question, min_relevance=0)
    assert {h.note_id for h in now.results} == {old.note_id, new.note_id}


async def test_conversation_turns_said_later_are_not_in_a_search_of_the_past(client: EngramClient, user: str) -> None:
    await client.record_message(user, "s1", "we should visit the aquarium on Saturday", speaker="Alice")
    t1 = await moment()
    later = await client.record_message(user, "s1", "the aquarium trip moved to Sunday", speaker="Bob")
    hits = await client.search(
        user, "aquarium trip", include_conversation=True, as_of=t1, min_relevance=0, after=later.token
    )
    assert [h.content for h in hits.results] == ["we should visit the aquarium on Saturday"]
    now = await client.search(user, "aquarium trip", include_conversation=True, min_relevance=0)
    assert len(now.results) == 2


async def test_a_memory_block_as_of_a_moment_is_the_memory_then(client: EngramClient, user: str) -> None:
    boss = await client.save(user, "Alec is my boss", category="work")
    t1 = await moment()
    await client.update(user, boss.note_id, content="Alec retired; Priya is my boss now")
    late = await client.save(user, "I adopted a cat named Miso", category="home")
    block = await client.context(user, as_of=t1, after=late.token)
    assert "Alec is my boss" in block.text and "Priya" not in block.text and "Miso" not in block.text
    assert block.note_ids == [boss.note_id]
    now = await client.context(user)
    assert "Priya is my boss now" in now.text and "Miso" in now.text


async def test_world_time_says_when_a_fact_held_and_a_supersede_closes_it(client: EngramClient, user: str) -> None:
    y2019, y2022 = datetime(2019, 2, 1, tzinfo=UTC), datetime(2022, 6, 1, tzinfo=UTC)
    acme = await client.save(user, "Tess works at Acme", category="people", subject="Tess", valid_from=y2019)
    initech = await client.save(user, "Tess works at Initech", category="people", subject="Tess", valid_from=y2022)
    closed = await client.supersede(user, acme.note_id, initech.note_id)
    old = await client.get_note(user, acme.note_id, after=closed.token)
    assert (old.valid_from, old.valid_until) == (y2019, y2022)

    # valid_at: what held then, superseded since or not (the old note held in 2020).
    in_2020 = datetime(2020, 7, 1, tzinfo=UTC)
    hits = await client.search(user, "where does Tess work?", valid_at=in_2020)
    assert [h.note_id for h in hits.results] == [acme.note_id]
    now = await client.search(user, "where does Tess work?", valid_at=datetime.now(UTC))
    assert [h.note_id for h in now.results] == [initech.note_id]
    # A question naming a time ranks first what held then, superseded since or not.
    asked = await client.search(user, "where did Tess work in 2020?", min_relevance=0)
    assert [h.note_id for h in asked.results][:2] == [acme.note_id, initech.note_id]
    plain = await client.search(user, "where does Tess work?", min_relevance=0)
    assert [h.note_id for h in plain.results] == [initech.note_id], "superseded notes stay out otherwise"
    listed = await client.list_notes(user, valid_at=in_2020)
    assert [n.id for n in listed.notes] == [acme.note_id]

    # The memory block says when a fact held.
    ended = await client.save(user, "I drive a blue Fiat", valid_until=y2022)
    block = await client.context(user, after=ended.token)
    assert "I drive a blue Fiat (until 2022-06-01)" in block.text
    assert "Tess works at Initech (from 2022-06-01)" in block.text
    xml = await client.context(user, format="xml")
    assert "I drive a blue Fiat (until 2022-06-01)." in xml.text


async def test_a_supersede_can_leave_validity_as_it_was(client: EngramClient, user: str) -> None:
    old = await client.save(user, "my phone is a Pixel 6")
    new = await client.save(user, "my phone is a Pixel 9")
    kept = await client.supersede(user, old.note_id, new.note_id, close_validity=False)
    assert (await client.get_note(user, old.note_id, after=kept.token)).valid_until is None


async def test_pages_of_the_past_are_slices_of_the_listing_then(client: EngramClient, user: str) -> None:
    """The page of a listing then is computed from the listing now and the notes moved since;
    every page must be the same slice of the whole listing then (read the long way, through a
    filter that keeps every note)."""
    import random

    rng = random.Random(5)
    ids: list[str] = []
    moments: list[str] = []
    token = ""
    for step in range(60):
        roll = rng.random()
        try:
            if not ids or roll < 0.4:
                topic = rng.choice(["tea", "work", "cats"])
                written = await client.save(user, f"note {step} about {topic}", category=rng.choice("abc"))
                ids.append(written.note_id)
            elif roll < 0.6:
                written = await client.update(user, rng.choice(ids), content=f"changed words {step}")
            elif roll < 0.75:
                written = await client.update(user, rng.choice(ids), category=rng.choice("abcd"))
            elif roll < 0.85 and len(ids) > 2:
                written = await client.supersede(user, *rng.sample(ids, 2))
            elif roll < 0.92 and len(ids) > 3:
                gone = ids.pop(rng.randrange(len(ids)))
                reply = await client.forget(user, note_ids=[gone], confirmed=True)
                token = reply.token or token
                continue
            else:
                written = await client.revert(user, rng.choice(ids), 1)
        except EngramError:
            continue  # a superseded note cannot change, a note at version 1 has nothing to revert to
        token = written.token
        if step % 12 == 5:
            moments.append(token)
    moments.append(token)
    for as_of in moments:
        for superseded in (False, True):
            # The listing the long way: category by category (the listing's first order).
            parts = [
                await client.list_notes(
                    user, as_of=as_of, include_superseded=superseded, category=c, limit=1000, after=token
                )
                for c in "abcd"
            ]
            whole = NotesReply(notes=[n for p in parts for n in p.notes], total=sum(p.total for p in parts))
            pages = []
            for offset in range(0, whole.total + 7, 7):
                page = await client.list_notes(user, as_of=as_of, include_superseded=superseded, offset=offset, limit=7)
                assert page.total == whole.total, (as_of, superseded, offset)
                pages += page.notes
            assert [(n.id, n.version, n.status) for n in pages] == [(n.id, n.version, n.status) for n in whole.notes]


async def test_a_tombstone_is_in_a_listing_of_the_past_only_where_its_note_was(client: EngramClient, user: str) -> None:
    old = await client.save(user, "I work at Acme", category="work")
    new = await client.save(user, "I work at Initech", category="work")
    await client.supersede(user, old.note_id, new.note_id)
    await client.update(user, new.note_id, category="jobs")
    t1 = await moment()
    gone = await client.forget(user, note_ids=[old.note_id], confirmed=True)
    await client.forget(user, note_ids=[new.note_id], confirmed=True)
    active = await client.list_notes(user, as_of=t1, after=gone.token)
    # The superseded note was not in the listing then: no tombstone of it; the other's tombstone
    # is placed by the category it had then.
    assert [(n.id, n.status, n.category) for n in active.notes] == [(new.note_id, NoteStatus.FORGOTTEN, "jobs")]
    assert active.total == 1
    everything = await client.list_notes(user, as_of=t1, include_superseded=True)
    assert [n.id for n in everything.notes] == [new.note_id, old.note_id]
    assert all(n.status is NoteStatus.FORGOTTEN and n.content == "" for n in everything.notes)
    # Its history still says nothing of its versions: they went with its words.
    assert (await client.history(user, old.note_id)).versions == []


async def test_a_forget_is_part_of_the_moment_its_own_token_names(client: EngramClient, user: str) -> None:
    """Forgets sent at once with saves, so that several land in one millisecond with other writes:
    read as of each forget's own token, its note is forgotten (out of the listing and its count,
    its forget in what changed); as of the token just before, it is not yet (its tombstone
    listed and counted, no forget in what changed)."""
    kept = [await client.save(user, f"errand {i}: buy {w}", advise=False) for i, w in enumerate("abcdefgh")]
    partition, _ = parse_token(kept[-1].token)
    writes = []
    for i, note in enumerate(kept):
        writes.append(client.forget(user, note_ids=[note.note_id], confirmed=True))
        writes.append(client.save(user, f"chore {i}: water plant {i}", advise=False))
    replies = await asyncio.gather(*writes)
    saved = {n.note_id: parse_token(n.token)[1] for n in [*kept, *replies[1::2]]}
    forgotten = {n.note_id: parse_token(r.token or "")[1] for n, r in zip(kept, replies[::2], strict=True)}
    log = sorted([*saved.values(), *forgotten.values()])

    def token(position: tuple[int, int]) -> str:
        return f"{partition}:{position[0]}-{position[1]}"

    last = token(log[-1])
    for note_id, own in forgotten.items():
        before = max(p for p in log if p < own)
        for moment, done in ((own, True), (before, False)):
            as_of = token(moment)
            # The listing then: every note saved by then and not forgotten by then, a tombstone
            # if forgotten since.
            gone = {n for n, p in forgotten.items() if p <= moment}
            then = {n for n, p in saved.items() if p <= moment and n not in gone}
            listing = await client.list_notes(user, as_of=as_of, limit=100, after=last)
            shown = {n.id: n.status for n in listing.notes}
            assert (note_id in shown) is not done
            assert set(shown) == then and listing.total == len(then), (note_id, done)
            assert all(status is NoteStatus.FORGOTTEN for n, status in shown.items() if n in forgotten)
            changes = await client.diff(user, kept[-1].token, as_of)
            assert {c.note_id for c in changes.changes if c.change == "forgotten"} == gone, (note_id, done)
            # Erasure is absolute: before its forget too, the note reads as its tombstone.
            note = await client.get_note(user, note_id, as_of=as_of)
            assert (note.status, note.content) == (NoteStatus.FORGOTTEN, "")
