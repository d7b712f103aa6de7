"""The bare encode floor of each way to run MiniLM: one query at a time, and batched.

    .venv/bin/python -m bench.bench_encoder [--queries 500] [--texts 2048] [--neighbour]

In this process only (no service): PyTorch through sentence-transformers (the reference),
ONNX Runtime with the model's own fp32 weights (the default encoder) and with int8 weights.
Single: distinct questions, one ``encode`` each, as a search makes them. Batched: notes in
batches of 64 and in the index projection's slices of 16. Vectors are compared with PyTorch's.

``--neighbour`` repeats the single-query figures while a second process encodes one query every
25 ms with the same runtime, as `engram serve` does beside a benchmark client measuring a floor:
this is why a floor taken inside a benchmark reads slower than one taken alone.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_core import pct
from bench.corpus import notes, question_text
from engram_ledger.services.adapters.minilm import ENCODER_KINDS, Encoder, load_encoder

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def single(encoder: Encoder, queries: list[str]) -> list[float]:
    for q in queries[:20]:
        encoder.encode([q])
    times = []
    for q in queries:
        started = time.perf_counter()
        encoder.encode([q])
        times.append((time.perf_counter() - started) * 1000)
    return times


def batched(encoder: Encoder, texts: list[str], size: int) -> float:
    encoder.encode(texts[:size])
    started = time.perf_counter()
    for i in range(0, len(texts), size):
        encoder.encode(texts[i : i + size])
    return len(texts) / (time.perf_counter() - started)


def neighbour(kind: str, cache: str, threads: int, stop: Any, ready: Any) -> None:
    """Another process encoding a query every 25 ms: the service answering searches."""
    encoder = load_encoder(kind, Path(cache), threads=threads)
    ready.set()
    rng = random.Random(-1)
    n = 0
    while not stop.is_set():
        encoder.encode([question_text(rng)])
        n += 1
        time.sleep(0.025)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--texts", type=int, default=2048)
    parser.add_argument("--neighbour", action="store_true", help="also measure beside a second encoding process")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0: one per core)")
    parser.add_argument("--model-cache", default=os.environ.get("ENGRAM_MODEL_CACHE") or tempfile.gettempdir())
    args = parser.parse_args()
    cache = Path(args.model_cache)
    rng = random.Random(7)
    distinct: dict[str, None] = {}
    while len(distinct) < args.queries:
        distinct[question_text(rng)] = None
    queries = list(distinct)
    texts = [t for u in range(40) for t in notes(u, 100)][: args.texts]
    results: dict[str, dict[str, Any]] = {}
    reference: np.ndarray | None = None
    for kind in ENCODER_KINDS[::-1]:  # torch first: the reference
        encoder = load_encoder(kind, cache, threads=args.threads)
        vectors = np.array(encoder.encode(texts[:256]))
        if reference is None:
            reference = vectors
        cosine = np.sum(vectors * reference, axis=1)
        times = single(encoder, queries)
        row: dict[str, Any] = {
            "single_p50_ms": round(pct(times, 0.5), 2),
            "single_p99_ms": round(pct(times, 0.99), 2),
            "batch64_texts_per_s": round(batched(encoder, texts, 64), 1),
            "slice16_texts_per_s": round(batched(encoder, texts, 16), 1),
            "min_cosine_to_torch": round(float(cosine.min()), 6),
        }
        if args.neighbour:
            # spawn: a child forked after OpenMP started in this process hangs in it.
            spawn = multiprocessing.get_context("spawn")
            stop, ready = spawn.Event(), spawn.Event()
            other = spawn.Process(target=neighbour, args=(kind, str(cache), args.threads, stop, ready))
            other.start()
            ready.wait(120)
            busy = single(encoder, queries)
            stop.set()
            other.join()
            row["beside_neighbour_single_p50_ms"] = round(pct(busy, 0.5), 2)
        results[kind] = row
    base = results["torch"]
    print(f"{'encoder':<10} {'single p50':>11} {'p99':>8} {'batch 64/s':>11} {'slice 16/s':>11} {'min cos':>9}")
    for kind, row in results.items():
        print(
            f"{kind:<10} {row['single_p50_ms']:>8.2f} ms {row['single_p99_ms']:>5.2f} ms "
            f"{row['batch64_texts_per_s']:>11.1f} {row['slice16_texts_per_s']:>11.1f} "
            f"{row['min_cosine_to_torch']:>9.5f}"
            + (f"  beside a neighbour: {row['beside_neighbour_single_p50_ms']:.2f} ms" if args.neighbour else "")
        )
        if kind != "torch":
            row["single_speedup"] = round(base["single_p50_ms"] / row["single_p50_ms"], 2)
            row["batch64_speedup"] = round(row["batch64_texts_per_s"] / base["batch64_texts_per_s"], 2)
            print(f"{'':<10} single {row['single_speedup']}x PyTorch's, batched {row['batch64_speedup']}x")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
