"""Retrieval quality on the dev set (bench/data/devset.json): recall@5 and MRR@10 of the dense
ranking, the BM25 ranking and the fused one the service answers with.

    .venv/bin/python -m bench.bench_quality [--filler 200]

Runs the real service in this process (private redis-server, Qdrant Edge in a temporary data
dir, MiniLM), saves the dev set through the bus (updates as supersedes), buries each user's
facts among ``--filler`` synthetic notes, then asks every question through ``SearchService``
with three rankings (services/application/ranking.py): dense only ``minmax(1, 0)``, BM25 only
``score(0, 1)`` (BM25's own order) and the configured policy; ``--also METHOD:W_DENSE,W_BM25`` (e.g.
``score:1.0,0.1``, Engram's ranking before LoCoMo) adds more.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.bench_core import service_in_process
from bench.corpus import notes as filler_notes
from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.queries import SearchNotes
from engram_ledger.services.application.ranking import FUSION_METHODS, RankingPolicy
from engram_ledger.services.application.search import SearchService
from engram_ledger.services.bootstrap import Engram
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.config import Settings

DEVSET = Path(__file__).parent / "data" / "devset.json"


async def load(client: EngramClient, devset: dict[str, Any], filler: int) -> tuple[dict[str, dict[str, str]], str]:
    """Save every user's notes; returns key -> note id per user and the last token."""
    ids: dict[str, dict[str, str]] = {}
    token = ""
    for n, user in enumerate(devset["users"]):
        uid = user["user"]
        ids[uid] = {}
        for start in range(0, filler, 100):
            drafts = [NoteDraft(content=t) for t in filler_notes(1000 + n * 100_000 + start, min(100, filler - start))]
            token = (await client.save_many(uid, drafts)).token
        for note in user["notes"]:
            written = await client.save(uid, note["content"], category=note["category"], advise=False)
            ids[uid][note["key"]] = written.note_id
            token = written.token
            if "supersedes" in note:
                token = (await client.supersede(uid, ids[uid][note["supersedes"]], written.note_id)).token
    return ids, token


async def wait_for_index(client: EngramClient, user_id: str, token: str) -> None:
    """Until the index has embedded everything saved (a search waits only a few seconds)."""
    while True:
        try:
            await client.search(user_id, "warm up", after=token)
            return
        except EngramError as e:
            if e.code is not ErrorCode.TIMEOUT:
                raise


def parse_policy(text: str) -> RankingPolicy:
    """``METHOD:W_DENSE,W_BM25``, e.g. ``score:1.0,0.1``."""
    method, _, weights = text.partition(":")
    if method not in FUSION_METHODS or not weights:
        raise argparse.ArgumentTypeError(f"{text!r}: expected METHOD:W_DENSE,W_BM25, METHOD one of {FUSION_METHODS}")
    dense, bm25 = (float(x) for x in weights.split(","))
    return RankingPolicy(method, dense, bm25)  # type: ignore[arg-type]


async def evaluate(search: SearchService, devset: dict[str, Any], ids: dict[str, dict[str, str]], keyword_only: bool):
    recall5, rr10 = [], []
    misses = []
    for user in devset["users"]:
        uid = user["user"]
        key_of = {v: k for k, v in ids[uid].items()}
        for q in user["queries"]:
            reply = await search.search(SearchNotes(user_id=uid, query=q["q"], top_k=10, min_relevance=0.0))
            # With weights (0, 1) notes found only by the dense side score 0: they are not BM25 hits.
            hits = [h for h in reply.results if not keyword_only or h.score > 0]
            ranked = [key_of.get(h.note_id, "filler") for h in hits]
            relevant = set(q["relevant"])
            recall5.append(len(relevant & set(ranked[:5])) / len(relevant))
            rank = next((i + 1 for i, k in enumerate(ranked[:10]) if k in relevant), None)
            rr10.append(1 / rank if rank else 0.0)
            if rank != 1:
                misses.append({"q": q["q"], "want": sorted(relevant), "got": ranked[:3]})
    return {
        "recall@5": round(sum(recall5) / len(recall5), 3),
        "mrr@10": round(sum(rr10) / len(rr10), 3),
        "queries": len(rr10),
    }, misses


@contextlib.asynccontextmanager
async def devset_service(
    devset: dict[str, Any], filler: int
) -> AsyncIterator[tuple[Engram, Settings, dict[str, dict[str, str]]]]:
    """The real service in this process (a private redis-server, Qdrant Edge and MiniLM in a
    temporary data dir) with the dev set saved among ``filler`` notes per user and indexed;
    yields it, its settings and the dev set's note ids."""
    # ENGRAM_ENCODER (onnx, onnx-int8, torch) and ENGRAM_MODEL_CACHE are taken from the environment.
    env = Settings.from_env()
    async with service_in_process(encoder=env.encoder, model_cache=env.model_cache) as (app, settings):
        async with EngramClient(settings.redis_url, timeout=120) as client:
            ids, token = await load(client, devset, filler)
            await wait_for_index(client, devset["users"][0]["user"], token)
        yield app, settings, ids


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--filler", type=int, default=200, help="synthetic notes per user around the facts")
    parser.add_argument("--show-misses", action="store_true")
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        type=parse_policy,
        metavar="METHOD:W_DENSE,W_BM25",
        help="more rankings to try, e.g. score:1.0,0.1",
    )
    args = parser.parse_args()
    devset = json.loads(DEVSET.read_text())
    async with devset_service(devset, args.filler) as (app, settings, ids):
        assert app.index is not None
        results = {}
        extra = [(str(policy), policy) for policy in args.also]
        plain = [
            ("dense", RankingPolicy("minmax", 1.0, 0.0)),
            # BM25's own order; 0 exactly for notes with no BM25 score (minmax would also give
            # 0 to the weakest BM25 candidate, and evaluate drops score-0 hits).
            ("bm25", RankingPolicy("score", 0.0, 1.0)),
            ("fused", settings.search_policy),
        ]
        for name, policy in plain + extra:
            search = SearchService(app.index, app.history, 30, policy)
            results[name], misses = await evaluate(search, devset, ids, keyword_only=name == "bm25")
            if args.show_misses:
                for miss in misses:
                    print(f"  {name} miss: {miss}")
    print(f"dev set: {results['fused']['queries']} questions, {args.filler} filler notes per user")
    for name, figures in results.items():
        print(f"{name:>14}: recall@5 {figures['recall@5']:.3f}  MRR@10 {figures['mrr@10']:.3f}")
    print(
        json.dumps(
            {
                "filler_per_user": args.filler,
                "encoder": settings.encoder,
                "fused_policy": str(settings.search_policy),
                **results,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
