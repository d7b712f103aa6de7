"""Where a search's time goes: one search, stage by stage, beside the bare encode of its query.

    .venv/bin/python -m bench.bench_search_profile --data ../shared/datasets/locomo-dev

LoCoMo's conversations imported as conversations (``bench_locomo``'s ``turns``: one user each,
every session a transcript, the speaker and the session's time on each turn) into the real
service, run in this process on a private redis-server. Then a client in a process of its own
(this script with ``--client``) asks every question (categories 1-5), one after another, through
the bus: ``include_conversation`` on, top_k 10, the relevance floor as shipped, each query text
new to the service (its embedding cache never answers). The service records each search's
stages (``services/common/stages.py``); the client records the whole round trip, its own decode
of the reply and the CLI's rendering of it, and after the searches the bare ONNX encode of every
query (one at a time, as a search encodes it) with the same encoder in its own process.

Prints a table of each stage's p50 and p99 (ms), the search's p50 and p99 beside the bare
encode's, and their ratio; then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.bench_core import pct, service_in_process
from bench.bench_locomo import ingest
from bench.locomo import load
from engram_ledger.services.common import stages
from tests.support import ROOT

TOP_K = 10
WARM_UP = 40
# In the order a search meets them.
STAGES = [
    "request decode",
    "wait for the token",
    "query parsing and time phrases",
    "encode",
    "dense query",
    "sparse query",
    "fusion and levers",
    "reading hits from the read model",
    "unsealing them",
    "relevance features",
    "reply encode",
]


def ms(values: list[float], q: float) -> float:
    return round(pct(values, q) * 1000, 3) if values else 0.0


async def serve_and_ask(data: Path, limit: int | None) -> dict[str, Any]:
    convs = load(data)[:limit]
    records: list[dict[str, float]] = []
    async with service_in_process() as (app, settings):
        assert app.index is not None
        await app.index.embedder.start()
        redis = aioredis.Redis.from_url(settings.redis_url)
        try:
            from engram_ledger.services.bus.client import EngramClient

            async with EngramClient(settings.redis_url, timeout=120) as client:
                corpus, ingested = await ingest(client, redis, "turns", convs)
        finally:
            await redis.aclose()
        questions = [(corpus.users[c.name], q.text) for c in convs for q in [*c.questions, *c.adversarial]]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(questions, f)
        stages.collect(records.append)
        try:
            asking = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.bench_search_profile",
                "--client",
                settings.redis_url,
                f.name,
                cwd=ROOT,
                stdout=subprocess.PIPE,
            )
            out, _ = await asking.communicate()
        finally:
            stages.collect(None)
        client_side = json.loads(out.decode().splitlines()[-1])
    measured = records[-len(questions) :]  # after the client's warm-up searches
    return {"ingest": ingested, "questions": len(questions), "stages": measured, "client": client_side}


async def ask(url: str, questions: list[tuple[str, str]]) -> dict[str, Any]:
    """The client's side: every question through the bus, then the bare encode of each."""
    import msgspec

    from engram_ledger.contracts import channels
    from engram_ledger.contracts.queries import AnyReply, SearchNotes
    from engram_ledger.services.adapters.minilm import load_encoder
    from engram_ledger.services.bus.client import EngramClient
    from engram_ledger.services.cli import render
    from engram_ledger.services.config import Settings

    decoder = msgspec.json.Decoder(AnyReply)
    total, decode, rendering = [], [], []
    async with EngramClient(url, timeout=60) as client:
        for i in range(WARM_UP):
            await client.search(questions[i % len(questions)][0], f"warming up, question {i}", top_k=TOP_K)
        for user, text in questions:
            body = msgspec.json.encode(SearchNotes(user_id=user, query=text, top_k=TOP_K, include_conversation=True))
            stream = channels.query_stream(channels.partition_of(user, client.partitions))
            started = time.perf_counter()
            raw = await client.request_raw(stream, body, user=user)
            decoded = time.perf_counter()
            reply = decoder.decode(raw)
            done = time.perf_counter()
            render.search(reply, text)  # type: ignore[arg-type]
            total.append(done - started)
            decode.append(done - decoded)
            rendering.append(time.perf_counter() - done)
    settings = Settings.from_env()
    encoder = load_encoder("onnx", settings.model_cache_dir)
    encoder.encode(["warming up the encoder"])
    encode = []
    for _, text in questions:
        started = time.perf_counter()
        encoder.encode([text])
        encode.append(time.perf_counter() - started)
    return {"search": total, "client decode": decode, "cli rendering": rendering, "bare encode": encode}


def report(result: dict[str, Any]) -> dict[str, Any]:
    records: list[dict[str, float]] = result["stages"]
    client = result["client"]
    rows = {name: [r.get(name, 0.0) for r in records] for name in STAGES}
    rows["client decode"] = client["client decode"]
    summary = {name: {"p50_ms": ms(values, 0.5), "p99_ms": ms(values, 0.99)} for name, values in rows.items()}
    search, encode = client["search"], client["bare encode"]
    inside = [sum(r.values()) for r in records]
    figures = {
        "questions": result["questions"],
        "stages": summary,
        "stages_total": {"p50_ms": ms(inside, 0.5), "p99_ms": ms(inside, 0.99)},
        "search": {"p50_ms": ms(search, 0.5), "p99_ms": ms(search, 0.99)},
        "bare_encode": {"p50_ms": ms(encode, 0.5), "p99_ms": ms(encode, 0.99)},
        "cli_rendering": {"p50_ms": ms(client["cli rendering"], 0.5), "p99_ms": ms(client["cli rendering"], 0.99)},
        "search_p50_over_encode": round(pct(search, 0.5) / pct(encode, 0.5), 2),
        "ingest": result["ingest"],
    }
    rows = [(name, row["p50_ms"], row["p99_ms"]) for name, row in summary.items()]
    rows += [
        ("the stages together", *figures["stages_total"].values()),
        ("search, end to end (the client)", *figures["search"].values()),
        ("bare ONNX encode of the query", *figures["bare_encode"].values()),
        ("the CLI rendering the reply", *figures["cli_rendering"].values()),
    ]
    print(f"{'stage':<36} {'p50 ms':>8} {'p99 ms':>8}")
    for name, p50, p99 in rows:
        print(f"{name:<36} {p50:>8.3f} {p99:>8.3f}")
    print(f"search p50 / encode p50: {figures['search_p50_over_encode']}x ({result['questions']} searches)")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, help="e.g. ../shared/datasets/locomo-dev")
    parser.add_argument("--limit-conversations", type=int, default=None, metavar="N")
    parser.add_argument("--client", nargs=2, metavar=("URL", "QUESTIONS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        url, path = args.client
        questions = [tuple(q) for q in json.loads(Path(path).read_text())]
        print(json.dumps(asyncio.run(ask(url, questions))))  # type: ignore[arg-type]
        return
    if args.data is None:
        parser.error("--data is required")
    print(json.dumps(report(asyncio.run(serve_and_ask(args.data, args.limit_conversations)))))


if __name__ == "__main__":
    main()
