"""Memory blocks for prompts: requirements §3's markdown and requirements §5's XML, byte-identical for the
same memory state, within a token budget (counted with a real tokenizer), most relevant kept."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.model import NoteKind
from engram_ledger.services.adapters.minilm import count_tokens
from engram_ledger.services.application.context import (
    MARKDOWN_HEADER,
    MAX_CONTEXT_CHARS,
    MAX_CONTEXT_NOTES,
)
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService, service_settings
from tests.support import longest_stall

pytestmark = pytest.mark.integration

FACTS = [
    ("person", "Alec", "Alec is the user's boss at TechCorp"),
    ("person", "Sarah", "Sarah is a colleague on the Design team"),
    ("preference", None, "User prefers tasks to have due dates on Fridays"),
    ("preference", None, "User likes concise responses"),
    ("context", None, "User works on the Platform team"),
]


async def remember(client: EngramClient, user: str = "alice") -> tuple[dict[str, str], str]:
    ids, token = {}, ""
    for category, subject, text in FACTS:
        written = await client.save(user, text, category=category, subject=subject, advise=False)
        ids[text], token = written.note_id, written.token
    return ids, token


async def test_markdown_is_seed_002s_block_and_byte_identical(client: EngramClient) -> None:
    ids, token = await remember(client)
    first = await client.context("alice", after=token)
    assert first.text == (
        "## Your Memory\n\n"
        "The following is information you've learned about the user from previous conversations.\n"
        "Use this context naturally. To update a memory, use the update_memory tool with the memory ID.\n\n"
        "### Context\n"
        f"- [id:{ids['User works on the Platform team']}] User works on the Platform team\n\n"
        "### Person\n"
        f"- [id:{ids[FACTS[0][2]]}] [Alec] Alec is the user's boss at TechCorp\n"
        f"- [id:{ids[FACTS[1][2]]}] [Sarah] Sarah is a colleague on the Design team\n\n"
        "### Preference\n"
        f"- [id:{ids[FACTS[2][2]]}] User prefers tasks to have due dates on Fridays\n"
        f"- [id:{ids[FACTS[3][2]]}] User likes concise responses\n"
    )
    again = await client.context("alice")
    assert again.text.encode() == first.text.encode() and again.tokens == first.tokens == count_tokens(first.text)
    assert not first.truncated


async def test_xml_is_seed_004s_block_with_profile_facts_procedures_and_relevant_episodes(
    client: EngramClient,
) -> None:
    name = await client.save("alex", "Alex", category="profile", subject="name", advise=False)
    zone = await client.save("alex", "America/Los_Angeles", category="profile", subject="timezone", advise=False)
    coffee = await client.save("alex", "Likes black coffee", category="food", advise=False)
    work = await client.save("alex", "Works as software engineer", category="context", advise=False)
    rule = await client.save(
        "alex",
        "quick update: bullet points only",
        kind=NoteKind.PROCEDURE,
        category="procedure",
        trigger="the user says 'quick update'",
        action="answer with bullet points only",
        advise=False,
    )
    episode = await client.save(
        "alex",
        "Dinner with sister Sarah at Flour+Water",
        kind=NoteKind.EPISODE,
        category="episode",
        summary="Dinner plans with sister Sarah",
        narrative="Alex asked to be reminded about dinner with his sister Sarah on Saturday at 7pm.",
        occurred_at=datetime(2026, 1, 20, 19, 0, tzinfo=UTC),
        advise=False,
    )
    block = await client.context("alex", format="xml", after=episode.token)
    assert block.text == (
        "<user_memory>\n"
        "  <profile>\n"
        "    <name>Alex</name>\n"
        "    <timezone>America/Los_Angeles</timezone>\n"
        "  </profile>\n"
        "  <facts>\n"
        "    Works as software engineer. Likes black coffee.\n"
        "  </facts>\n"
        "  <procedures>\n"
        f"    <procedure id=\"{rule.note_id}\">When the user says 'quick update': answer with bullet points only."
        "</procedure>\n"
        "  </procedures>\n"
        "</user_memory>\n"
    ), "episodes are never loaded wholesale"
    # Every note rendered, in the order the block shows them: the profile's too.
    assert block.note_ids == [name.note_id, zone.note_id, work.note_id, coffee.note_id, rule.note_id]
    focused = await client.context("alex", format="xml", query="what are my plans with my sister?", after=episode.token)
    assert "<relevant_episodes>" in focused.text and 'timestamp="2026-01-20 19:00"' in focused.text
    assert "<summary>Dinner plans with sister Sarah</summary>" in focused.text
    assert episode.note_id in focused.note_ids
    # The search's floor holds for the block too: a query about nothing the user holds brings no
    # episode, and with the floor off the best episode is there, however weak.
    unrelated = await client.context("alex", format="xml", query="What is the capital of Peru?")
    assert "<relevant_episodes>" not in unrelated.text and episode.note_id not in unrelated.note_ids
    weak = await client.context("alex", format="xml", query="What is the capital of Peru?", min_relevance=0)
    assert "<relevant_episodes>" in weak.text and episode.note_id in weak.note_ids
    empty = await client.context("nobody", format="xml")
    assert empty.text == "<user_memory>\n  <profile>\n  </profile>\n  <facts></facts>\n</user_memory>\n"


async def test_a_budget_keeps_the_most_relevant_and_important_deterministically(client: EngramClient) -> None:
    ids, _ = await remember(client)
    extra = await client.save("alice", "User's dog Max needs a walk at 7am", category="context", importance=0.9)
    full = await client.context("alice", after=extra.token)
    budget = full.tokens // 2
    small = await client.context("alice", max_tokens=budget)
    assert small.truncated and small.tokens <= budget and small.tokens == count_tokens(small.text)
    assert extra.note_id in small.note_ids, "the most important note is kept"
    assert (await client.context("alice", max_tokens=budget)).text == small.text
    focused = await client.context("alice", max_tokens=budget, query="who is my manager?")
    assert ids["Alec is the user's boss at TechCorp"] in focused.note_ids and focused.tokens <= budget
    with pytest.raises(EngramError) as refused:
        await client.context("alice", max_tokens=5)
    assert refused.value.code is ErrorCode.INVALID_PARAMETER


XML_FRAME = "<user_memory>\n  <profile>\n  </profile>\n  <facts></facts>\n</user_memory>\n"
FOCUS = "what are my plans with my sister?"


async def remember_alex(client: EngramClient) -> tuple[dict[str, dict[str, str]], str]:
    """A profile, facts, a procedure and an episode; for each note, per format, the text that
    shows it in the block (present exactly when the note is rendered)."""
    shown: dict[str, dict[str, str]] = {}

    async def save(text: str, xml: str | None, **fields: object) -> str:
        written = await client.save("alex", text, advise=False, **fields)  # type: ignore[arg-type]
        note = written.note_id
        shown[note] = {"markdown": f"[id:{note}]", "xml": xml or f'id="{note}"'}
        return written.token

    await save("Alex", "<name>Alex</name>", category="profile", subject="name")
    await save(
        "America/Los_Angeles", "<timezone>America/Los_Angeles</timezone>", category="profile", subject="timezone"
    )
    await save("Likes black coffee", "Likes black coffee.", category="food")
    await save("Works as software engineer", "Works as software engineer.", category="context", importance=0.8)
    await save("Has a sister called Sarah who lives in Oakland", "Has a sister called Sarah", category="family")
    await save("Runs on Sunday mornings", "Runs on Sunday mornings.", category="hobby", importance=0.2)
    await save(
        "quick update: bullet points only",
        None,
        kind=NoteKind.PROCEDURE,
        category="procedure",
        trigger="the user says 'quick update'",
        action="answer with bullet points only",
    )
    token = await save(
        "Dinner with sister Sarah at Flour+Water",
        None,
        kind=NoteKind.EPISODE,
        category="episode",
        summary="Dinner plans with sister Sarah",
        narrative="Alex asked to be reminded about dinner with his sister Sarah on Saturday at 7pm.",
        occurred_at=datetime(2026, 1, 20, 19, 0, tzinfo=UTC),
    )
    return shown, token


async def test_a_budget_smaller_than_the_frame_is_refused_naming_the_smallest_that_works(
    client: EngramClient,
) -> None:
    _, token = await remember(client)
    header = count_tokens(MARKDOWN_HEADER)
    assert header > 20
    for budget in (1, 20, header - 1):
        with pytest.raises(EngramError) as refused:
            await client.context("alice", max_tokens=budget, after=token)
        assert refused.value.code is ErrorCode.INVALID_PARAMETER
        assert f"at least {header}" in refused.value.message, refused.value.message
    smallest = await client.context("alice", max_tokens=header)
    assert smallest.text.startswith("## Your Memory") and smallest.tokens <= header
    assert smallest.note_ids == [] and smallest.truncated

    _, token = await remember_alex(client)
    frame = count_tokens(XML_FRAME)
    for budget in (1, frame - 1):
        with pytest.raises(EngramError) as refused:
            await client.context("alex", format="xml", query=FOCUS, max_tokens=budget, after=token)
        assert refused.value.code is ErrorCode.INVALID_PARAMETER
        assert f"at least {frame}" in refused.value.message, refused.value.message
    bare = await client.context("alex", format="xml", query=FOCUS, max_tokens=frame)
    assert bare.text == XML_FRAME and bare.note_ids == [] and bare.truncated


@pytest.mark.parametrize("format", ["markdown", "xml"])
async def test_no_budget_is_exceeded_and_note_ids_are_every_note_rendered(client: EngramClient, format: str) -> None:
    shown, token = await remember_alex(client)
    full = await client.context("alex", format=format, query=FOCUS, after=token)
    rendered = {note for note, marks in shown.items() if marks[format] in full.text}
    assert full.note_ids and set(full.note_ids) == rendered and not full.truncated
    if format == "xml":
        assert len(rendered) == len(shown), "the profile and the episode are in the full block"
    frame = count_tokens(MARKDOWN_HEADER if format == "markdown" else XML_FRAME)
    seen = set()
    for budget in range(frame, full.tokens + 3, 2):
        block = await client.context("alex", format=format, query=FOCUS, max_tokens=budget)
        assert block.tokens <= budget and block.tokens == count_tokens(block.text), budget
        assert block.truncated == (budget < full.tokens), budget
        rendered = {note for note, marks in shown.items() if marks[format] in block.text}
        assert sorted(block.note_ids) == sorted(rendered), (budget, block.text)
        seen.add(len(rendered))
    assert len(seen) > 3, "the budgets in between keep some of the notes"


async def test_a_large_memory_is_bounded_and_tokenized_off_the_event_loop(redis_url: str) -> None:
    """Building a block tokenized every note on the event loop: 1,010 notes of 1,500 characters
    stopped every other request for about 4 s. The notes considered are now bounded (by count and
    characters, the most important and recent first) and tokenized on a worker thread."""
    running = await RunningService(service_settings(redis_url, index_enabled=False, claim_idle_ms=60_000)).start()
    try:
        async with EngramClient(redis_url, timeout=60) as client:
            token = ""
            for start in range(0, 1010, 100):
                drafts = [NoteDraft(content=f"note {i}: {filler(i)}") for i in range(start, start + 100)]
                token = (await client.save_many("bulk", drafts[: 1010 - start])).token
            built = asyncio.Event()
            watching = asyncio.create_task(longest_stall(built))
            try:
                block = await client.context("bulk", after=token)
            finally:
                built.set()
            stall = await watching
            assert stall < 1.5, f"the event loop stopped for {stall:.2f} s"
            assert block.truncated and 0 < len(block.note_ids) <= MAX_CONTEXT_NOTES
            assert len(block.text) <= MAX_CONTEXT_CHARS + 2 * len(MARKDOWN_HEADER)
            newest = f"note 1009: {filler(1009)}"
            assert newest in block.text, "equal importance: the most recent are kept"
    finally:
        await running.stop()


def filler(i: int) -> str:
    """1,500 characters of words that differ from note to note."""
    words = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")
    return " ".join(f"{words[(i * 7 + k) % len(words)]}{(i * 31 + k) % 997}" for k in range(200))[:1500]
