"""Where a request's time goes, stage by stage: opt-in (``bench/bench_search_profile.py`` turns it
on), and off otherwise at the cost of one context-variable read per stage.

``profiled()`` opens a request's record (a dict: stage name -> seconds) when a sink is set
(``collect``), and hands it to the sink when the request ends; ``stage(name)`` adds the time of
its block to the open record, if any; ``record`` adds a duration measured elsewhere (another
thread)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar

_record: ContextVar[dict[str, float] | None] = ContextVar("engram_stages", default=None)
_sink: Callable[[dict[str, float]], None] | None = None


def collect(sink: Callable[[dict[str, float]], None] | None) -> None:
    """Send each profiled request's record to ``sink`` from now on (None: profile nothing)."""
    global _sink
    _sink = sink


@contextlib.contextmanager
def profiled() -> Iterator[None]:
    sink = _sink
    if sink is None:
        yield
        return
    record: dict[str, float] = {}
    token = _record.set(record)
    try:
        yield
    finally:
        _record.reset(token)
        sink(record)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    record = _record.get()
    if record is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        record[name] = record.get(name, 0.0) + time.perf_counter() - started


def record(name: str, seconds: float) -> None:
    if (current := _record.get()) is not None:
        current[name] = current.get(name, 0.0) + seconds


def profiling() -> bool:
    """Whether the current request is profiled (a stage measured in another thread is then timed)."""
    return _record.get() is not None
