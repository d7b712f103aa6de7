"""Fitting ``relevance`` and its default floor, and measuring both, by leave-one-conversation-out.

    .venv/bin/python -m bench.fit_relevance --data ../shared/datasets/locomo-dev
    .venv/bin/python -m bench.fit_relevance --hits /tmp/relevance-hits.json   # refit, no service

Runs the real service in this process (as ``bench_locomo``: private redis-server, Qdrant Edge,
MiniLM), writes the conversations in every mode (turns, facts, notes) and asks each scored
question (categories 1-4) twice, with ``min_relevance=0`` and top_k 10: of its own
conversation's user, where some hit should be evidence, and of the next conversation's user in
the same mode, where nothing should match. Every hit's ranking signals are kept (``--save``),
labelled 1 when it is evidence for the question.

Also asks ``bench_quality``'s dev set (personal facts among 200 filler notes per user, questions
that paraphrase them) of its own users, and of a LoCoMo user in every mode (questions that name
nobody, where nothing should match either). Dev set users are not asked each other's questions:
they hold facts of the same kinds.

Then, for each conversation (or dev set user) held out, a logistic model is fitted on the others
(L2-regularized, Newton's method; the dev set ``DEVSET_SHARE`` of the weight) and the floor is
chosen on them: the highest that keeps a hit for at least ``--keep`` of their own-user questions
in every mode and in the dev set. The held-out estimates give the calibration (reliability table,
expected calibration error) and the floor's two rates: own-user questions that keep a hit,
other-user questions that get none. Last, the model and floor fitted on everything, to paste into
``services/application/relevance.py``. Prints tables, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from tqdm import tqdm

from bench.bench_core import service_in_process
from bench.bench_locomo import MODES, TOP_K, ingest, user_id
from bench.bench_quality import DEVSET, wait_for_index
from bench.bench_quality import load as load_devset
from bench.locomo import Conversation, load
from engram_ledger.contracts.queries import SearchNotes
from engram_ledger.services.application.relevance import FEATURES, RelevanceModel, Signals, features
from engram_ledger.services.application.search import Estimate, SearchService, _name, within
from engram_ledger.services.application.when import Period, asked_period
from engram_ledger.services.bus.client import EngramClient

L2 = 1.0
FILLER = 200  # bench_quality's default: notes per dev set user around its facts
BINS = 10
GROUPS = (*MODES, "devset")
# The dev set's share of the fit's weight (LoCoMo the rest): LoCoMo's questions are ten times as
# many, and its evidence is one turn among many alike; the dev set's paraphrases are what a
# personal memory is mostly asked. A quarter kept both calibrated (0.5 and 0.1 were measured too).
DEVSET_SHARE = 0.25
SIGNALS = ("similarity", "conversation", "text", "name", "within")
# The search's clock in this script: LoCoMo's questions name absolute dates.
NOW = datetime(2026, 11, 27, tzinfo=UTC)


def _signals(hit: Any, period: Period | None) -> dict[str, Any]:
    """What the search service estimates a hit's relevance from (``SearchService._estimate``)."""
    name = _name(hit)
    return {
        "within": period is not None and within(hit, period),
        "similarity": hit.similarity,
        "conversation": hit.found_in == "conversation",
        "text": f"{name}: {hit.content}" if name else hit.content,
        "name": name,
    }


