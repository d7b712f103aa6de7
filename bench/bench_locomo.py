"""Retrieval on LoCoMo through the running service: recall and MRR per question category, search
latency and ingest rate beside MiniLM's own floors.

    .venv/bin/python -m bench.bench_locomo --data ../shared/datasets/locomo-dev --mode all
    .venv/bin/python -m bench.bench_locomo --data ../shared/datasets/locomo-dev --mode turns --limit-conversations 1

Runs the real service in this process (private redis-server, Qdrant Edge in a temporary data
dir, MiniLM). Each conversation is one user, a distinct one per mode:

- ``turns``: every session imported as a transcript (``record_messages``, one session id per
  LoCoMo session, each turn with its speaker and the session's time); questions search all of
  the user's conversations (``include_conversation``, no session); a hit is an evidence turn;
- ``facts``: the data set's observations saved as notes (``save_many``, subject the speaker,
  ``occurred_at`` the session's time); a hit is a fact citing an evidence turn;
- ``notes``: every turn saved as a plain note (no conversation context); a hit is an evidence
  turn.

Every question is asked (top_k 10, the relevance floor off) with the ranking as configured (``ENGRAM_SEARCH_FUSION``,
``ENGRAM_SEARCH_WEIGHTS``), through the bus, and again in this process through extra
``SearchService`` instances over the same index: cosine alone, BM25 alone, and the ranking of
Engram before LoCoMo (``score(1, 0.1)``). R@k: some evidence is among the first k results;
MRR@10: the mean of 1/rank of the first one (0 when none is in the top 10).

Latency: the bus searches, sequential, each followed by the bare MiniLM encode of the same
query in this process; a search whose query text the service has embedded before in this run
(the same question in an earlier mode) hits its embedding cache and is reported apart. Ingest:
documents per second from the first send until the index checkpoint passes the last write,
beside MiniLM's batched encode rate (batch 64) on the same texts (up to 1,024 of them, best of
two passes), measured while the service is idle; for turns also on the texts the index embeds
(each turn with its speaker's name, alone and after the turns before it). Another busy process
on the machine lowers the floors: read the ratios with the machine otherwise idle.

Prints tables, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from tqdm import tqdm

from bench.bench_core import pct, service_in_process, summary
from bench.bench_search import encode_floor, index_position
from bench.locomo import Conversation, load
from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import MessageDraft, NoteDraft
from engram_ledger.contracts.queries import NotesWritten, SearchNotes, SearchReply
from engram_ledger.projections.index import indexed_text
from engram_ledger.services.adapters.embedder import load_model, model_path
from engram_ledger.services.application.ranking import RankingPolicy
from engram_ledger.services.application.search import SearchService
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.config import Settings

MODES = ("turns", "facts", "notes")
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
ADVERSARIAL = 5  # reported apart, never in "all" (the data set's README)
TOP_K = 10
BATCH = 100  # the most one record_messages or save_many takes
# Compared in this process over the service's own index, beside the configured ranking.
# Plain signals: no name boost, and a turn's context point counts as much as its own words.
PLAIN = {
    "name_boost": 0.0,
    "context_weight": 1.0,
    "dense_span": 0.0,
    "keyword_floor": 0.0,
    "session_boost": 0.0,
    "time_boost": 0.0,
}
COSINE = RankingPolicy("minmax", 1.0, 0.0, **PLAIN)  # type: ignore[arg-type]
# BM25 alone: ``score`` keeps BM25's order (s / (s + 6)) and gives 0 exactly to candidates with
# no BM25 score, which are dropped; ``minmax`` would also give 0 to the weakest BM25 candidate.
BM25 = RankingPolicy("score", 0.0, 1.0, **PLAIN)  # type: ignore[arg-type]
OLD_ENGRAM = RankingPolicy("score", 1.0, 0.1, **PLAIN)  # type: ignore[arg-type]

Search = Callable[[str, str], Awaitable[SearchReply]]


@dataclass(frozen=True)
class Document:
    """One thing written for a conversation's user, and the evidence turns it stands for."""

    draft: MessageDraft | NoteDraft
    evidence: frozenset[str]
    session: str | None = None  # turns: the session it was said in (record_messages)

    @property
    def text(self) -> str:
        return self.draft.content


@dataclass
class Corpus:
    """One mode as written: per conversation its user, per user record id -> evidence turns."""

    mode: str
    users: dict[str, str]
    evidence: dict[str, dict[str, frozenset[str]]]
    token: str


@dataclass(frozen=True)
class Outcome:
    category: int
    rank: int | None  # of the first result that is evidence, within the top 10


