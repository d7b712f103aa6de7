"""The relevance floor of forget by query: which hits are candidates.

    .venv/bin/python -m bench.bench_forget_floor [--filler 200] [--top-k 5] [--dump hits.json]

Runs the real service in this process (private redis-server, Qdrant Edge in a temporary data
dir, MiniLM), saves the dev set (bench/data/devset.json, with ``--filler`` synthetic notes per
user around the facts, as bench/bench_quality.py does), then asks every dev question as a
forget query would: a search of the user's notes with forget's ``top_k``. Each hit is a true
match (a note the question is about) or another hit.

It prints, for a range of floors on the hit's ``similarity`` (the cosine), on its fused
``score`` and on its ``relevance`` (the search's floor is on it; the dev set is part of what the
relevance model was fitted on, so its figures here flatter it a little), the share of true
matches kept and of other hits dropped, and each signal's AUC (the chance that a true match
outranks another hit); then the same with a margin under each query's best cosine; then the
rule forget applies (services/application/forget.py ``close_enough``).
The dev questions paraphrase their facts on purpose (few shared words), so their true matches
are weaker than a forget request naming its memory would be: a floor that keeps them all is a
conservative one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.bench_quality import DEVSET, devset_service
from engram_ledger.contracts.limits import SEARCH_TOP_K_DEFAULT
from engram_ledger.contracts.queries import SearchNotes
from engram_ledger.services.application.forget import FORGET_SIMILARITY_FLOOR, FORGET_SIMILARITY_MARGIN, close_enough
from engram_ledger.services.application.relevance import DEFAULT_FLOOR
from engram_ledger.services.application.search import SearchService

Hit = tuple[float, float, bool, float]  # similarity, score, true match, relevance


async def collect(
    search: SearchService, devset: dict[str, Any], ids: dict[str, dict[str, str]], top_k: int
) -> list[list[Hit]]:
    """The hits of every question on its own user's notes, one list per question, best first."""
    queries: list[list[Hit]] = []
    for user in devset["users"]:
        uid = user["user"]
        key_of = {v: k for k, v in ids[uid].items()}
        for q in user["queries"]:
            # Forget's search: its own rule decides, not the search's relevance floor.
            reply = await search.search(SearchNotes(user_id=uid, query=q["q"], top_k=top_k, min_relevance=0.0))
            relevant = set(q["relevant"])
            queries.append(
                [(h.similarity, h.score, key_of.get(h.note_id) in relevant, h.relevance) for h in reply.results]
            )
    return queries


def auc(matches: list[float], others: list[float]) -> float:
    """P(a true match's value > a non-match's), ties counted half."""
    wins = sum((m > o) + 0.5 * (m == o) for m in matches for o in others)
    return wins / (len(matches) * len(others))


def kept_and_dropped(queries: list[list[Hit]], keep: Callable[[list[Hit]], list[bool]]) -> tuple[float, float]:
    """The share of true matches a rule keeps and of other hits it drops."""
    kept = dropped = matches = others = 0
    for hits in queries:
        for hit, passes in zip(hits, keep(hits), strict=True):
            if hit[2]:
                matches += 1
                kept += passes
            else:
                others += 1
                dropped += not passes
    return kept / matches, dropped / others


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"min": at(0), "p05": at(0.05), "p50": at(0.5), "p95": at(0.95), "max": at(1.0)}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--filler", type=int, default=200, help="synthetic notes per user around the facts")
    parser.add_argument("--top-k", type=int, default=SEARCH_TOP_K_DEFAULT, help="candidates per query (forget's)")
    parser.add_argument("--dump", type=Path, help="write every hit (similarity, score, true match) here as JSON")
    args = parser.parse_args()
    devset = json.loads(DEVSET.read_text())
    async with devset_service(devset, args.filler) as (app, settings, ids):
        assert app.index is not None
        search = SearchService(app.index, app.history, 30, settings.search_policy)
        queries = await collect(search, devset, ids, args.top_k)
    if args.dump:
        args.dump.write_text(json.dumps(queries))
    hits = [h for q in queries for h in q]
    matches, others = [h for h in hits if h[2]], [h for h in hits if not h[2]]
    print(
        f"dev set: {len(queries)} questions, top_k {args.top_k}, {args.filler} filler notes per user: "
        f"{len(matches)} true-match hits, {len(others)} other hits"
    )
    report: dict[str, Any] = {"filler_per_user": args.filler, "top_k": args.top_k}
    for name, column, floors in (
        ("similarity", 0, [round(0.05 * i, 2) for i in range(1, 10)]),
        ("score", 1, [round(0.1 * i, 1) for i in range(1, 10)]),
        ("relevance", 3, sorted({0.05, 0.1, 0.15, DEFAULT_FLOOR, 0.2, 0.25, 0.3})),
    ):
        area = auc([h[column] for h in matches], [h[column] for h in others])
        spread = {"true": quantiles([h[column] for h in matches]), "other": quantiles([h[column] for h in others])}
        rows: list[dict[str, float]] = []
        print(f"\n{name}: AUC {area:.3f}; true matches {spread['true']}; others {spread['other']}")
        print(f"  {'floor':>6} {'true kept':>10} {'others dropped':>15}")
        for floor in floors:

            def at_floor(q: list[Hit], c: int = column, f: float = floor) -> list[bool]:
                return [h[c] >= f for h in q]

            kept, dropped = kept_and_dropped(queries, at_floor)
            rows.append({"floor": floor, "true_kept": round(kept, 3), "others_dropped": round(dropped, 3)})
            print(f"  {floor:>6.2f} {kept:>10.1%} {dropped:>15.1%}")
        report[name] = {"auc": round(area, 3), "quantiles": spread, "floors": rows}
    gaps = [max(h[0] for h in q) - h[0] for q in queries for h in q if h[2]]
    print(f"\nsimilarity >= {FORGET_SIMILARITY_FLOOR} and within a margin of the query's best cosine")
    print(f"  (a true match is at most {max(gaps):.3f} below its query's best)")
    print(f"  {'margin':>6} {'true kept':>10} {'others dropped':>15}")
    rows = []
    for margin in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3):

        def rule(q: list[Hit], m: float = margin) -> list[bool]:
            best = max(h[0] for h in q)
            return [h[0] >= FORGET_SIMILARITY_FLOOR and h[0] >= best - m for h in q]

        kept, dropped = kept_and_dropped(queries, rule)
        rows.append({"margin": margin, "true_kept": round(kept, 3), "others_dropped": round(dropped, 3)})
        print(f"  {margin:>6.2f} {kept:>10.1%} {dropped:>15.1%}")
    kept, dropped = kept_and_dropped(queries, lambda q: close_enough([h[0] for h in q]))
    report["margins"] = rows
    report["forget"] = {
        "floor": FORGET_SIMILARITY_FLOOR,
        "margin": FORGET_SIMILARITY_MARGIN,
        "true_kept": round(kept, 3),
        "others_dropped": round(dropped, 3),
        "largest_true_gap": round(max(gaps), 3),
    }
    print(
        f"\nforget (floor {FORGET_SIMILARITY_FLOOR}, margin {FORGET_SIMILARITY_MARGIN}): "
        f"true matches kept {kept:.1%}, other hits dropped {dropped:.1%}"
    )
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
