"""The model's two runtimes: ONNX Runtime (exported here from the packaged weights) gives PyTorch's
own vectors, so an index built with either serves the other; int8 weights give other vectors, and
an index built with one is refused by the other until it is rebuilt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters import minilm
from engram_ledger.services.adapters.minilm import OnnxMiniLM, exported_model, load_encoder, model_path
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService, service_settings
from tests.support import TEST_MODEL_CACHE

TEXTS = [
    "what is my favourite colour?",
    "Caroline went to the LGBTQ support group on 7 May 2023 and said it was powerful",
    "ok",
    "Melanie painted a sunrise over the lake last year; she loves painting landscapes. " * 30,  # > 256 pieces
    "Straße, café, 東京 and emoji 🎨 survive the tokenizer",
]


def cosines(a: list[list[float]], b: list[list[float]]) -> np.ndarray:
    return np.sum(np.array(a) * np.array(b), axis=1)


def test_onnx_gives_pytorchs_vectors_and_word_pieces() -> None:
    torch_model = load_encoder("torch", TEST_MODEL_CACHE)
    onnx_model = load_encoder("onnx", TEST_MODEL_CACHE)
    reference, onnx = torch_model.encode(TEXTS), onnx_model.encode(TEXTS)
    assert np.abs(np.array(reference) - np.array(onnx)).max() < 1e-5, "interchangeable in one index"
    assert np.allclose(np.linalg.norm(np.array(onnx), axis=1), 1.0, atol=1e-6)
    # One at a time (no padding) and in a mixed batch (padding) give the same vector.
    assert np.abs(np.array(onnx_model.encode(TEXTS[:1])) - np.array(onnx[:1])).max() < 1e-5
    for text in TEXTS:
        assert onnx_model.offsets(text) == torch_model.offsets(text), "chunks are cut at the same places"


def test_the_export_is_made_once_per_cache_and_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exports: list[Path] = []
    real_export = minilm._export

    def counting_export(source: Path, target: Path) -> None:
        exports.append(target)
        real_export(source, target)

    monkeypatch.setattr(minilm, "_export", counting_export)
    source = Path(model_path())
    first = exported_model(source, tmp_path, quantized=False)
    again = exported_model(source, tmp_path, quantized=False)
    assert first == again and exports == [first], "the second start loads the file the first made"
    assert first.name.startswith("all-MiniLM-L6-v2-") and first.stat().st_size > 80_000_000
    assert not list(tmp_path.glob("*.partial")), "nothing half-written is left beside it"
    vectors = OnnxMiniLM(first, source / "tokenizer.json", batch_size=8, threads=1).encode(TEXTS[:2])
    assert cosines(vectors, load_encoder("onnx", TEST_MODEL_CACHE).encode(TEXTS[:2])).min() > 0.99999


def test_a_cache_that_cannot_be_written_is_named_in_the_error(tmp_path: Path) -> None:
    """A read-only image without the export asked for: one clear line, not a PermissionError loop."""
    (tmp_path / "a-file").write_text("")
    with pytest.raises(RuntimeError, match=r"cannot be written .*engram model --encoder onnx-int8.*ENGRAM_MODEL_CACHE"):
        exported_model(Path(model_path()), tmp_path / "a-file" / "models", quantized=True)


async def test_int8_weights_are_close_but_another_model_for_the_index(redis_url: str) -> None:
    """Switching between fp32 and int8 must go through `engram rebuild index`: the vectors differ."""
    int8, fp32 = load_encoder("onnx-int8", TEST_MODEL_CACHE), load_encoder("onnx", TEST_MODEL_CACHE)
    similarity = cosines(int8.encode(TEXTS), fp32.encode(TEXTS))
    assert similarity.min() > 0.95 and similarity.max() < 0.99999, similarity

    built = await RunningService(service_settings(redis_url)).start()
    try:
        async with EngramClient(redis_url) as c:
            saved = await c.save("alice", "my bike is a green Brompton")
            assert (await c.search("alice", "bicycle", after=saved.token)).results
    finally:
        await built.stop()
    switched = await RunningService(service_settings(redis_url, encoder="onnx-int8")).start()
    try:
        async with EngramClient(redis_url) as c:
            with pytest.raises(EngramError) as info:
                await c.search("alice", "bicycle")
        assert info.value.code is ErrorCode.EMBEDDING_ERROR
        assert "engram rebuild index" in info.value.message and "+onnx-int8" in info.value.message
    finally:
        await switched.stop()