def user_id(mode: str, conv: Conversation) -> str:
    return f"locomo-{mode}-{conv.name}"


def documents(mode: str, conv: Conversation) -> list[Document]:
    if mode == "turns":
        return [
            Document(
                MessageDraft(role="user", content=t.text, speaker=t.speaker, sent_at=t.sent_at),
                frozenset({t.dia_id}),
                session=f"session-{t.session}",
            )
            for t in conv.turns
        ]
    if mode == "facts":
        return [
            Document(
                NoteDraft(content=f.text, category="observation", subject=f.speaker, occurred_at=f.occurred_at),
                f.evidence,
            )
            for f in conv.facts
        ]
    if mode == "notes":
        return [Document(NoteDraft(content=t.text, subject=t.speaker), frozenset({t.dia_id})) for t in conv.turns]
    raise ValueError(mode)


def indexed_texts(conv: Conversation) -> list[str]:
    """What the index embeds for a conversation's turns: each turn's words after its speaker's
    name (the context point's vector is a mean of these, nothing more is encoded)."""
    return [indexed_text(t.speaker, t.text) for t in conv.turns]


def batches(docs: list[Document]) -> Iterator[list[Document]]:
    """In order, at most BATCH each; a transcript batch never spans two sessions."""
    for _, group in groupby(docs, key=lambda d: d.session):
        items = list(group)
        for start in range(0, len(items), BATCH):
            yield items[start : start + BATCH]


async def send(client: EngramClient, user: str, batch: list[Document]) -> NotesWritten:
    session = batch[0].session
    if session is not None:
        return await client.record_messages(user, session, [d.draft for d in batch])  # type: ignore[misc]
    return await client.save_many(user, [d.draft for d in batch])  # type: ignore[misc]


async def ingest(
    client: EngramClient, redis: aioredis.Redis, mode: str, convs: list[Conversation]
) -> tuple[Corpus, dict[str, Any]]:
    """Write every conversation of one mode; counted until the index checkpoint (partition 0,
    the only one) passes the last write."""
    work = [(user_id(mode, c), batch) for c in convs for batch in batches(documents(mode, c))]
    total = sum(len(batch) for _, batch in work)
    corpus = Corpus(mode, {c.name: user_id(mode, c) for c in convs}, {user_id(mode, c): {} for c in convs}, "")
    written: list[tuple[tuple[int, int], int]] = []  # (log position of a batch, documents in it)
    duplicates = 0

    async def sender() -> None:
        nonlocal duplicates
        for user, batch in work:
            reply = await send(client, user, batch)
            for doc, note in zip(batch, reply.notes, strict=True):
                # A note whose text was already saved comes back as that note: it stands for both.
                known = corpus.evidence[user].get(note.note_id, frozenset())
                corpus.evidence[user][note.note_id] = known | doc.evidence
                duplicates += note.duplicate
            partition, position = channels.parse_token(reply.token)
            assert partition == 0, "one partition (Settings' default) is assumed"
            written.append((position, len(batch)))
            corpus.token = reply.token

    started = time.perf_counter()
    sending = asyncio.create_task(sender())
    with tqdm(total=total, desc=f"{mode}: indexed", unit="doc", leave=False) as bar:
        while True:
            await asyncio.sleep(0.05)
            position = await index_position(redis)
            indexed = sum(n for at, n in written if at <= position)
            bar.update(indexed - bar.n)
            if sending.done() and (sending.exception() is not None or indexed == total):
                break
    await sending
    elapsed = time.perf_counter() - started
    return corpus, {
        "documents": total,
        "duplicates": duplicates,
        "seconds": round(elapsed, 2),
        "docs_per_s": round(total / elapsed, 1),
    }


async def ask(
    search: Search,
    corpus: Corpus,
    convs: list[Conversation],
    *,
    keyword_only: bool = False,
    desc: str = "",
) -> tuple[list[Outcome], int]:
    """Every question of every conversation; returns the outcomes and how many results named a
    record the corpus does not know (there should be none)."""
    outcomes: list[Outcome] = []
    unmapped = 0
    with tqdm(total=sum(len(c.questions) + len(c.adversarial) for c in convs), desc=desc, unit="q", leave=False) as bar:
        for conv in convs:
            user = corpus.users[conv.name]
            lookup = corpus.evidence[user]
            for q in [*conv.questions, *conv.adversarial]:
                reply = await search(user, q.text)
                # BM25 alone: a candidate only the dense side found scores 0; it is no BM25 hit.
                hits = [h for h in reply.results if not keyword_only or h.score > 0][:TOP_K]
                unmapped += sum(h.note_id not in lookup for h in hits)
                rank = next(
                    (i for i, h in enumerate(hits, start=1) if lookup.get(h.note_id, frozenset()) & q.evidence), None
                )
                outcomes.append(Outcome(q.category, rank))
                bar.update()
    return outcomes, unmapped


