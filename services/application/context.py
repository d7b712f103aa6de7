"""Memory blocks for prompts (requirements §3 and §5): the same memory state always renders to the
same bytes (prompt caching), and a token budget keeps the most relevant and important notes.

Rendering is pure (``render_markdown``, ``render_xml``); ``select`` picks what fits the budget,
deterministically: notes ranked by relevance to the query (when given), then importance, then
recency, then id, are taken while they fit; the chosen ones are then rendered in the canonical
order (category, created_at, id) so adding one note never reshuffles the others. Tokens are
counted with MiniLM's own WordPiece tokenizer (no download: it ships with the model package).

A budget is a promise: the block never exceeds it. The profile and the episodes count like any
note (the profile is kept first, then the episodes); a budget smaller than the block's frame
(markdown's header, XML's empty ``<user_memory>``) is refused with the smallest one that works.

What a block costs is tokenizing its notes, so it is bounded: the notes considered are the first
as ``select`` ranks them, at most ``MAX_CONTEXT_NOTES`` of them and ``MAX_CONTEXT_CHARS``
characters of their text (the block says ``truncated`` when that leaves any out); the rendering
and tokenizing run on a worker thread, lines tokenized in batches, so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from xml.sax.saxutils import escape, quoteattr

import msgspec

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import LIST_NOTES_MAX, MAX_CONTEXT_TOKENS
from engram_ledger.contracts.model import NoteKind, NoteStatus, NoteView
from engram_ledger.contracts.queries import BuildContext, ContextReply, SearchNotes
from engram_ledger.services.application.past import listing_then, moment_of, reads_past
from engram_ledger.services.application.ports import NoteHistory, PastReader
from engram_ledger.services.application.recalls import RecallAudit
from engram_ledger.services.application.search import SearchService, lapsed


def markdown_header(update_tool: str | None = "update_memory") -> str:
    """The block's opening; it names the agent's update tool only when the agent has one."""
    how = f" To update a memory, use the {update_tool} tool with the memory ID." if update_tool else ""
    return (
        "## Your Memory\n\n"
        "The following is information you've learned about the user from previous conversations.\n"
        f"Use this context naturally.{how}\n"
    )


MARKDOWN_HEADER = markdown_header()
PROFILE_CATEGORY = "profile"
PROFILE_FIELDS = ("name", "timezone")
# The most notes one block considers, and the most characters of their text: far more than a
# prompt holds (a token is some four characters of English, so this is more than the largest
# budget), and little enough that tokenizing them stays a bounded cost (under a second of a
# worker thread here) whatever the size of the memory.
MAX_CONTEXT_NOTES = LIST_NOTES_MAX
MAX_CONTEXT_CHARS = 5 * MAX_CONTEXT_TOKENS

# Tokens of each text, in order.
Counter = Callable[[Sequence[str]], list[int]]


def canonical(notes: Sequence[NoteView]) -> list[NoteView]:
    return sorted(notes, key=lambda n: (n.category, n.created_at, n.id))


def validity(note: NoteView) -> str:
    """When what a note says held in the world, as the block shows it: `` (until 2023-05-01)``,
    `` (from 2022-03-01)``, both, or nothing for a note that always holds."""
    parts = []
    if note.valid_from is not None:
        parts.append(f"from {note.valid_from:%Y-%m-%d}")
    if note.valid_until is not None:
        parts.append(f"until {note.valid_until:%Y-%m-%d}")
    return f" ({' '.join(parts)})" if parts else ""


def markdown_line(note: NoteView) -> str:
    subject = f"[{note.subject}] " if note.subject else ""
    if note.kind is NoteKind.PROCEDURE and note.trigger and note.action:
        return f"- [id:{note.id}] {subject}When {note.trigger}: {note.action}"
    return f"- [id:{note.id}] {subject}{' '.join(note.content.split())}{validity(note)}"


def render_markdown(notes: Sequence[NoteView], update_tool: str | None = "update_memory") -> str:
    """Requirements §3's block: grouped by category, ``- [id:xxxxxxxx] [subject] content``."""
    if not notes:
        return ""
    lines = [markdown_header(update_tool)]
    category = None
    for note in canonical(notes):
        if note.category != category:
            if category is not None:
                lines.append("")
            category = note.category
            lines.append(f"### {category.replace('_', ' ').replace('-', ' ').title()}")
        lines.append(markdown_line(note))
    return "\n".join(lines) + "\n"


