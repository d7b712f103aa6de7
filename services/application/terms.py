"""BM25 terms of a text: the sparse vector a note is indexed under and the one a query searches
with. The index projection and the search service both use them, so both sides count terms the
same way (Qdrant's own BM25 tokenizer and stemmer, in-process)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engram_ledger.services.application.vector_index import Sparse

if TYPE_CHECKING:
    from qdrant_edge import Bm25

_bm25: Bm25 | None = None


def bm25() -> Bm25:
    global _bm25
    if _bm25 is None:
        # Imported on first use: the settings import this module, and a command that never
        # counts terms (`engram --help`, `engram get`) need not load Qdrant's library.
        from qdrant_edge import Bm25

        _bm25 = Bm25()
    return _bm25


def sparse_document(text: str) -> Sparse:
    vector = bm25().embed_document(text)
    return Sparse(list(vector.indices), list(vector.values))


def sparse_query(text: str) -> Sparse:
    vector = bm25().embed_query(text)
    return Sparse(list(vector.indices), list(vector.values))