async def collect(convs: list[Conversation]) -> list[dict[str, Any]]:
    """One record per question asked: mode, conversation, own or other, the hits' signals and labels."""
    records: list[dict[str, Any]] = []
    async with service_in_process() as (app, settings):
        assert app.index is not None
        redis = aioredis.Redis.from_url(settings.redis_url)
        try:
            service = capturing(SearchService(app.index, app.history, 30.0, clock=lambda: NOW))
            async with EngramClient(settings.redis_url, timeout=120) as client:
                for mode in MODES:
                    corpus, _ = await ingest(client, redis, mode, convs)
                    await client.search(corpus.users[convs[0].name], "warm up", after=corpus.token)
                    asked = sum(len(c.questions) for c in convs) * 2
                    with tqdm(total=asked, desc=f"{mode}: asked", unit="q", leave=False) as bar:
                        for i, conv in enumerate(convs):
                            stranger = convs[(i + 1) % len(convs)]
                            for q in conv.questions:
                                for kind, of in (("own", conv), ("other", stranger)):
                                    user = corpus.users[of.name]
                                    reply = await service.search(
                                        SearchNotes(
                                            user_id=user,
                                            query=q.text,
                                            top_k=TOP_K,
                                            include_conversation=mode == "turns",
                                            min_relevance=0.0,
                                        )
                                    )
                                    lookup = corpus.evidence[user]
                                    records.append(
                                        {
                                            "mode": mode,
                                            "conversation": conv.name,
                                            "kind": kind,
                                            "category": q.category,
                                            "query": q.text,
                                            "hits": [_signals(h, asked_period(q.text, NOW)) for h in reply.results],
                                            "best": service.best,  # type: ignore[attr-defined]
                                            "labels": [
                                                int(
                                                    kind == "own"
                                                    and bool(lookup.get(h.note_id, frozenset()) & q.evidence)
                                                )
                                                for h in reply.results
                                            ],
                                        }
                                    )
                                    bar.update()
                records += await ask_devset(client, service, convs)
        finally:
            await redis.aclose()
    return records


async def ask_devset(client: EngramClient, service: SearchService, convs: list[Conversation]) -> list[dict[str, Any]]:
    """The dev set of ``bench_quality`` (personal facts among filler notes, questions that
    paraphrase them), each question of its own user, and of a LoCoMo conversation's user in
    every mode, whose memory should match nothing. Not of another dev set user: they hold facts
    of the same kinds (a manager, an allergy, a city), which may well answer it."""
    devset = json.loads(DEVSET.read_text())
    ids, token = await load_devset(client, devset, FILLER)
    await wait_for_index(client, devset["users"][0]["user"], token)
    records = []
    asked = 0
    for user in devset["users"]:
        uid = user["user"]
        for q in user["queries"]:
            conv = convs[asked % len(convs)]
            asked += 1
            for mode in MODES:
                reply = await service.search(
                    SearchNotes(
                        user_id=user_id(mode, conv),
                        query=q["q"],
                        top_k=TOP_K,
                        include_conversation=mode == "turns",
                        min_relevance=0.0,
                    )
                )
                records.append(
                    {
                        "mode": mode,
                        "conversation": conv.name,
                        "kind": "other",
                        "category": 0,
                        "query": q["q"],
                        "hits": [_signals(h, asked_period(q["q"], NOW)) for h in reply.results],
                        "best": service.best,  # type: ignore[attr-defined]
                        "labels": [0] * len(reply.results),
                    }
                )
            reply = await service.search(SearchNotes(user_id=uid, query=q["q"], top_k=TOP_K, min_relevance=0.0))
            relevant = {ids[uid][k] for k in q["relevant"]}
            records.append(
                {
                    "mode": "devset",
                    "conversation": uid,
                    "kind": "own",
                    "category": 0,
                    "query": q["q"],
                    "hits": [_signals(h, asked_period(q["q"], NOW)) for h in reply.results],
                    "best": service.best,  # type: ignore[attr-defined]
                    "labels": [int(h.note_id in relevant) for h in reply.results],
                }
            )
    return records


def capturing(service: SearchService) -> SearchService:
    """The service, keeping the best cosine among the candidates of its last search (``best``),
    which a hit's relevance is estimated against and a reply does not carry."""
    estimate = service._estimate

    def keep(found: Estimate, hits: list[Any], ranked_before: int) -> list[Any]:
        service.best = found.best  # type: ignore[attr-defined]
        return estimate(found, hits, ranked_before)

    service._estimate = keep  # type: ignore[method-assign]
    return service