def sentence(text: str) -> str:
    text = " ".join(text.split())
    return text if text.endswith((".", "!", "?")) else text + "."


def fact_sentence(note: NoteView) -> str:
    """A fact as a sentence of the xml block, with when it held (before its full stop)."""
    when = validity(note)
    if not when:
        return sentence(note.content)
    return sentence(" ".join(note.content.split()).rstrip(".") + when)


def is_profile(note: NoteView) -> bool:
    """A note of category ``profile`` whose subject names a profile field."""
    return note.category == PROFILE_CATEGORY and (note.subject or "").strip().lower() in PROFILE_FIELDS


def profile_notes(notes: Sequence[NoteView]) -> list[NoteView]:
    """The note shown for each profile field (the latest updated), in the fields' order."""
    found: dict[str, NoteView] = {}
    for note in notes:
        if not is_profile(note):
            continue
        field = (note.subject or "").strip().lower()
        if field not in found or (note.updated_at, note.id) > (found[field].updated_at, found[field].id):
            found[field] = note
    return [found[field] for field in PROFILE_FIELDS if field in found]


def profile_of(notes: Sequence[NoteView]) -> dict[str, str]:
    """Requirements §5's profile: notes of category ``profile`` whose subject is a profile field."""
    return {(n.subject or "").strip().lower(): " ".join(n.content.split()) for n in profile_notes(notes)}


def render_xml(
    profile: Mapping[str, str],
    facts: Sequence[NoteView],
    procedures: Sequence[NoteView] = (),
    episodes: Sequence[NoteView] = (),
) -> str:
    """Requirements §5's block: ``<user_memory>`` with the profile and the facts joined as plain
    sentences; procedures as rules; ``<relevant_episodes>`` only when episodes are given."""
    lines = ["<user_memory>", "  <profile>"]
    lines += [f"    <{field}>{escape(profile[field])}</{field}>" for field in PROFILE_FIELDS if field in profile]
    lines.append("  </profile>")
    joined = " ".join(fact_sentence(n) for n in canonical(facts))
    lines.append(f"  <facts>{escape(joined)}</facts>" if not joined else f"  <facts>\n    {escape(joined)}\n  </facts>")
    if procedures:
        lines.append("  <procedures>")
        for note in canonical(procedures):
            rule = f"When {note.trigger}: {note.action}" if note.trigger and note.action else note.content
            lines.append(f"    <procedure id={quoteattr(note.id)}>{escape(sentence(rule))}</procedure>")
        lines.append("  </procedures>")
    lines.append("</user_memory>")
    if episodes:
        lines += ["", "<relevant_episodes>"]
        for note in episodes:
            at = (note.occurred_at or note.created_at).strftime("%Y-%m-%d %H:%M")
            lines.append(f"  <episode id={quoteattr(note.id)} timestamp={quoteattr(at)}>")
            lines.append(f"    <summary>{escape(' '.join((note.summary or note.content).split()))}</summary>")
            lines.append(f"    <narrative>{escape(' '.join((note.narrative or note.content).split()))}</narrative>")
            lines.append("  </episode>")
        lines.append("</relevant_episodes>")
    return "\n".join(lines) + "\n"


def ranked(notes: Sequence[NoteView], relevance: Mapping[str, float] | None = None) -> list[NoteView]:
    """Most relevant and important first; ties by recency, then id, so the order is deterministic."""
    relevance = relevance or {}
    return sorted(notes, key=lambda n: (-relevance.get(n.id, 0.0), -n.importance, -n.created_at.timestamp(), n.id))


def select(
    notes: Sequence[NoteView],
    cost: Callable[[NoteView], int],
    budget: int,
    relevance: Mapping[str, float] | None = None,
) -> list[NoteView]:
    """The notes that fit ``budget`` tokens (each costing ``cost(note)``), taken in ``ranked``
    order."""
    chosen, spent = [], 0
    for note in ranked(notes, relevance):
        price = cost(note)
        if spent + price <= budget:
            chosen.append(note)
            spent += price
    return chosen


