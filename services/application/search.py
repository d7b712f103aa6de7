"""The search responder: embed the query (dense and BM25), ask the vector index for fused hits,
fold chunks into notes, and read each note's text from the history read model (the index holds
no text). Another user's notes are never candidates: every index query is filtered by user."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import SEARCH_DEPTH_MAX
from engram_ledger.contracts.model import MessageView, NoteStatus, NoteView
from engram_ledger.contracts.queries import SearchHit, SearchNotes, SearchReply
from engram_ledger.services.application.as_of import Moment, current_at, holds_at
from engram_ledger.services.application.deadline import index_ready
from engram_ledger.services.application.past import moment_of, reads_past
from engram_ledger.services.application.ports import AccessStats, NoteHistory, PastReader
from engram_ledger.services.application.ranking import (
    DEFAULT_POLICY,
    RankingPolicy,
    best_per_note,
    boost_named,
    boost_period,
    boost_sessions,
    fuse,
)
from engram_ledger.services.application.reads import counted, read_at
from engram_ledger.services.application.recalls import RecallAudit
from engram_ledger.services.application.relevance import DEFAULT_FLOOR, MODEL, RelevanceModel, Signals, features
from engram_ledger.services.application.terms import sparse_query
from engram_ledger.services.application.vector_index import (
    CONVERSATION,
    DENSE,
    MEMORY,
    SPARSE,
    NearestQuery,
    Ranges,
    SearchableIndex,
    Sparse,
    TimeWindow,
    VectorIndex,
)
from engram_ledger.services.application.when import Period, asked_period, time_only
from engram_ledger.services.common.stages import stage
from engram_ledger.services.domain.values import matches


@dataclass(frozen=True)
class BlendPolicy:
    """``ranking="blended"``: ``relevance * fused + recency * 0.5 ** (age / half_life) +
    importance * note.importance``, where age runs from the note's last update or last access,
    whichever is later (requirements §5's decay: what is used stays fresh)."""

    relevance: float = 0.7
    recency: float = 0.15
    importance: float = 0.15
    half_life_days: float = 30.0

    def score(self, fused: float, note: NoteView, now: datetime) -> float:
        last = max(note.updated_at, note.last_accessed_at or note.updated_at)
        age_days = max(0.0, (now - last).total_seconds() / 86400)
        fresh = 0.5 ** (age_days / self.half_life_days)
        return self.relevance * fused + self.recency * fresh + self.importance * note.importance


# Candidates per signal and scope: the fusion scales each signal over these.
CANDIDATES = 50
# The best candidates the name boost can re-order (see RankingPolicy.name_boost).
NAMED_WINDOW = 40
# What the ranking reads of a point's payload.
FIELDS = ["note_id", "record", "context"]


def _ts(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


def _scopes(
    query: SearchNotes, subject_key: Callable[[str, str], str], superseded_too: bool = False
) -> list[dict[str, str | list[str]]]:
    """The index filters a search runs with: the user's notes, and their conversations if asked.
    A subject is matched by its keyed hash (the index holds no subject text), case and spacing
    aside. ``superseded_too``: superseded notes are candidates (the hits keep those that held
    at the time asked about)."""
    match: dict[str, str | list[str]] = {
        "record": MEMORY,
        "status": ["active", "superseded"] if query.include_superseded or superseded_too else "active",
    }
    if query.category is not None:
        match["category"] = query.category
    if query.category_prefix is not None:
        match["category_path"] = query.category_prefix
    if query.kind is not None:
        match["kind"] = query.kind.value
    if query.subject is not None:
        match["subject_key"] = subject_key(query.user_id, query.subject)
    scopes = [match]
    # A filter on values or keys is a filter on notes: turns have neither.
    if query.include_conversation and not (query.where or query.keyed_only):
        # Without a session: every conversation the user has had (long-term memory).
        said: dict[str, str | list[str]] = {"record": CONVERSATION}
        if query.session_id is not None:
            said["session_id"] = query.session_id
        scopes.append(said)
    return scopes


class SearchService:
    def __init__(
        self,
        runtime: SearchableIndex,
        history: NoteHistory,
        read_wait_seconds: float,
        policy: RankingPolicy = DEFAULT_POLICY,
        access: AccessStats | None = None,
        blend: BlendPolicy = BlendPolicy(),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        relevance: RelevanceModel = MODEL,
        floor: float = DEFAULT_FLOOR,
        audit: RecallAudit | None = None,
        past: PastReader | None = None,
    ) -> None:
        """``floor``: the ``min_relevance`` of a search that gives none; ``audit``: records
        what searches show, for the users the deployment audits; ``past``: what a search of the
        past reads its notes with (None: such searches are refused)."""
        self._audit = audit
        self._runtime = runtime
        self._history = history
        self._past = past
        self._wait = read_wait_seconds
        self._policy = policy
        self._access = access
        self._blend = blend
        self._clock = clock
        self._relevance = relevance
        self.floor = floor
        self._touching: set[asyncio.Task[None]] = set()

    async def search(self, query: SearchNotes, record: bool = True) -> SearchReply:
        """``record``: a recall is recorded (where audited) for this search; a memory block
        records its own instead."""
        reply = await self._search(query)
        if record and self._audit is not None and query.as_of is None and self._audit.audits(query.user_id):
            shown = [
                (h.note_id, h.note.version if h.note else h.message.version if h.message else 1) for h in reply.results
            ]
            await self._audit.record(query.user_id, "search", query.query, shown, query.origin, subjects=self._runtime)
        return reply

    @property
    def runtime(self) -> SearchableIndex:
        """The index it searches (a recall finds the notes a query names by subject there)."""
        return self._runtime

    async def _search(self, query: SearchNotes) -> SearchReply:
        depth = query.offset + query.top_k
        if depth > SEARCH_DEPTH_MAX:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER,
                f"offset + top_k is {depth}; a search pages at most {SEARCH_DEPTH_MAX} results deep",
            )
        # Before the token: while the model loads, the index cannot reach it either.
        await index_ready(self._runtime, "search", self._wait)
        with stage("wait for the token"):
            await self._caught_up(query)
        moment = moment_of(reads_past(self._past), query.user_id, query.as_of) if query.as_of else None
        read = self._reader(query.user_id, moment)
        with stage("query parsing and time phrases"):
            plan = self._plan(query, moment)
        index = self._index(past=moment is not None)
        # BM25 needs no vector: its queries run in the index's thread while the model encodes.
        keywords = asyncio.create_task(index.nearest_many(plan.queries(query.user_id, SPARSE)))
        try:
            dense = await self._embedding(query.query)
            meaning = await index.nearest_many(plan.queries(query.user_id, DENSE, dense))
        finally:
            keyword = await keywords
        with stage("fusion and levers"):
            # Notes and messages compete in one fusion: each signal is scaled over all candidates.
            dense_hits = [h for hits in meaning for h in hits]
            sparse_hits = [h for hits in keyword for h in hits]
            sources = {h.payload["note_id"]: h.payload.get("record", MEMORY) for h in dense_hits + sparse_hits}
            fused = fuse(dense_hits, sparse_hits, self._policy)
            candidates = [(sources[n], (n, score, cos)) for n, score, cos in fused]
        wanted = depth if query.ranking == "relevance" else depth * 4
        estimate = Estimate(query.query, max((cos for _, (_, _, cos) in candidates), default=0.0), plan.period)
        results = await self._hydrate(query, candidates, wanted, best_per_note(sparse_hits), estimate, plan, read)
        return SearchReply(results=await self._page(query, results, moment, plan.now))

    async def _caught_up(self, query: SearchNotes) -> None:
        """Wait for the caller's token in the index (the timeline, for a search of the past) and
        in the read model."""
        if query.after is None:
            return
        # A search of the past ranks the timeline's points: a projection of its own.
        indexed = self._runtime.wait_for_past if query.as_of else self._runtime.wait_for
        caught_up = await indexed(query.after, self._wait) and await self._history.wait_for(query.after, self._wait)
        if not caught_up:
            raise EngramError(
                ErrorCode.TIMEOUT, f"the index has not reached token {query.after} within {self._wait:g} s; retry later"
            )

    def _plan(self, query: SearchNotes, moment: Moment | None) -> _Plan:
        """What a search asks of the index and keeps of its hits, from the query alone."""
        # Several points of one note or turn may rank together; fetch enough to fill the page (a
        # filter on values leaves some out after the index has ranked them). Sized by the page,
        # not by the offset: every page of one search (same query, same top_k) is a slice of one
        # ranking, which the fusion's scaling over the candidates would not be if a deeper page
        # fetched more of them. A page past them comes back short.
        filtered = query.where or query.keyed_only or query.valid_at is not None
        # A search of the past reads "last week" from its moment, and notes as they were then.
        now = moment.at if moment is not None else self._clock()
        period = asked_period(query.query, now) if self._policy.time_boost else None
        # What held in the world at a time may have been superseded since: a superseded note
        # that says it held then is a candidate when a search asks about that time.
        held = _held(query.valid_at, period)
        # The floor filters the ranking before it is paged, and the read model is read until a
        # page's worth is above it: page two of a search is what follows page one among the hits
        # above the floor. A query that asks about a time and nothing else ("what did I do in
        # May 2023?") is answered by what happened then, whatever else.
        floor = self.floor if query.min_relevance is None else query.min_relevance
        asked_then = period if period is not None and time_only(query.query) else None

        def kept(hit: SearchHit) -> bool:
            return hit.relevance >= floor or (asked_then is not None and within(hit, asked_then))

        return _Plan(
            floor=floor if asked_then is None else None,
            scopes=_scopes(query, self._runtime.subject_key, superseded_too=held is not None),
            sparse=sparse_query(query.query),
            limit=max(CANDIDATES, query.top_k * (20 if filtered else 10)),
            window=TimeWindow(_ts(query.since), _ts(query.until)),
            then=current_at(moment) if moment is not None else {},
            now=now,
            period=period,
            held=held,
            kept=kept,
        )

    async def _page(
        self, query: SearchNotes, results: list[SearchHit], moment: Moment | None, now: datetime
    ) -> list[SearchHit]:
        """The page asked for, with each note's reads (a search of the present counts its hits)."""
        depth = query.offset + query.top_k
        # Reads are not in the log: a search of the past neither shows nor counts them.
        access = self._access if moment is None else None
        if access is not None:
            results = await self._annotate(query.user_id, results)
        if query.ranking == "blended":
            blended = [
                msgspec.structs.replace(h, score=round(self._blend.score(h.score, h.note, now), 6)) if h.note else h
                for h in results
            ]
            results = sorted(blended, key=lambda h: (-h.score, h.note_id))[:depth]
        results = results[query.offset : depth]
        if access is not None and results and counted(query.origin):
            # Counted after the reply is built, off its path: a read is not worth a round trip. The
            # hits show the count this read leaves, as a get or a listing after it shows.
            task = asyncio.create_task(access.touch(query.user_id, [h.note_id for h in results if h.note], now))
            self._touching.add(task)
            task.add_done_callback(self._touching.discard)
            results = [msgspec.structs.replace(h, note=read_at(h.note, now)) if h.note else h for h in results]
        return results

    def _estimate(self, estimate: Estimate, hits: list[SearchHit], ranked_before: int) -> list[SearchHit]:
        """Each hit with its ``relevance``, from the ranking's signals; ``ranked_before``: how
        many hits rank ahead of these (a hit's rank is one of its signals)."""
        signals = [
            Signals(
                similarity=h.similarity,
                conversation=h.found_in == "conversation",
                text=f"{name}: {h.content}" if (name := _name(h)) else h.content,
                name=name,
                within=estimate.period is not None and within(h, estimate.period),
            )
            for h in hits
        ]
        rows = features(estimate.query, signals, estimate.best, first_rank=ranked_before + 1)
        estimates = self._relevance.estimate(rows)
        return [msgspec.structs.replace(h, relevance=round(r, 4)) for h, r in zip(hits, estimates, strict=True)]

    def _index(self, past: bool) -> VectorIndex:
        """The live index (refused while it holds another model's vectors), or with ``past`` its
        timeline."""
        try:
            index = self._runtime.index
        except EngramError:
            raise
        except Exception as e:
            raise EngramError(ErrorCode.EMBEDDING_ERROR, f"cannot search right now: {e}") from None
        if not past:
            return index
        timeline = self._runtime.timeline
        if timeline is None:
            raise EngramError(
                ErrorCode.UNAVAILABLE, "this deployment's index keeps no past: searches as of a moment are off"
            )
        return timeline

    async def _embedding(self, text: str) -> list[float]:
        try:
            with stage("encode"):
                (dense,) = await self._runtime.embedder.embed([text])
        except EngramError:
            raise
        except Exception as e:
            raise EngramError(ErrorCode.EMBEDDING_ERROR, f"cannot search right now: {e}") from None
        return dense

    async def _annotate(self, user_id: str, hits: list[SearchHit]) -> list[SearchHit]:
        assert self._access is not None
        notes = [h.note for h in hits if h.note is not None]
        annotated = {n.id: n for n in await self._access.annotate(user_id, notes)}
        return [msgspec.structs.replace(h, note=annotated[h.note_id]) if h.note else h for h in hits]

    async def _hydrate(
        self,
        query: SearchNotes,
        candidates: list[tuple[str, tuple[str, float, float]]],
        wanted: int,
        keyword: dict[str, float],
        estimate: Estimate,
        plan: _Plan,
        read: Reader,
    ) -> list[SearchHit]:
        """The ``wanted`` best hits that are ``kept`` (above the floor), each with its relevance.
        The text comes from the read model (the index holds none), read a slice at a time in
        one round trip; a hit the read model does not have (yet, or any more) is left out, and
        so is one superseded meanwhile. The first slice, where the best candidates are, is
        re-ordered by the name boost: who said a turn is known only here (the index keeps no
        speakers), and a note's subject is read with it. Candidates the floor would refuse
        whatever their words (too deep in the ranking, too far from the query) are not read."""
        ranked = 0
        results: list[SearchHit] = []
        # The first slice, which the name boost re-orders, is sized by the page too (see above).
        start, size = 0, max(query.top_k * 2, NAMED_WINDOW)
        while start < len(candidates) and len(results) < wanted:
            if start and not self._reachable(estimate, plan.floor, candidates[start:], ranked + 1):
                break
            window = candidates[start : start + size]
            notes, messages = await read(
                query.user_id,
                [record_id for source, (record_id, _, _) in window if source == MEMORY],
                [record_id for source, (record_id, _, _) in window if source == CONVERSATION],
            )
            hits = [
                hit
                for source, (record_id, score, similarity) in window
                if (
                    hit := _hit(
                        query,
                        source,
                        record_id,
                        (round(score, 6), round(similarity, 6), round(keyword.get(record_id, 0.0), 6)),
                        notes,
                        messages,
                        plan.now,
                        plan.held,
                    )
                )
            ]
            if start == 0:
                with stage("fusion and levers"):
                    hits = self._reordered(query.query, hits, estimate.period)
            with stage("relevance features"):
                results += self._kept(estimate, hits, ranked, plan.kept, wanted - len(results))
            # A hit's relevance depends on its rank among every hit, kept or not, so a deeper
            # page never changes the relevance of one above it.
            ranked += len(hits)
            start, size = start + size, max(wanted * 2, NAMED_WINDOW)
        return results[:wanted]

    def _reachable(
        self, estimate: Estimate, floor: float | None, candidates: list[tuple[str, tuple[str, float, float]]], rank: int
    ) -> bool:
        """Whether any of ``candidates``, ranked ``rank`` or lower, could be kept: the most
        relevance the model allows each (its cosine and source known, its words the best they
        could be) reaches the ``floor`` (None: hits are kept for more than their relevance)."""
        if floor is None:
            return True
        return any(
            round(self._relevance.most(cos, estimate.best, rank, source == CONVERSATION), 4) >= floor
            for source, (_, _, cos) in candidates
        )

    def _kept(
        self, estimate: Estimate, hits: list[SearchHit], ranked: int, kept: Callable[[SearchHit], bool], wanted: int
    ) -> list[SearchHit]:
        """The first ``wanted`` of ``hits`` that are ``kept``, each with its relevance: estimated in
        rank order only as far as they are needed (a hit's relevance depends on its rank and the
        search's best cosine, never on the hits after it)."""
        found: list[SearchHit] = []
        done = 0
        while done < len(hits) and len(found) < wanted:
            more = hits[done : done + wanted - len(found)]
            found += [h for h in self._estimate(estimate, more, ranked + done) if kept(h)]
            done += len(more)
        return found

    def _reader(self, user_id: str, moment: Moment | None) -> Reader:
        """How the hits' notes and turns are read from the read model; as of a moment, each note
        as it was then (a turn never changes)."""
        if moment is None:
            return self._history.get_many
        past = reads_past(self._past)

        async def read(
            user_id: str, note_ids: list[str], message_ids: list[str]
        ) -> tuple[dict[str, NoteView], dict[str, MessageView]]:
            (_, messages), found = await asyncio.gather(
                self._history.get_many(user_id, [], message_ids),
                past.notes_at(user_id, note_ids, moment),
            )
            return {n: view for n, view in found.items() if view is not None}, messages

        return read

    def _reordered(self, text: str, hits: list[SearchHit], period: Period | None) -> list[SearchHit]:
        """The first slice re-ordered by what only the read model knows: whom a hit is about
        (the name boost), the session a turn was said in, and when it happened."""
        by_id = {h.note_id: h for h in hits}
        ranked = boost_named(
            [(h.note_id, h.score, h.similarity) for h in hits],
            {h.note_id: _name(h) for h in hits},
            text,
            self._policy.name_boost,
        )
        sessions = {h.note_id: h.message.session_id for h in hits if h.message is not None}
        ranked = boost_sessions(ranked, sessions, self._policy.session_boost)
        if period is not None:
            ranked = boost_period(ranked, {h.note_id: within(h, period) for h in hits}, self._policy.time_boost)
        return [msgspec.structs.replace(by_id[n], score=round(score, 6)) for n, score, _ in ranked]


# Reads the hits' notes and turns: (user, note ids, message ids) -> (notes, messages) by id.
Reader = Callable[[str, list[str], list[str]], Awaitable[tuple[dict[str, NoteView], dict[str, MessageView]]]]


@dataclass(frozen=True)
class Estimate:
    """What every hit's relevance in one search is estimated with: the query, the best cosine
    among all its candidates and the time it names."""

    query: str
    best: float
    period: Period | None


@dataclass(frozen=True)
class _Plan:
    """One search's questions to the index (``scopes``, each asked by dense and by BM25, of
    ``limit`` candidates) and what it keeps of the hits."""

    scopes: list[dict[str, str | list[str]]]
    sparse: Sparse
    limit: int
    window: TimeWindow
    then: Ranges
    now: datetime
    period: Period | None
    held: Callable[[NoteView], bool] | None
    kept: Callable[[SearchHit], bool]
    # The relevance a hit needs to be kept, when nothing else keeps one (None: something may).
    floor: float | None

    def queries(self, user_id: str, using: str, dense: list[float] | None = None) -> list[NearestQuery]:
        """Every scope, by the query's ``dense`` vector or by its BM25 terms."""
        vector: dict[str, Any] = {"dense": dense} if using == DENSE else {"sparse": self.sparse}
        return [
            NearestQuery(
                user_id=user_id,
                using=using,
                match=match,
                limit=self.limit,
                window=self.window,
                ranges=self.then,
                fields=FIELDS,
                **vector,
            )
            for match in self.scopes
        ]


def _held(valid_at: datetime | None, period: Period | None) -> Callable[[NoteView], bool] | None:
    """Which superseded notes a search keeps: those that held in the world at ``valid_at``, or
    during the period the query names (a note that says when it held)."""
    if valid_at is None and period is None:
        return None

    def held(note: NoteView) -> bool:
        if valid_at is not None:
            return holds_at(note, valid_at)
        bounded = note.valid_from is not None or note.valid_until is not None
        return period is not None and bounded and period.overlaps(note.valid_from, note.valid_until)

    return held


def lapsed(view: NoteView, now: datetime) -> bool:
    """A note whose time to live has run out reads as gone, before the saga's timer forgets it."""
    return view.expires_at is not None and view.expires_at <= now


def within(hit: SearchHit, period: Period) -> bool:
    """Whether a hit happened within the period: a turn when it was said, a note when it
    occurred (else when it was saved)."""
    if hit.message is not None:
        return period.holds(hit.message.sent_at or hit.message.created_at)
    if hit.note is not None:
        note = hit.note
        # A note that says when it held in the world happened then: "where did Tess work in
        # 2022?" is answered by what held in 2022.
        if note.valid_from is not None or note.valid_until is not None:
            return period.overlaps(note.valid_from, note.valid_until)
        return period.holds(note.occurred_at or note.created_at)
    return False


def _name(hit: SearchHit) -> str | None:
    """Whom a hit is about (a note's subject) or who said it (a turn's speaker)."""
    if hit.note is not None:
        return hit.note.subject
    return hit.message.speaker if hit.message is not None else None


def _hit(
    query: SearchNotes,
    source: str,
    record_id: str,
    scores: tuple[float, float, float],
    notes: dict[str, NoteView],
    messages: dict[str, MessageView],
    now: datetime,
    held: Callable[[NoteView], bool] | None = None,
) -> SearchHit | None:
    """``scores``: fused, cosine, keyword; ``held``: which superseded notes are kept without
    ``include_superseded``."""
    score, similarity, keyword = scores
    if source == CONVERSATION:
        message = messages.get(record_id)
        if message is None:
            return None
        return SearchHit(
            note_id=record_id,
            content=message.content,
            score=score,
            similarity=similarity,
            keyword=keyword,
            found_in="conversation",
            message=message,
        )
    view = notes.get(record_id)
    if view is None or view.user_id != query.user_id:
        return None
    # A forgotten note's tombstone is never a hit, even before the index has dropped its points.
    if view.status is NoteStatus.FORGOTTEN:
        return None
    if view.status is not NoteStatus.ACTIVE and not query.include_superseded and not (held and held(view)):
        return None
    if (query.keyed_only and view.key is None) or (query.where and not matches(view.value, query.where)):
        return None
    if lapsed(view, now) or (query.valid_at is not None and not holds_at(view, query.valid_at)):
        return None
    return SearchHit(
        note_id=record_id,
        content=view.content,
        score=score,
        similarity=similarity,
        keyword=keyword,
        found_in="memory",
        note=view,
    )
