"""Choosing the ranking by leave-one-conversation-out, offline and fast.

    .venv/bin/python -m bench.tune_locomo --data ../shared/datasets/locomo-dev

The service's ranking is a pure function of two candidate lists (dense cosine and BM25 scores);
this script computes those lists for every LoCoMo question once (MiniLM embeddings cached under
``--cache``, BM25 with Qdrant Edge's own ``Bm25`` tokenizer and Qdrant's IDF formula, exact
cosine), then scores every option of ``engram_ledger.services.application.ranking`` on both modes (turns with their
conversational context, facts as notes). For each held-out conversation the option best on the
other four is chosen and scored on it; the held-out figures are the honest estimate. The option
best on all five is the one to ship; ``bench_locomo`` then measures it on the running service.

Two bounds decide which options may compete at all: bench_quality's dev set (paraphrases, 200
filler notes per user) must keep its MRR@10 within 0.02 of Engram's ranking before LoCoMo (with
``--dev-margin`` to spare, as its live figure moves a little), and a small collection of
near-duplicate notes told apart by one rare codeword each must find every one of them first.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.locomo import Conversation, load
from engram_ledger.projections.index import indexed_text
from engram_ledger.services.application.ranking import (
    RankingPolicy,
    boost_named,
    boost_period,
    boost_sessions,
    context_text,
    context_vector,
    fuse,
)
from engram_ledger.services.application.search import NAMED_WINDOW
from engram_ledger.services.application.vector_index import IndexHit
from engram_ledger.services.application.when import asked_period

LIMIT = 50  # candidates per signal, as the search service asks the index for
# "now" for the questions' relative times (LoCoMo's questions name absolute dates).
NOW = datetime(2026, 11, 27, tzinfo=UTC)


def encode(model, texts: list[str], cache: Path) -> np.ndarray:  # type: ignore[no-untyped-def]
    key = hashlib.sha1("\x1e".join(texts).encode()).hexdigest()[:16]
    path = cache / f"{key}.npy"
    if path.exists():
        return np.load(path)
    vectors = model.encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


@dataclass
class Sparse:
    rows: list[dict[int, float]]


def bm25_docs(texts: Sequence[str], avg_len: float) -> list[dict[int, float]]:
    from qdrant_edge import Bm25, Bm25Config

    model = Bm25(Bm25Config(avg_len=avg_len))
    out = []
    for t in texts:
        v = model.embed_document(t)
        out.append(dict(zip(v.indices, v.values, strict=True)))
    return out


def bm25_query(text: str) -> list[int]:
    from qdrant_edge import Bm25

    return list(Bm25().embed_query(text).indices)


def idf_table(rows: Sequence[dict[int, float]]) -> dict[int, float]:
    df: Counter[int] = Counter()
    for r in rows:
        df.update(r.keys())
    n = len(rows)
    return {t: math.log(1 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}


@dataclass
class Mode:
    """One conversation's documents in one mode and its questions' candidate lists."""

    conv: str
    # per question: (dense hits, sparse hits, relevant doc ids, category, question)
    cases: list[tuple[list[IndexHit], list[IndexHit], set[str], int, str]]
    # doc id -> its speaker or subject
    names: dict[str, str | None] = field(default_factory=dict)
    # doc id -> the session a turn was said in (notes have none), and when it happened
    sessions: dict[str, str | None] = field(default_factory=dict)
    times: dict[str, datetime] = field(default_factory=dict)


def hits(
    scores: np.ndarray, ids: list[str], limit: int, positive: bool = False, context: bool = False
) -> list[IndexHit]:
    order = np.argsort(-scores)[:limit]
    payload = {"context": True} if context else {}
    return [
        IndexHit(point_id=ids[i], score=float(scores[i]), payload={"note_id": ids[i], **payload})
        for i in order
        if not positive or scores[i] > 0
    ]


def build_modes(
    convs: list[Conversation],
    model,
    cache: Path,
    context: int,
    avg_len: float,
    speaker_in_text: bool,
    mean_context: bool,
) -> tuple[list[Mode], list[Mode]]:
    """Both modes' candidate lists per question, the documents indexed as the service does
    (``speaker_in_text``, ``mean_context``: its choices; the other values are for comparing)."""

    def named(name: str, text: str) -> str:
        return indexed_text(name, text) if speaker_in_text else text

    turn_docs: list[tuple[str, str, str, str]] = []  # (conv, doc id, own text, indexed text)
    for c in convs:
        for session in c.sessions.values():
            for i, t in enumerate(session):
                before = [named(p.speaker, p.text) for p in session[max(0, i - context) : i]]
                turn_docs.append(
                    (c.name, t.dia_id, named(t.speaker, t.text), context_text(named(t.speaker, t.text), before))
                )
    # A fact is a note: its subject (the speaker) is a BM25 keyword, not part of its vector.
    fact_docs = [
        (c.name, f"F{j}", f.text, f.evidence, named(f.speaker, f.text)) for c in convs for j, f in enumerate(c.facts)
    ]
    own_vec = encode(model, [d[2] for d in turn_docs], cache)
    if context and mean_context:
        # The context point's vector: the mean of the turns' own vectors (nothing encoded twice).
        position = {(d[0], d[1]): i for i, d in enumerate(turn_docs)}
        rows = [
            context_vector(
                [list(map(float, own_vec[position[(c.name, p.dia_id)]])) for p in session[max(0, i - context) : i + 1]]
            )
            for c in convs
            for session in c.sessions.values()
            for i in range(len(session))
        ]
        ctx_vec = np.array(rows)
    else:
        ctx_vec = encode(model, [d[3] for d in turn_docs], cache) if context else own_vec
    fact_vec = encode(model, [d[2] for d in fact_docs], cache)
    questions = [(c.name, q) for c in convs for q in c.questions]
    q_vec = encode(model, [q.text for _, q in questions], cache)
    own_rows = bm25_docs([d[2] for d in turn_docs], avg_len)
    turn_rows = bm25_docs([d[3] for d in turn_docs], avg_len) if context else own_rows
    fact_rows = bm25_docs([d[4] for d in fact_docs], avg_len)
    # One collection holds both points of every turn: the IDF counts both.
    turn_idf, fact_idf = idf_table(own_rows + (turn_rows if context else [])), idf_table(fact_rows)

    def sparse_scores(
        rows: list[dict[int, float]], idf: dict[int, float], terms: list[int], idx: list[int]
    ) -> np.ndarray:
        return np.array([sum(idf.get(t, 0.0) * rows[i].get(t, 0.0) for t in terms) for i in idx])

    turns_modes, facts_modes = [], []
    for c in convs:
        t_idx = [i for i, d in enumerate(turn_docs) if d[0] == c.name]
        t_ids = [turn_docs[i][1] for i in t_idx]
        f_idx = [i for i, d in enumerate(fact_docs) if d[0] == c.name]
        f_ids = [fact_docs[i][1] for i in f_idx]
        f_ev = {fact_docs[i][1]: fact_docs[i][3] for i in f_idx}
        tm = Mode(
            c.name,
            [],
            {t.dia_id: t.speaker for t in c.turns},
            {t.dia_id: f"session-{t.session}" for t in c.turns},
            {t.dia_id: t.sent_at for t in c.turns},
        )
        fm = Mode(
            c.name,
            [],
            {f"F{j}": f.speaker for j, f in enumerate(c.facts)},
            {},
            {f"F{j}": f.occurred_at for j, f in enumerate(c.facts)},
        )
        for qi, (name, q) in enumerate(questions):
            if name != c.name:
                continue
            terms = bm25_query(q.text)
            cos_own = own_vec[t_idx] @ q_vec[qi]
            cos_ctx = ctx_vec[t_idx] @ q_vec[qi]
            # A turn is one point per text it is indexed under (its own words, its words in
            # context); the best of them stands for it, as chunks do for a note.
            dense = hits(cos_own, t_ids, LIMIT) + (hits(cos_ctx, t_ids, LIMIT, context=True) if context else [])
            sparse = hits(sparse_scores(own_rows, turn_idf, terms, t_idx), t_ids, LIMIT, positive=True)
            if context:
                ctx_scores = sparse_scores(turn_rows, turn_idf, terms, t_idx)
                sparse += hits(ctx_scores, t_ids, LIMIT, positive=True, context=True)
            tm.cases.append((dense, sparse, set(q.evidence), q.category, q.text))
            fdense = hits(fact_vec[f_idx] @ q_vec[qi], f_ids, LIMIT)
            fsparse = hits(sparse_scores(fact_rows, fact_idf, terms, f_idx), f_ids, LIMIT, positive=True)
            relevant = {fid for fid in f_ids if f_ev[fid] & q.evidence}
            fm.cases.append((fdense, fsparse, relevant, q.category, q.text))
        turns_modes.append(tm)
        facts_modes.append(fm)
    return turns_modes, facts_modes


def build_devset(model, cache: Path, filler: int = 200) -> list[Mode]:  # type: ignore[no-untyped-def]
    """bench_quality's dev set offline: each user's active notes among ``filler`` synthetic ones
    (the same seeds as bench_quality), one Mode per user."""
    import json

    from bench.corpus import notes as filler_notes

    devset = json.loads((Path(__file__).parent / "data" / "devset.json").read_text())
    docs: list[tuple[str, str, str]] = []  # (user, key, text)
    for n, user in enumerate(devset["users"]):
        uid = user["user"]
        for start in range(0, filler, 100):
            texts = filler_notes(1000 + n * 100_000 + start, min(100, filler - start))
            docs += [(uid, f"filler{start + i}", t) for i, t in enumerate(texts)]
        superseded = {note["supersedes"] for note in user["notes"] if "supersedes" in note}
        docs += [(uid, note["key"], note["content"]) for note in user["notes"] if note["key"] not in superseded]
    vectors = encode(model, [d[2] for d in docs], cache)
    rows = bm25_docs([d[2] for d in docs], 256.0)
    idf = idf_table(rows)
    modes = []
    for user in devset["users"]:
        idx = [i for i, d in enumerate(docs) if d[0] == user["user"]]
        ids = [docs[i][1] for i in idx]
        q_vec = encode(model, [q["q"] for q in user["queries"]], cache)
        mode = Mode(user["user"], [])
        for qi, q in enumerate(user["queries"]):
            terms = bm25_query(q["q"])
            sparse = np.array([sum(idf.get(t, 0.0) * rows[i].get(t, 0.0) for t in terms) for i in idx])
            dense = hits(vectors[idx] @ q_vec[qi], ids, LIMIT)
            mode.cases.append((dense, hits(sparse, ids, LIMIT, positive=True), set(q["relevant"]), 0, q["q"]))
        modes.append(mode)
    return modes


def build_codewords(model, cache: Path) -> list[Mode]:  # type: ignore[no-untyped-def]
    """A small collection of near-duplicates told apart by one rare word each (as in
    tests/integration/test_search.py): a ranking must find each by that word."""
    docs = [
        (f"user{u}", f"kumquat{i}user{u}", f"user{u} remembers the secret codeword kumquat{i}user{u}")
        for u in range(6)
        for i in range(6)
    ]
    vectors = encode(model, [d[2] for d in docs], cache)
    rows = bm25_docs([d[2] for d in docs], 256.0)
    idf = idf_table(rows)
    modes = []
    for u in range(6):
        idx = [i for i, d in enumerate(docs) if d[0] == f"user{u}"]
        ids = [docs[i][1] for i in idx]
        mode = Mode(f"user{u}", [])
        q_vec = encode(model, ids, cache)
        for qi, word in enumerate(ids):
            terms = bm25_query(word)
            sparse = np.array([sum(idf.get(t, 0.0) * rows[i].get(t, 0.0) for t in terms) for i in idx])
            dense = hits(vectors[idx] @ q_vec[qi], ids, LIMIT)
            mode.cases.append((dense, hits(sparse, ids, LIMIT, positive=True), {word}, 0, word))
        modes.append(mode)
    return modes


def reordered(
    m: Mode, fused: list[tuple[str, float, float]], query: str, policy: RankingPolicy
) -> list[tuple[str, float, float]]:
    """What the search service does to its first slice of candidates (``SearchService._reordered``):
    the name boost, then the session and time levers."""
    head, tail = fused[:NAMED_WINDOW], fused[NAMED_WINDOW:]
    head = boost_named(head, m.names, query, policy.name_boost)
    head = boost_sessions(head, m.sessions, policy.session_boost)
    period = asked_period(query, NOW) if policy.time_boost else None
    if period is not None:
        head = boost_period(head, {n: n in m.times and period.holds(m.times[n]) for n, _, _ in head}, policy.time_boost)
    return head + tail


def score(modes: list[Mode], policy: RankingPolicy) -> dict[str, float]:
    n = r1 = r5 = r10 = mrr = 0.0
    for m in modes:
        for dense, sparse, relevant, _, query in m.cases:
            fused = reordered(m, fuse(dense, sparse, policy), query, policy)
            ranked = [note for note, _, _ in fused[:10]]
            rank = next((i + 1 for i, note in enumerate(ranked) if note in relevant), None)
            n += 1
            if rank:
                r1 += rank <= 1
                r5 += rank <= 5
                r10 += 1
                mrr += 1 / rank
    return {"R@1": r1 / n, "R@5": r5 / n, "R@10": r10 / n, "MRR@10": mrr / n, "n": n}


def objective(turns: dict[str, float], facts: dict[str, float]) -> float:
    """One ranking for both modes: the mean of R@10 and MRR@10 over both."""
    return (turns["R@10"] + turns["MRR@10"] + facts["R@10"] + facts["MRR@10"]) / 4


def grid() -> list[RankingPolicy]:
    options = [RankingPolicy(method="score", dense_weight=1.0, keyword_weight=w) for w in (0.1, 0.3, 0.5, 1.0)]
    for w, c in itertools.product((0.3, 0.4, 0.5, 0.6), (2.0, 4.0, 6.0, 10.0)):
        options.append(RankingPolicy(method="mixed", dense_weight=w, keyword_weight=1 - w, saturation=c))
    for w, floor, span, ctx, boost in itertools.product(
        (0.3, 0.4, 0.5), (0.0, 10.0, 20.0, 30.0, 40.0), (0.0, 0.1, 0.2, 0.3), (0.9, 0.8), (0.0, 0.1)
    ):
        options.append(
            RankingPolicy(
                method="minmax",
                dense_weight=w,
                keyword_weight=1 - w,
                keyword_floor=floor,
                dense_span=span,
                context_weight=ctx,
                name_boost=boost,
            )
        )
    for w in (0.3, 0.4, 0.5, 0.6, 0.7):
        options.append(RankingPolicy(method="dbsf", dense_weight=w, keyword_weight=1 - w))
        options.append(RankingPolicy(method="rrf", dense_weight=w, keyword_weight=1 - w))
    return options


def cross_validate(
    variants: dict[str, tuple[list[Mode], list[Mode]]],
    policies: list[RankingPolicy],
    say: Callable[[str], None],
    devset: list[Mode],
    floor: float,
    codewords: list[Mode],
) -> None:
    """Only policies keeping the dev set's MRR@10 at ``floor`` or above (its regression bound)
    and finding every codeword first compete."""
    convs = [m.conv for m in next(iter(variants.values()))[0]]
    allowed = []
    for p in policies:
        dev = score(devset, p)["MRR@10"]
        rare = score(codewords, p)["R@1"]
        if dev >= floor and rare == 1.0:
            allowed.append(p)
        say(f"dev set MRR@10 {dev:.3f}, codewords R@1 {rare:.3f} {'ok ' if p in allowed else 'out'} {p}")
    policies = allowed
    table: dict[tuple[str, int], tuple[dict[str, float], dict[str, float]]] = {}
    for (vname, (tm, fm)), (pi, p) in itertools.product(variants.items(), enumerate(policies)):
        table[(vname, pi)] = (score(tm, p), score(fm, p))
    ranked = sorted(table, key=lambda k: -objective(*table[k]))
    say("best on all five (turns R@10/MRR, facts R@10/MRR):")
    for key in ranked[:12]:
        t, f = table[key]
        figures = f"{t['R@10']:.3f} {t['MRR@10']:.3f}  {f['R@10']:.3f} {f['MRR@10']:.3f}"
        say(f"  {key[0]:<28} {policies[key[1]]!s:<60} {figures}")
    # Leave one conversation out: choose on four, measure on the fifth.
    held: dict[str, list[float]] = {"tR10": [], "tMRR": [], "fR10": [], "fMRR": [], "tn": [], "fn": []}
    for out in convs:

        def on(modes: list[Mode], keep: bool, out: str = out) -> list[Mode]:
            return [m for m in modes if (m.conv == out) == keep]

        def train(key: tuple[str, int]) -> float:
            tm, fm = variants[key[0]]
            return objective(score(on(tm, False), policies[key[1]]), score(on(fm, False), policies[key[1]]))

        best = max(ranked[:40], key=train)
        tm, fm = variants[best[0]]
        t, f = score(on(tm, True), policies[best[1]]), score(on(fm, True), policies[best[1]])
        figures = f"turns {t['R@10']:.3f}/{t['MRR@10']:.3f} facts {f['R@10']:.3f}/{f['MRR@10']:.3f}"
        say(f"held out {out}: chose {best[0]} {policies[best[1]]}: {figures}")
        held["tR10"].append(t["R@10"] * t["n"])
        held["tMRR"].append(t["MRR@10"] * t["n"])
        held["fR10"].append(f["R@10"] * f["n"])
        held["fMRR"].append(f["MRR@10"] * f["n"])
        held["tn"].append(t["n"])
        held["fn"].append(f["n"])
    tn, fn = sum(held["tn"]), sum(held["fn"])
    say(
        f"held-out (question-weighted): turns R@10 {sum(held['tR10']) / tn:.3f} MRR@10 {sum(held['tMRR']) / tn:.3f}; "
        f"facts R@10 {sum(held['fR10']) / fn:.3f} MRR@10 {sum(held['fMRR']) / fn:.3f}"
    )


def ablate(
    convs: list[Conversation],
    model,
    cache: Path,
    devset: list[Mode],
    codewords: list[Mode],
    say: Callable[[str], None],  # type: ignore[no-untyped-def]
) -> None:
    """The shipped ranking with one lever removed at a time, on all five conversations."""
    from dataclasses import replace

    shipped = RankingPolicy()
    indexed = {
        "as shipped": build_modes(convs, model, cache, 2, 256.0, True, True),
        "no context": build_modes(convs, model, cache, 0, 256.0, True, True),
        "no names in text": build_modes(convs, model, cache, 2, 256.0, False, True),
    }
    rows = [
        ("as shipped", "as shipped", shipped),
        (
            "score fusion (1.0, 0.1)",
            "as shipped",
            RankingPolicy(method="score", dense_weight=1.0, keyword_weight=0.1, session_boost=0.0, time_boost=0.0),
        ),
        ("no context points", "no context", shipped),
        ("context weight 1.0", "as shipped", replace(shipped, context_weight=1.0)),
        ("no names in the indexed text", "no names in text", shipped),
        ("no name boost", "as shipped", replace(shipped, name_boost=0.0)),
        ("no keyword floor", "as shipped", replace(shipped, keyword_floor=0.0)),
        ("no dense span", "as shipped", replace(shipped, dense_span=0.0)),
        ("no session boost", "as shipped", replace(shipped, session_boost=0.0)),
        ("no time boost", "as shipped", replace(shipped, time_boost=0.0)),
        ("neither", "as shipped", replace(shipped, session_boost=0.0, time_boost=0.0)),
    ]
    say(f"{'':<30} turns R@10 MRR   facts R@10 MRR   dev MRR  codewords R@1")
    for label, variant, policy in rows:
        tm, fm = indexed[variant]
        t, f = score(tm, policy), score(fm, policy)
        dev, rare = score(devset, policy)["MRR@10"], score(codewords, policy)["R@1"]
        figures = f"{t['R@10']:.3f} {t['MRR@10']:.3f}    {f['R@10']:.3f} {f['MRR@10']:.3f}    {dev:.3f}    {rare:.3f}"
        say(f"{label:<30} {figures}")


def choose_levers(convs: list[Conversation], model, cache: Path, say: Callable[[str], None]) -> None:  # type: ignore[no-untyped-def]
    """The session and time boosts, the fusion as shipped: for each conversation the pair best
    on the other four (mean of R@10 and MRR@10, turns and facts) is scored on it."""
    from dataclasses import replace

    turns, facts = build_modes(convs, model, cache, 2, 256.0, True, True)
    pairs = list(itertools.product((0.0, 0.1, 0.15, 0.2, 0.3), (0.0, 0.2, 0.5)))
    results = {
        pair: {
            m.conv: (score([m], replace(RankingPolicy(), session_boost=pair[0], time_boost=pair[1])), f)
            for m, f in zip(turns, facts, strict=True)
        }
        for pair in pairs
    }
    per_conv = {
        pair: {
            c: (t, score([f], replace(RankingPolicy(), session_boost=pair[0], time_boost=pair[1])))
            for c, (t, f) in found.items()
        }
        for pair, found in results.items()
    }
    held: list[tuple[dict[str, float], dict[str, float]]] = []
    for conv in per_conv[pairs[0]]:
        best = max(pairs, key=lambda p: sum(objective(*per_conv[p][c]) for c in per_conv[p] if c != conv))
        say(f"held out {conv}: chose session +{best[0]:g}, time +{best[1]:g}")
        held.append(per_conv[best][conv])
    n = len(held)
    for i, mode in enumerate(("turns", "facts")):
        r10 = sum(h[i]["R@10"] for h in held) / n
        mrr = sum(h[i]["MRR@10"] for h in held) / n
        say(f"held out, {mode}: R@10 {r10:.3f}, MRR@10 {mrr:.3f} (mean over the folds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/engram-locomo-cache"))
    parser.add_argument("--contexts", default="2", help="turns of context, e.g. 0,1,2 to compare")
    parser.add_argument(
        "--encoded-context", action="store_true", help="embed the context text instead of averaging turn vectors"
    )
    parser.add_argument(
        "--dev-margin",
        type=float,
        default=0.01,
        help="keep the dev set this far above its bound (bench_quality's live figure differs a little)",
    )
    parser.add_argument("--avg-lens", default="256", help="BM25 avg_len (Qdrant's default 256), e.g. 256,24")
    parser.add_argument("--speaker", default="1", help="the name in a turn's or fact's indexed text: 1, 0 or 1,0")
    parser.add_argument("--ablate", action="store_true", help="only: the shipped ranking with each lever removed")
    parser.add_argument("--levers", action="store_true", help="only: choose the session and time boosts")
    args = parser.parse_args()
    from engram_ledger.services.adapters.embedder import load_model, model_path

    model = load_model(model_path())
    convs = load(args.data)
    if args.levers:
        choose_levers(convs, model, args.cache, print)
        return
    if args.ablate:
        ablate(convs, model, args.cache, build_devset(model, args.cache), build_codewords(model, args.cache), print)
        return
    variants = {}
    for context, avg_len, speaker in itertools.product(
        [int(x) for x in args.contexts.split(",")],
        [float(x) for x in args.avg_lens.split(",")],
        [bool(int(x)) for x in args.speaker.split(",")],
    ):
        variants[f"ctx{context} avg{avg_len:g} name{int(speaker)}"] = build_modes(
            convs, model, args.cache, context, avg_len, speaker, not args.encoded_context
        )
    devset = build_devset(model, args.cache)
    reference = score(devset, RankingPolicy(method="score", dense_weight=1.0, keyword_weight=0.1))["MRR@10"]
    bound = reference - 0.02 + args.dev_margin
    print(f"dev set MRR@10 of Engram before LoCoMo: {reference:.3f}; the bound: {bound:.3f}")
    cross_validate(variants, grid(), print, devset, bound, build_codewords(model, args.cache))


if __name__ == "__main__":
    main()
