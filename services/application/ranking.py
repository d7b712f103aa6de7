"""How a search ranks: two candidate lists (dense cosine, BM25) fused into one order of notes.

Pure functions, shared by the search service and the offline tuning script
(``bench/tune_locomo.py``), so what is measured is what is served.

The fusion was chosen by leave-one-conversation-out on LoCoMo (README, Performance): on real
dialogue names, places and rare words carry much of the evidence, and a fusion that normalizes
each signal over its own candidates lets either one win when it is strong. The weights are
``ENGRAM_SEARCH_WEIGHTS``; the method ``ENGRAM_SEARCH_FUSION``.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from engram_ledger.services.application.vector_index import IndexHit

# How many turns before a conversation turn are indexed with it (its context).
CONTEXT_TURNS = 2

FusionMethod = Literal["minmax", "dbsf", "rrf", "score", "mixed"]
FUSION_METHODS: tuple[str, ...] = ("minmax", "dbsf", "rrf", "score", "mixed")

# ``score``: BM25 scores are unbounded; s / (s + 6) maps them to [0, 1).
BM25_SATURATION = 6.0
# ``rrf``: the usual constant of reciprocal rank fusion.
RRF_K = 60.0


@dataclass(frozen=True)
class RankingPolicy:
    """``method``: how the two lists are put on one scale before their weighted sum.

    - ``minmax``: each list scaled to [0, 1] by its own best and worst candidate;
    - ``dbsf``: each list scaled by its mean +- 3 standard deviations (Qdrant's DBSF), clipped;
    - ``rrf``: weighted reciprocal ranks;
    - ``score``: raw cosine plus a saturated BM25 score ``s / (s + saturation)`` (Engram
      before LoCoMo);
    - ``mixed``: cosine scaled as ``minmax``, BM25 saturated as ``score``: a note matching
      only one common word of the query keeps a small keyword score even when it is the only
      keyword match (scaling would make it the best).

    A candidate missing from one list gets that list's floor (0)."""

    method: FusionMethod = "minmax"
    dense_weight: float = 0.3
    keyword_weight: float = 0.7
    saturation: float = BM25_SATURATION
    # ``minmax``: BM25 scores are scaled by the best one or by this, whichever is higher, so a
    # lone weak keyword match (one common word) does not count as a strong one.
    keyword_floor: float = 40.0
    # ``minmax``: cosines are scaled by their spread or by this, whichever is wider, so notes
    # nearly as close as each other (near-duplicates) stay nearly equal.
    dense_span: float = 0.2
    # A turn's point in context (its words after the turns before it) counts this much of its
    # own words' point: context finds what the turn alone cannot, but should not outrank it.
    context_weight: float = 0.9
    # Added to a note whose subject, or a turn whose speaker, the query names ("What did
    # Caroline say about ...?"): names carry much of a dialogue's evidence.
    name_boost: float = 0.1
    # Added to a conversation turn, times the best score of another candidate turn of its
    # session: evidence that spans turns sits in one session, and a session that holds two
    # strong candidates is likely the one asked about.
    session_boost: float = 0.2
    # Added to what happened within the time the query names ("in May 2023", "last week";
    # ``when.asked_period``): large enough to bring it ahead of the candidates outside it.
    time_boost: float = 0.5

    def __str__(self) -> str:
        tail = f", s/(s+{self.saturation:g})" if self.method in ("score", "mixed") else ""
        if self.method == "minmax":
            tail = f", floor {self.keyword_floor:g}, span {self.dense_span:g}"
        if self.context_weight != 1.0:
            tail += f", context {self.context_weight:g}"
        if self.name_boost:
            tail += f", name +{self.name_boost:g}"
        if self.session_boost:
            tail += f", session +{self.session_boost:g}"
        if self.time_boost:
            tail += f", time +{self.time_boost:g}"
        return f"{self.method}({self.dense_weight:g}, {self.keyword_weight:g}{tail})"


def best_per_note(hits: Sequence[IndexHit], context_weight: float = 1.0) -> dict[str, float]:
    """A note may have several points (chunks, a turn's words alone and in context): the best
    one stands for it, a context point's score weighted. Returned in order of that score."""
    best: dict[str, float] = {}
    for hit in hits:
        note_id = hit.payload["note_id"]
        score = hit.score * context_weight if hit.payload.get("context") else hit.score
        if note_id not in best or score > best[note_id]:
            best[note_id] = score
    return dict(sorted(best.items(), key=lambda item: -item[1]))


def _scaled(scores: dict[str, float], method: FusionMethod) -> dict[str, float]:
    if not scores:
        return {}
    values = list(scores.values())
    if method == "minmax":
        low, high = min(values), max(values)
        span = high - low
        # One candidate, or all equal: each is as good as the best.
        return {n: (s - low) / span if span > 0 else 1.0 for n, s in scores.items()}
    if method == "dbsf":
        mean = statistics.fmean(values)
        sd = statistics.pstdev(values) if len(values) > 1 else 0.0
        if sd == 0:
            return {n: 1.0 for n in scores}
        low, span = mean - 3 * sd, 6 * sd
        return {n: min(1.0, max(0.0, (s - low) / span)) for n, s in scores.items()}
    if method == "rrf":
        return {n: 1.0 / (RRF_K + rank) for rank, n in enumerate(scores, start=1)}
    raise ValueError(method)


def fuse(
    dense: Sequence[IndexHit], sparse: Sequence[IndexHit], policy: RankingPolicy = RankingPolicy()
) -> list[tuple[str, float, float]]:
    """(note id, fused score, cosine) per candidate note, best first (ties by id)."""
    cosine = best_per_note(dense, policy.context_weight)
    keyword = best_per_note(sparse, policy.context_weight)
    plain = best_per_note(dense)  # what ``similarity`` reports: the cosine of the best point
    if policy.method in ("score", "mixed"):
        d = {n: max(c, 0.0) for n, c in cosine.items()} if policy.method == "score" else _scaled(cosine, "minmax")
        k = {n: s / (s + policy.saturation) for n, s in keyword.items()}
    elif policy.method == "minmax":
        low, high = (min(cosine.values()), max(cosine.values())) if cosine else (0.0, 0.0)
        span = max(high - low, policy.dense_span)
        d = {n: (c - low) / span if span > 0 else 1.0 for n, c in cosine.items()}
        top = max([*keyword.values(), policy.keyword_floor])
        k = {n: s / top for n, s in keyword.items()} if top > 0 else {}
    else:
        d, k = _scaled(cosine, policy.method), _scaled(keyword, policy.method)
    fused = [
        (n, policy.dense_weight * d.get(n, 0.0) + policy.keyword_weight * k.get(n, 0.0), plain.get(n, 0.0))
        for n in set(cosine) | set(keyword)
    ]
    return sorted(fused, key=lambda item: (-item[1], item[0]))


def context_vector(vectors: Sequence[Sequence[float]]) -> list[float]:
    """A turn's vector in context: the normalized mean of its own and the turns' before it."""
    size = len(vectors[0])
    total = [sum(v[i] for v in vectors) for i in range(size)]
    norm = math.sqrt(sum(x * x for x in total)) or 1.0
    return [x / norm for x in total]


def context_text(own: str, before: Sequence[str]) -> str:
    """A conversation turn as indexed with its context: the turns before it, then its own
    words, one per line. The hit is still the one turn."""
    return "\n".join([*before, own])


DEFAULT_POLICY = RankingPolicy()


_WORD = re.compile(r"\w+")


def words(text: str) -> set[str]:
    return {w.casefold() for w in _WORD.findall(text)}


def names_in(query_words: set[str], name: str | None) -> bool:
    """Whether the query names this subject or speaker: every word of the name is in it."""
    name_words = words(name) if name else set()
    return bool(name_words) and name_words <= query_words


def boost_named(
    ranked: Sequence[tuple[str, float, float]], names: Mapping[str, str | None], query: str, boost: float
) -> list[tuple[str, float, float]]:
    """``fuse``'s order with ``boost`` added to the candidates whose name the query says."""
    if not boost:
        return list(ranked)
    said = words(query)
    lifted = [(n, s + boost if names_in(said, names.get(n)) else s, c) for n, s, c in ranked]
    return sorted(lifted, key=lambda item: (-item[1], item[0]))


def boost_sessions(
    ranked: Sequence[tuple[str, float, float]], sessions: Mapping[str, str | None], boost: float
) -> list[tuple[str, float, float]]:
    """Each candidate with a session (a conversation turn) gains ``boost`` times the best score
    of another candidate of the same session; re-sorted."""
    if not boost:
        return list(ranked)
    best: dict[str, list[float]] = {}
    for n, s, _ in ranked:
        session = sessions.get(n)
        if session is not None:
            best.setdefault(session, []).append(s)
    for scores in best.values():
        scores.sort(reverse=True)

    def other(n: str, s: float) -> float:
        scores = best.get(sessions.get(n) or "", [])
        # The best of the others: the second best when this one is the best.
        return (scores[1] if scores[0] == s else scores[0]) if len(scores) > 1 else 0.0

    lifted = [(n, s + boost * other(n, s) if sessions.get(n) is not None else s, c) for n, s, c in ranked]
    return sorted(lifted, key=lambda item: (-item[1], item[0]))


def boost_period(
    ranked: Sequence[tuple[str, float, float]], within: Mapping[str, bool], boost: float
) -> list[tuple[str, float, float]]:
    """``boost`` added to the candidates that happened within the period the query names."""
    if not boost or not any(within.values()):
        return list(ranked)
    lifted = [(n, s + boost if within.get(n) else s, c) for n, s, c in ranked]
    return sorted(lifted, key=lambda item: (-item[1], item[0]))