def rows_of(records: list[dict[str, Any]]) -> list[np.ndarray]:
    """Each record's feature rows, computed as the service computes them."""
    return [
        np.array(
            features(r["query"], [Signals(**{k: h[k] for k in SIGNALS}) for h in r["hits"]], r.get("best")), dtype=float
        ).reshape(-1, len(FEATURES))
        for r in records
    ]


def weights_of(records: list[dict[str, Any]], rows: list[np.ndarray]) -> np.ndarray:
    """Per hit: the dev set weighs ``DEVSET_SHARE`` of the whole, however many hits each has."""
    devset = [r["mode"] == "devset" for r, f in zip(records, rows, strict=True) for _ in range(len(f))]
    n, of_devset = len(devset), sum(devset)
    if of_devset in (0, n):
        return np.ones(n)
    return np.array([n * DEVSET_SHARE / of_devset if d else n * (1 - DEVSET_SHARE) / (n - of_devset) for d in devset])


def stacked(records: list[dict[str, Any]], rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.vstack([r for r in rows if len(r)])
    y = np.concatenate([np.array(r["labels"], dtype=float) for r, f in zip(records, rows, strict=True) if len(f)])
    return x, y, weights_of(records, rows)


def fit(x: np.ndarray, y: np.ndarray, weight: np.ndarray, l2: float = L2) -> RelevanceModel:
    """Weighted, L2-regularized logistic regression (the bias unpenalized) by Newton's method."""
    a = np.hstack([x, np.ones((len(x), 1))])
    w = np.zeros(a.shape[1])
    penalty = np.full(a.shape[1], l2)
    penalty[-1] = 0.0
    for _ in range(50):
        p = 1 / (1 + np.exp(-(a @ w)))
        gradient = a.T @ (weight * (p - y)) + penalty * w
        hessian = (a * (weight * p * (1 - p))[:, None]).T @ a + np.diag(penalty)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return RelevanceModel(weights=tuple(float(v) for v in w[:-1]), bias=float(w[-1]))


def kept(estimates: list[list[float]], floor: float) -> float:
    """The share of questions with some hit at or above the floor."""
    return sum(any(e >= floor for e in est) for est in estimates) / max(1, len(estimates))


def choose_floor(records: list[dict[str, Any]], estimates: list[list[float]], keep: float) -> float:
    """The highest floor (in steps of 0.01) keeping a hit for ``keep`` of the own-user questions
    of every mode and of the dev set."""
    floor = 0.0
    for step in range(1, 100):
        candidate = step / 100
        if all(
            kept(
                [e for r, e in zip(records, estimates, strict=True) if r["mode"] == m and r["kind"] == "own"], candidate
            )
            >= keep
            for m in GROUPS
        ):
            floor = candidate
    return floor


def reliability(pairs: list[tuple[float, int]]) -> tuple[list[dict[str, float]], float]:
    """Bins of equal width: count, mean estimate, share relevant; and the expected calibration error."""
    table = []
    error = 0.0
    for b in range(BINS):
        low, high = b / BINS, (b + 1) / BINS
        inside = [(p, y) for p, y in pairs if low <= p < high or (b == BINS - 1 and p == 1.0)]
        if not inside:
            continue
        mean_p = sum(p for p, _ in inside) / len(inside)
        share = sum(y for _, y in inside) / len(inside)
        table.append({"bin": f"{low:.1f}-{high:.1f}", "n": len(inside), "estimate": mean_p, "relevant": share})
        error += len(inside) / len(pairs) * abs(mean_p - share)
    return table, error


def loco(records: list[dict[str, Any]], rows: list[np.ndarray], keep: float) -> dict[str, Any]:
    names = sorted({r["conversation"] for r in records})
    held: list[list[float]] = [[] for _ in records]
    floors: dict[str, float] = {}
    for name in names:
        train = [i for i, r in enumerate(records) if r["conversation"] != name]
        model = fit(*stacked([records[i] for i in train], [rows[i] for i in train]))
        train_estimates = [model.estimate(rows[i].tolist()) for i in train]
        floors[name] = choose_floor([records[i] for i in train], train_estimates, keep)
        for i, r in enumerate(records):
            if r["conversation"] == name:
                held[i] = model.estimate(rows[i].tolist())
    pairs = [(p, y) for r, est in zip(records, held, strict=True) for p, y in zip(est, r["labels"], strict=True)]
    table, ece = reliability(pairs)
    per_mode: dict[str, Any] = {}
    for mode in GROUPS:
        mode_pairs = [
            (p, y)
            for r, est in zip(records, held, strict=True)
            if r["mode"] == mode
            for p, y in zip(est, r["labels"], strict=True)
        ]
        own = [(r, e) for r, e in zip(records, held, strict=True) if r["mode"] == mode and r["kind"] == "own"]
        other = [(r, e) for r, e in zip(records, held, strict=True) if r["mode"] == mode and r["kind"] == "other"]
        per_mode[mode] = {
            "ece": round(reliability(mode_pairs)[1], 4),
            "own_keep": round(sum(any(x >= floors[r["conversation"]] for x in e) for r, e in own) / len(own), 3),
            "other_none": round(
                sum(not any(x >= floors[r["conversation"]] for x in e) for r, e in other) / len(other), 3
            )
            if other
            else None,
            "own_questions": len(own),
        }
    return {"reliability": table, "ece": round(ece, 4), "floors": floors, "modes": per_mode}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, help="e.g. ../shared/datasets/locomo-dev")
    parser.add_argument("--hits", type=Path, help="hits saved by an earlier run (--save): refit only")
    parser.add_argument("--save", type=Path, help="keep the hits here")
    parser.add_argument("--keep", type=float, default=0.9, help="own-user questions that must keep a hit")
    args = parser.parse_args()
    if args.hits:
        records = json.loads(args.hits.read_text())
    else:
        if not args.data:
            parser.error("--data or --hits")
        records = asyncio.run(collect(load(args.data)))
        if args.save:
            args.save.write_text(json.dumps(records))
    rows = rows_of(records)
    held = loco(records, rows, args.keep)
    x, y, weight = stacked(records, rows)
    final = fit(x, y, weight)
    floor = choose_floor(records, [final.estimate(r.tolist()) for r in rows], args.keep)

    print(f"relevance by leave-one-conversation-out: {len(records)} questions asked, {len(y)} hits")
    print("  reliability (held-out estimates, every mode):")
    print(f"    {'estimate':<10}{'hits':>7}{'mean':>8}{'relevant':>10}")
    for row in held["reliability"]:
        print(f"    {row['bin']:<10}{row['n']:>7}{row['estimate']:>8.3f}{row['relevant']:>10.3f}")
    print(f"  expected calibration error: {held['ece']:.4f}")
    print(f"  floors chosen on the other four: {held['floors']}")
    print(f"    {'mode':<8}{'ECE':>8}{'own keep':>10}{'other none':>12}")
    for mode, row in held["modes"].items():
        other = "-" if row["other_none"] is None else f"{row['other_none']:.3f}"
        print(f"    {mode:<8}{row['ece']:>8.4f}{row['own_keep']:>10.3f}{other:>12}")
    weights = ", ".join(f"{w:.4f}" for w in final.weights)
    print("\nfitted on every conversation and dev set user (services/application/relevance.py):")
    print(f"MODEL = RelevanceModel(weights=({weights}), bias={final.bias:.4f})")
    print(f"DEFAULT_FLOOR = {floor:.2f}")
    print(
        json.dumps(
            {
                "loco": held,
                "model": {"features": FEATURES, "weights": final.weights, "bias": final.bias},
                "floor": floor,
                "log_loss": round(
                    float(
                        -np.mean(
                            [
                                math.log(p if t else 1 - p)
                                for p, t in zip(final.estimate(x.tolist()), y, strict=True)
                                if 0 < p < 1
                            ]
                        )
                    ),
                    4,
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