Render = Callable[[Sequence[NoteView], Sequence[NoteView], Sequence[NoteView]], str]
Rendered = Callable[[Sequence[NoteView], Sequence[NoteView], Sequence[NoteView]], list[str]]


@dataclass(frozen=True)
class _Block:
    """How one format makes a block: from the notes ``fixed`` first (XML's profile, dropped last),
    the ``chosen`` among ``candidates`` and the episodes, its text (``render``) and the ids it
    shows in order (``rendered``); ``line``: what one note puts in it, and the tokens counted on
    top of it (the join)."""

    candidates: list[NoteView]
    fixed: list[NoteView]
    render: Render
    rendered: Rendered
    line: Callable[[NoteView], tuple[str, int]]


def _markdown_block(notes: list[NoteView], update_tool: str | None) -> _Block:
    candidates = [n for n in notes if n.kind is not NoteKind.EPISODE]

    def render(kept: Sequence[NoteView], chosen: Sequence[NoteView], eps: Sequence[NoteView]) -> str:
        # With notes to show, the header is the frame: a budget that fits no note still answers
        # it (an empty text would read as "no memory at all").
        if chosen or not candidates:
            return render_markdown(chosen, update_tool)
        return markdown_header(update_tool)

    def rendered(kept: Sequence[NoteView], chosen: Sequence[NoteView], eps: Sequence[NoteView]) -> list[str]:
        return [n.id for n in canonical(chosen)]

    return _Block(candidates, [], render, rendered, lambda note: (markdown_line(note), 1))


def _xml_block(notes: list[NoteView]) -> _Block:
    def render(kept: Sequence[NoteView], chosen: Sequence[NoteView], eps: Sequence[NoteView]) -> str:
        facts = [n for n in chosen if n.kind is NoteKind.FACT]
        rules = [n for n in chosen if n.kind is NoteKind.PROCEDURE]
        return render_xml(profile_of(kept), facts, rules, eps)

    def rendered(kept: Sequence[NoteView], chosen: Sequence[NoteView], eps: Sequence[NoteView]) -> list[str]:
        # In the order the block shows them: profile, facts, procedures, episodes.
        facts = [n.id for n in canonical(chosen) if n.kind is NoteKind.FACT]
        rules = [n.id for n in canonical(chosen) if n.kind is NoteKind.PROCEDURE]
        return [n.id for n in kept] + facts + rules + [n.id for n in eps]

    def line(note: NoteView) -> tuple[str, int]:
        if note.kind is NoteKind.PROCEDURE:
            return sentence(note.content), 8
        return fact_sentence(note), 1

    candidates = [n for n in notes if n.kind is not NoteKind.EPISODE and not is_profile(n)]
    return _Block(candidates, profile_notes(notes), render, rendered, line)