def figures(outcomes: list[Outcome]) -> dict[str, float]:
    n = len(outcomes)
    if not n:
        return {"n": 0}
    ranks = [o.rank for o in outcomes]
    return {
        "n": n,
        "r@1": round(sum(r is not None and r <= 1 for r in ranks) / n, 3),
        "r@5": round(sum(r is not None and r <= 5 for r in ranks) / n, 3),
        "r@10": round(sum(r is not None for r in ranks) / n, 3),
        "mrr@10": round(sum(1 / r for r in ranks if r is not None) / n, 3),
    }


def scored(outcomes: list[Outcome]) -> dict[str, dict[str, float]]:
    table = {"all": figures([o for o in outcomes if o.category in CATEGORIES])}
    for category in [*CATEGORIES, ADVERSARIAL]:
        table[str(category)] = figures([o for o in outcomes if o.category == category])
    return table


def print_table(title: str, table: dict[str, dict[str, float]]) -> None:
    print(f"  {title}")
    print(f"    {'':<14}{'n':>5}{'R@1':>8}{'R@5':>8}{'R@10':>8}{'MRR@10':>8}")
    for key, row in table.items():
        label = "all" if key == "all" else f"{key} {CATEGORIES.get(int(key), 'adversarial*')}"
        if not row["n"]:
            print(f"    {label:<14}{0:>5}")
            continue
        print(
            f"    {label:<14}{row['n']:>5}{row['r@1']:>8.3f}{row['r@5']:>8.3f}{row['r@10']:>8.3f}{row['mrr@10']:>8.3f}"
        )


