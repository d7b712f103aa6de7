"""The embedder's batching and cache, with the model replaced by a counter (the real model is
exercised by the integration tests)."""

from __future__ import annotations

import asyncio

import pytest

from engram_ledger.services.adapters.embedder import MiniLMEmbedder
from tests.support import eventually

pytestmark = pytest.mark.unit


class CountingEmbedder(MiniLMEmbedder):
    def __init__(self, cache_size: int = 4) -> None:
        super().__init__(cache_size=cache_size)
        self._model = object()  # never load the real one
        self.encoded: list[list[str]] = []

    def _encode(self, texts: list[str]) -> list[list[float]]:
        self.encoded.append(list(texts))
        return [[float(len(t)), 1.0] for t in texts]


async def test_concurrent_callers_share_one_encode_and_each_text_is_encoded_once() -> None:
    embedder = CountingEmbedder()
    try:
        first, second, third = await asyncio.gather(
            embedder.embed(["alpha", "beta"]), embedder.embed(["beta", "gamma"]), embedder.embed(["alpha"])
        )
        assert first == [[5.0, 1.0], [4.0, 1.0]] and second == [[4.0, 1.0], [5.0, 1.0]] and third == [[5.0, 1.0]]
        assert sorted(t for batch in embedder.encoded for t in batch) == ["alpha", "beta", "gamma"]
        assert await embedder.embed(["gamma", "alpha"]) == [[5.0, 1.0], [5.0, 1.0]]
        assert sum(len(b) for b in embedder.encoded) == 3, "cached texts are not encoded again"
    finally:
        embedder.close()


async def test_the_cache_is_bounded_and_forgets_the_least_recent() -> None:
    embedder = CountingEmbedder(cache_size=2)
    try:
        await embedder.embed(["a", "b"])
        await embedder.embed(["a"])  # a is now the most recent
        await embedder.embed(["c"])  # evicts b
        await embedder.embed(["a", "b"])
        assert embedder.encoded == [["a", "b"], ["c"], ["b"]]
    finally:
        embedder.close()


async def test_one_caller_cancelled_does_not_fail_the_others() -> None:
    embedder = CountingEmbedder()
    try:
        impatient = asyncio.create_task(embedder.embed(["shared"]))
        patient = asyncio.create_task(embedder.embed(["shared"]))
        await asyncio.sleep(0)
        impatient.cancel()
        assert await patient == [[6.0, 1.0]]
    finally:
        embedder.close()


async def test_an_encode_failure_reaches_every_waiter_and_is_not_cached() -> None:
    embedder = CountingEmbedder()
    failing = True

    def encode(texts: list[str]) -> list[list[float]]:
        if failing:
            raise RuntimeError("out of memory")
        return [[1.0] for _ in texts]

    embedder._encode = encode  # type: ignore[method-assign]
    try:
        results = await asyncio.gather(embedder.embed(["x"]), embedder.embed(["x"]), return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results)
        failing = False
        assert await embedder.embed(["x"]) == [[1.0]]
    finally:
        embedder.close()


async def test_callers_arriving_while_the_model_loads_share_that_one_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """A search arriving during the load at start used to queue a second load behind the first
    (twice 6-9 s: past a client's 10 s timeout)."""
    import time

    from engram_ledger.services.adapters import embedder as module

    loads: list[str] = []

    def slow_load(kind: str, cache_dir: object, **options: object) -> object:
        loads.append(kind)
        time.sleep(0.2)  # a load that takes a while, so that the three starts overlap
        return object()

    monkeypatch.setattr(module, "load_encoder", slow_load)
    embedder = MiniLMEmbedder()
    try:
        await asyncio.gather(embedder.start(), embedder.start(), embedder.start())
        await embedder.start()
        assert loads == ["onnx"]
    finally:
        embedder.close()


class SlowEmbedder(CountingEmbedder):
    """Each encode takes a little while, as the model's does, on the embedder's own thread."""

    def _encode(self, texts: list[str]) -> list[list[float]]:
        import time

        time.sleep(0.02)  # an encode that takes a while, so that a query arrives mid-bulk
        return super()._encode(texts)


async def test_a_query_never_waits_behind_the_index_projections_batch() -> None:
    """The index projection's batch (hundreds of texts) used to go into one encode call, and a
    search's query waited for all of it. Bulk is now encoded a slice at a time, and a query
    waiting is encoded before the next slice, alone; a bulk text a query asks for jumps too."""
    embedder = SlowEmbedder(cache_size=1_000)
    try:
        bulk = [f"note {n}" for n in range(100)]
        batch = asyncio.create_task(embedder.embed(bulk, background=True))
        await eventually(lambda: embedder.encoded, interval=0.001, what="the bulk's first slice encoded")
        await embedder.embed(["who is my manager?", "note 99"])
        assert not batch.done(), "the query was answered while the bulk was still being encoded"
        await batch
        slices = embedder.encoded
        query_at = next(i for i, b in enumerate(slices) if "who is my manager?" in b)
        assert query_at <= 2, "the query went in at most one slice after it arrived"
        assert sorted(slices[query_at]) == ["note 99", "who is my manager?"]
        assert all(len(b) <= 16 for b in slices), "bulk is encoded a slice at a time"
        assert sorted(t for b in slices for t in b) == sorted([*bulk, "who is my manager?"]), "each text once"
    finally:
        embedder.close()


def test_the_encoder_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    from engram_ledger.services.config import SettingError, Settings

    monkeypatch.delenv("ENGRAM_MODEL_CACHE", raising=False)
    monkeypatch.setenv("ENGRAM_DATA_DIR", "/srv/engram")
    monkeypatch.setenv("XDG_CACHE_HOME", "/home/u/.cache")
    default = Settings.from_env()
    # The machine's export, shared by every data dir of the user.
    assert default.encoder == "onnx" and default.model_cache_dir == Path("/home/u/.cache/engram/models")
    monkeypatch.setenv("ENGRAM_ENCODER", "Torch")
    monkeypatch.setenv("ENGRAM_MODEL_CACHE", "/var/cache/engram")
    chosen = Settings.from_env()
    assert chosen.encoder == "torch" and chosen.model_cache_dir == Path("/var/cache/engram")
    assert MiniLMEmbedder(encoder="onnx-int8").model_name.endswith("+onnx-int8"), "int8 is another model"
    assert MiniLMEmbedder(encoder="torch").model_name == MiniLMEmbedder().model_name, "same vectors"
    monkeypatch.setenv("ENGRAM_ENCODER_THREADS", "-1")
    with pytest.raises(SettingError, match="ENGRAM_ENCODER_THREADS=-1 is below 0"):
        Settings.from_env()
    monkeypatch.delenv("ENGRAM_ENCODER_THREADS")
    monkeypatch.setenv("ENGRAM_ENCODER", "tensorflow")
    with pytest.raises(SettingError, match="ENGRAM_ENCODER='tensorflow' is not one of onnx, onnx-int8, torch"):
        Settings.from_env()
