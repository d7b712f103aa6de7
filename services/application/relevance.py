"""``relevance``: how likely a search hit is to be what the query asks for, in [0, 1].

The fused ``score`` orders one query's candidates but means nothing across queries: it is scaled
over each query's own candidates, so the best hit always looks strong. ``relevance`` is a
logistic model over what the ranking knows of a hit that does not depend on how many notes the
user has (a BM25 score grows with the collection, and the fused score is scaled over it): its
cosine (and how far it falls short of 0.3 and 0.45), how far below the best candidate's it is,
how many of the query's words it holds, its rank, whether it is about someone the query names or
lacks a name the query says, and whether it happened within a time the query names.

Fitted by leave-one-conversation-out (``bench/fit_relevance.py``, which prints the weights
below, the reliability table and the floor's figures) on LoCoMo's development conversations
(each question asked of its own user and of another conversation's, whose memory should match
nothing) and on ``bench_quality``'s dev set (personal facts among filler notes, questions that
paraphrase them). A hit is relevant when it is the evidence for the question, so ``relevance``
estimates that.

Pure functions over the ranked hits: the search service and the fitting script compute the same
features the same way.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from engram_ledger.services.application.ranking import names_in, words
from engram_ledger.services.application.terms import sparse_document, sparse_query

FEATURES = (
    "cosine",  # the query's cosine with the hit's best point
    "cosine_below_best",  # the best candidate's cosine minus this one's (0 for the best)
    "coverage",  # the share of the query's BM25 terms (stop words out, stemmed) the hit holds
    "log_rank",  # log(1 + rank), rank 1 the best
    "conversation",  # 1 for a conversation turn, 0 for a note
    "named",  # 1 when the query names the hit's subject or speaker
    "names_missing",  # the share of the names the query says (capitalized words) the hit lacks
    # A hit the keywords alone found has no cosine (0): its cosine terms say nothing.
    "cosine_unknown",
    # How far the cosine falls short of 0.3 and of 0.45 (0 above): a weak cosine means much less
    # than a linear weight says, and an unrelated question's best hit sits near 0.15.
    "cosine_below_0.3",
    "cosine_below_0.45",
    "within_period",  # 1 when the query names a time and the hit happened within it
)


@dataclass(frozen=True)
class Signals:
    """What the ranking knows of one hit, in ranking order."""

    similarity: float
    conversation: bool
    text: str  # the words searched: the content, after the speaker's or subject's name
    name: str | None
    within: bool = False  # it happened within the time the query names


@dataclass(frozen=True)
class RelevanceModel:
    """``sigmoid(bias + sum(weight * feature))``, one weight per name in ``FEATURES``."""

    weights: tuple[float, ...]
    bias: float

    def __post_init__(self) -> None:
        if len(self.weights) != len(FEATURES):
            raise ValueError(f"{len(FEATURES)} weights expected, one per feature, got {len(self.weights)}")

    def estimate(self, rows: Sequence[Sequence[float]]) -> list[float]:
        return [_sigmoid(self.bias + sum(w * x for w, x in zip(self.weights, row, strict=True))) for row in rows]

    def most(self, similarity: float, best: float, rank: int, conversation: bool) -> float:
        """The highest relevance a hit can have, knowing only what the ranking says of it (its
        cosine, the best candidate's, its source) and that it ranks ``rank`` or lower: every
        feature its words decide (terms held, names, a time) at its most favourable."""
        known = {
            "cosine": similarity,
            "cosine_below_best": best - similarity,
            "conversation": 1.0 if conversation else 0.0,
            "cosine_unknown": 1.0 if similarity == 0 else 0.0,
            "cosine_below_0.3": max(0.0, 0.3 - similarity) if similarity else 0.0,
            "cosine_below_0.45": max(0.0, 0.45 - similarity) if similarity else 0.0,
        }
        total = self.bias
        for name, weight in zip(FEATURES, self.weights, strict=True):
            if name in known:
                total += weight * known[name]
            elif name == "log_rank":
                if weight > 0:
                    return 1.0  # a deeper rank would raise it: no bound
                total += weight * math.log1p(rank)
            else:
                total += max(0.0, weight)  # each of the others lies in [0, 1]
        return _sigmoid(total)


def features(query: str, hits: Sequence[Signals], best: float | None = None, first_rank: int = 1) -> list[list[float]]:
    """One row per hit, in the order of ``FEATURES``; ``hits`` best first, the first at
    ``first_rank``. ``best``: the best cosine among every candidate (by default among ``hits``);
    a search passes it so that each page of it gives a hit the same relevance, whatever the
    page's depth."""
    if not hits:
        return []
    asked = set(sparse_query(query).indices)
    said = words(query)
    names = proper_names(query)
    best = max([h.similarity for h in hits] + ([best] if best is not None else []))
    rows = []
    for rank, hit in enumerate(hits, start=first_rank):
        held, hit_words = _terms_of(hit.text) if asked or names else (frozenset(), frozenset())
        rows.append(
            [
                hit.similarity,
                best - hit.similarity,
                len(asked & held) / len(asked) if asked else 0.0,
                math.log1p(rank),
                1.0 if hit.conversation else 0.0,
                1.0 if names_in(said, hit.name) else 0.0,
                sum(hash(name) not in hit_words for name in names) / len(names) if names else 0.0,
                1.0 if hit.similarity == 0 else 0.0,
                max(0.0, 0.3 - hit.similarity) if hit.similarity else 0.0,
                max(0.0, 0.45 - hit.similarity) if hit.similarity else 0.0,
                1.0 if hit.within else 0.0,
            ]
        )
    return rows


# A hit's text's BM25 terms and words, by a digest of the text: the same notes and turns come
# back search after search, and their terms are what costs. Neither the text nor its words are
# kept (a forgotten note's would stay in memory until pushed out): the words as their hashes
# (Python's, salted per process), which is all a comparison with the query's names needs.
_TERMS: OrderedDict[bytes, tuple[frozenset[int], frozenset[int]]] = OrderedDict()
TERMS_KEPT = 8192


def _terms_of(text: str) -> tuple[frozenset[int], frozenset[int]]:
    key = hashlib.blake2b(text.encode(), digest_size=16).digest()
    found = _TERMS.get(key)
    if found is None:
        found = frozenset(sparse_document(text).indices), frozenset(hash(w) for w in words(text))
        _TERMS[key] = found
        if len(_TERMS) > TERMS_KEPT:
            _TERMS.popitem(last=False)
    else:
        _TERMS.move_to_end(key)
    return found


_CAPITALIZED = re.compile(r"\b[A-Z]\w*")
# Capitalized, but times, not names: a note about May 2023 does not lack "May".
_NOT_NAMES = frozenset(
    [
        "i",
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
    ]
)


def proper_names(query: str) -> set[str]:
    """Capitalized words after a query's first (its first is capitalized anyway), casefolded:
    names of people, places and things, the words a memory about someone else lacks."""
    found = _CAPITALIZED.findall(query.strip())
    first = query.strip()[:1].isupper()
    return {w.casefold() for w in found[1 if first else 0 :]} - _NOT_NAMES


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


# Fitted by ``.venv/bin/python -m bench.fit_relevance --data ../shared/datasets/locomo-dev`` on
# every LoCoMo conversation and dev set user (the dev set a quarter of the weight).
MODEL = RelevanceModel(
    weights=(-0.3099, -2.3686, 1.0934, -2.6712, -0.2309, -0.0175, -3.2937, 1.2991, -3.0230, -3.3350, -0.1861),
    bias=1.7362,
)
# The floor a search applies when the caller gives none (``min_relevance``), chosen by the same
# script: most questions of a user's own memory keep a hit, most asked of a stranger's get none.
DEFAULT_FLOOR = 0.26