def floor_rate(model: Any, texts: list[str], sample: int = 1024, passes: int = 2) -> float:
    """MiniLM's batched encode rate on up to ``sample`` of the texts spread over all of them;
    the best of ``passes`` (a floor: another process on the machine only slows a pass down)."""
    step = max(1, len(texts) // sample)
    return max(encode_floor(model, texts[::step][:sample]) for _ in range(passes))


class Timed:
    """The bus searches, each followed by the bare encode of its query in this process."""

    def __init__(self, client: EngramClient, model: Any, include_conversation: bool, embedded: set[str]) -> None:
        self.client = client
        self.model = model
        self.include_conversation = include_conversation
        # Query texts the service has embedded in this run: asked again, they hit its cache.
        self.embedded = embedded
        self.cold: list[float] = []
        self.cached: list[float] = []
        self.encode: list[float] = []

    async def __call__(self, user: str, query: str) -> SearchReply:
        started = time.perf_counter()
        reply = await self.client.search(
            user, query, top_k=TOP_K, include_conversation=self.include_conversation, min_relevance=0.0
        )
        took = (time.perf_counter() - started) * 1000
        if query in self.embedded:
            self.cached.append(took)
            return reply
        self.embedded.add(query)
        self.cold.append(took)
        started = time.perf_counter()
        self.model.encode([query], normalize_embeddings=True)
        self.encode.append((time.perf_counter() - started) * 1000)
        return reply


def in_process(service: SearchService, include_conversation: bool) -> Search:
    async def search(user: str, query: str) -> SearchReply:
        return await service.search(
            SearchNotes(
                user_id=user, query=query, top_k=TOP_K, include_conversation=include_conversation, min_relevance=0.0
            )
        )

    return search


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True, help="e.g. ../shared/datasets/locomo-dev")
    parser.add_argument("--mode", choices=[*MODES, "all"], default="all")
    parser.add_argument("--limit-conversations", type=int, default=None, metavar="N", help="only the first N")
    args = parser.parse_args()
    convs = load(args.data)[: args.limit_conversations]
    if not convs:
        parser.error(f"no conversations in {args.data}")
    modes = list(MODES) if args.mode == "all" else [args.mode]
    model = load_model(model_path())
    env = Settings.from_env()  # ENGRAM_ENCODER, ENGRAM_MODEL_CACHE and the search policy
    policy = env.search_policy
    results: dict[str, Any] = {
        "encoder": env.encoder,
        "conversations": [c.name for c in convs],
        "questions": sum(len(c.questions) for c in convs),
        "policy": str(policy),
        "modes": {},
    }
    embedded: set[str] = set()
    floors: dict[tuple[str, ...], float] = {}
    timings: dict[str, Timed] = {}
    async with service_in_process(search_policy=policy, encoder=env.encoder, model_cache=env.model_cache) as (
        app,
        settings,
    ):
        redis = aioredis.Redis.from_url(settings.redis_url)
        try:
            assert app.index is not None
            await app.index.embedder.start()
            rankings = {"cosine": COSINE, "bm25": BM25, "old engram": OLD_ENGRAM}
            async with EngramClient(settings.redis_url, timeout=120) as client:
                for mode in modes:
                    conversational = mode == "turns"
                    texts = tuple(d.text for c in convs for d in documents(mode, c))
                    if texts not in floors:
                        # Measured while the service is idle, so neither slows the other (in a
                        # thread: the service's loop keeps answering its own heartbeats).
                        floors[texts] = await asyncio.to_thread(floor_rate, model, list(texts))
                    corpus, ingested = await ingest(client, redis, mode, convs)
                    ingested["encode_floor_docs_per_s"] = round(floors[texts], 1)
                    ingested["ratio_to_floor"] = round(ingested["docs_per_s"] / floors[texts], 2)
                    if conversational:
                        # The index embeds each turn with its speaker's name: the floor on those.
                        embedded_texts = [t for c in convs for t in indexed_texts(c)]
                        rate = await asyncio.to_thread(floor_rate, model, embedded_texts)
                        ingested["encode_floor_as_indexed_docs_per_s"] = round(rate, 1)
                    await client.search(corpus.users[convs[0].name], "warm up", after=corpus.token)
                    timed = timings[mode] = Timed(client, model, conversational, embedded)
                    outcomes, unmapped = await ask(timed, corpus, convs, desc=f"{mode}: engram")
                    tables = {f"engram {policy} (bus)": scored(outcomes)}
                    unmapped_hits = {"engram": unmapped}
                    for name, other in rankings.items():
                        service = SearchService(app.index, app.history, settings.read_wait_seconds, other)
                        outcomes, unmapped = await ask(
                            in_process(service, conversational),
                            corpus,
                            convs,
                            keyword_only=other is BM25,
                            desc=f"{mode}: {name}",
                        )
                        tables[f"{name} {other}"] = scored(outcomes)
                        unmapped_hits[name] = unmapped
                    results["modes"][mode] = {"ingest": ingested, "rankings": tables, "unmapped_hits": unmapped_hits}
        finally:
            await redis.aclose()

    cold = [t for timed in timings.values() for t in timed.cold]
    encode = [t for timed in timings.values() for t in timed.encode]
    results["search"] = {
        "cold": {mode: summary(t.cold) for mode, t in timings.items() if t.cold},
        "cached": {mode: summary(t.cached) for mode, t in timings.items() if t.cached},
        "encode": summary(encode) if encode else None,
        "cold_p50_over_encode": round(pct(cold, 0.5) / pct(encode, 0.5), 2) if cold else None,
    }

    print(f"LoCoMo: {len(convs)} conversations, {results['questions']} questions; Engram ranking {policy}")
    for mode, found in results["modes"].items():
        print(f"\n{mode}")
        for name, table in found["rankings"].items():
            print_table(name, table)
        if any(found["unmapped_hits"].values()):
            print(f"  results naming no written record: {found['unmapped_hits']}")
    print("\nsearch latency (bus, sequential, top_k 10):")
    for mode, timed in timings.items():
        if timed.cold:
            print(f"  {mode:<6} new query text  {summary(timed.cold)}")
        if timed.cached:
            print(f"  {mode:<6} asked before    {summary(timed.cached)} (query embedding cached)")
    if cold:
        print(
            f"  bare MiniLM encode of the same queries: {results['search']['encode']}; "
            f"search p50 {results['search']['cold_p50_over_encode']}x the encode"
        )
    print("\ningest (first send until the index checkpoint passes the last write):")
    for mode, found in results["modes"].items():
        ing = found["ingest"]
        print(
            f"  {mode:<6} {ing['documents']} docs in {ing['seconds']} s = {ing['docs_per_s']} docs/s; "
            f"MiniLM batched encode of the same texts {ing['encode_floor_docs_per_s']} texts/s "
            f"(ratio {ing['ratio_to_floor']:.2f})" + (f"; {ing['duplicates']} duplicates" if ing["duplicates"] else "")
        )
        if "encode_floor_as_indexed_docs_per_s" in ing:
            print(
                f"         as the index embeds them (with the speaker's name) "
                f"{ing['encode_floor_as_indexed_docs_per_s']} turns/s "
                f"(ratio {ing['docs_per_s'] / ing['encode_floor_as_indexed_docs_per_s']:.2f})"
            )
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
