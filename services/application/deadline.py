"""How long the caller of the request being handled still waits for its reply.

A client says how long it waits (its envelope's ``engram-wait-ms``); the bus records, for the
handling of each request, when that wait ends (``services/bus/deadline.py``). A handler that must
wait for something (the embedding model while the service starts) waits no longer than that, and
then answers in words rather than leave the caller to time out."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.application.vector_index import SearchableIndex

_ends: ContextVar[float | None] = ContextVar("engram_caller_wait_ends", default=None)
# Kept back from the caller's wait for the reply's way back.
MARGIN_SECONDS = 0.5
STARTING_RETRY_MS = 2_000


@contextlib.contextmanager
def caller_waits_until(ends: float | None) -> Iterator[None]:
    """Within the block, the caller waits until ``ends`` (``time.time()``; None: not known)."""
    token = _ends.set(ends)
    try:
        yield
    finally:
        _ends.reset(token)


def time_left(default: float) -> float:
    """Seconds the current caller still waits, less a margin for the reply (``default`` when the
    caller did not say); never below zero."""
    ends = _ends.get()
    if ends is None:
        return default
    return max(0.0, ends - time.time() - MARGIN_SECONDS)


async def index_ready(index: SearchableIndex, what: str, default_wait: float) -> None:
    """Wait, within the caller's wait, for the embedding model ``what`` needs and for the live
    index to be open; past it, ``STARTING`` saying how long the model has been loading (a
    caller's time-out would say nothing)."""
    if index.embedder.ready and index.opened:
        return
    try:
        async with asyncio.timeout(time_left(default_wait)):
            await index.embedder.start()
            await index.wait_opened()
    except TimeoutError:
        loading = index.embedder.loading_seconds
        waiting = (
            f"the embedding model {what} needs has been loading for {loading:.0f} s"
            if loading
            else f"the vector index {what} needs is opening"
        )
        raise EngramError(
            ErrorCode.STARTING,
            f"Engram is starting: {waiting}; nothing was done: ask again in a few seconds",
            retry_after_ms=STARTING_RETRY_MS,
        ) from None