class ContextService:
    """Answers ``BuildContext`` from the history read model (and the search, for relevance)."""

    def __init__(
        self,
        history: NoteHistory,
        search: SearchService | None,
        count: Counter,
        audit: RecallAudit | None = None,
        past: PastReader | None = None,
    ) -> None:
        # count: word pieces of each text, by the embedding model's tokenizer (an adapter's);
        # past: what a block as of a moment reads (None: such blocks are refused).
        self._history = history
        self._past = past
        self._search = search
        self._count_many = count
        self._audit = audit

    def _count(self, text: str) -> int:
        # The tokenizer splits at whitespace before anything else, so a text's count is the sum
        # of its lines' counts; as a batch of lines it is counted some three times faster.
        return sum(self._count_many(text.split("\n")))

    async def build(self, query: BuildContext) -> ContextReply:
        if query.as_of is not None:
            past = reads_past(self._past)
            moment = moment_of(past, query.user_id, query.as_of)
            then = await listing_then(past, query.user_id, moment, include_superseded=False)
            listed = await then.views(past, query.user_id, then.order)
            # A note forgotten since is a tombstone there: nothing of it goes into a prompt.
            notes = [n for n in listed if n.status is NoteStatus.ACTIVE]
        else:
            now = datetime.now(UTC)
            notes = [n for n in await self._history.list_notes(query.user_id, None, False) if not lapsed(n, now)]
        relevance: dict[str, float] = {}
        episodes: list[NoteView] = []
        if query.query is not None and self._search is not None:
            # The caller's token holds for the index too: what it just saved can be relevant.
            # The search's floor holds here too: a note below it is not relevant to the query,
            # and an episode below it is not shown.
            asked = SearchNotes(
                user_id=query.user_id,
                query=query.query,
                top_k=20,
                after=query.after,
                min_relevance=query.min_relevance,
                as_of=query.as_of,
                origin=query.origin,  # the console's block counts no reads, as its searches do not
            )
            found = await self._search.search(asked, record=False)
            relevance = {h.note_id: h.score for h in found.results}
            if query.format == "xml":
                episode = msgspec.structs.replace(asked, top_k=3, kind=NoteKind.EPISODE, after=None)
                hits = await self._search.search(episode, record=False)
                episodes = [h.note for h in hits.results if h.note is not None]
        reply = await asyncio.to_thread(self._compose, query, notes, relevance, episodes)
        if self._audit is not None and query.as_of is None and self._audit.audits(query.user_id):
            versions = {n.id: n.version for n in [*notes, *episodes]}
            shown = [(note_id, versions.get(note_id, 1)) for note_id in reply.note_ids]
            subjects = self._search.runtime if self._search is not None else None
            await self._audit.record(query.user_id, "context", query.query, shown, query.origin, subjects=subjects)
        return reply

    def _compose(
        self, query: BuildContext, notes: list[NoteView], relevance: dict[str, float], episodes: list[NoteView]
    ) -> ContextReply:
        """The block from the notes read: CPU only (rendering, tokenizing), run on a worker thread."""
        block = _markdown_block(notes, query.update_tool) if query.format == "markdown" else _xml_block(notes)
        considered: list[NoteView] = []
        chars = 0
        for note in ranked(block.candidates, relevance):
            chars += len(block.line(note)[0])
            if len(considered) == MAX_CONTEXT_NOTES or chars > MAX_CONTEXT_CHARS:
                break
            considered.append(note)
        truncated = len(considered) < len(block.candidates)
        fixed, chosen = block.fixed, considered
        text = block.render(fixed, chosen, episodes)
        if query.max_tokens is not None and self._count(text) > query.max_tokens:
            truncated = True
            fixed, chosen, episodes = self._fitted(query, block, considered, relevance, episodes)
            text = block.render(fixed, chosen, episodes)
        ids = block.rendered(fixed, chosen, episodes)
        return ContextReply(text=text, tokens=self._count(text), note_ids=ids, truncated=truncated)

    def _fitted(
        self,
        query: BuildContext,
        block: _Block,
        candidates: list[NoteView],
        relevance: dict[str, float],
        episodes: list[NoteView],
    ) -> tuple[list[NoteView], list[NoteView], list[NoteView]]:
        """What of the block fits ``max_tokens``: (fixed, chosen, episodes)."""
        budget = query.max_tokens
        assert budget is not None
        frame = self._count(block.render([], [], []))
        if frame > budget:
            whole = self._count(block.render(block.fixed, candidates, episodes))
            raise EngramError(
                ErrorCode.INVALID_PARAMETER,
                f"max_tokens {budget} cannot hold this {query.format} block: its frame alone is {frame} "
                f"tokens, so give max_tokens of at least {frame} (the whole block is {whole})",
            )
        fixed = list(block.fixed)
        # Episodes go before the profile: they are the larger, and the profile names the user.
        while self._count(block.render(fixed, [], episodes)) > budget:
            if episodes:
                episodes = episodes[:-1]
            else:
                fixed = fixed[:-1]
        spent = self._count(block.render(fixed, [], episodes))
        lines = [block.line(n) for n in candidates]
        counted = self._count_many([said for said, _ in lines])
        costs = {n.id: tokens + extra for n, (_, extra), tokens in zip(candidates, lines, counted, strict=True)}
        chosen = select(candidates, lambda n: costs[n.id], budget - spent, relevance)
        # The per-note estimate can be off by a token or two at the joins: trim the least ranked
        # until it fits. The frame fits, so this ends.
        while self._count(block.render(fixed, chosen, episodes)) > budget:
            if chosen:
                chosen = chosen[:-1]
            elif episodes:
                episodes = episodes[:-1]
            else:
                fixed = fixed[:-1]
        return fixed, chosen, episodes
