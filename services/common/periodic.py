"""The loop every background worker shares: do a round, wait, again, until told to stop. A failed
round (Redis restarting, a network blip) is logged and the next one comes on time; a round
waits for a Redis that is alive but stalled (a serving process's calls have no time limit
unless ENGRAM_REDIS_SOCKET_TIMEOUT sets one)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable


async def every(
    interval: float, stop: asyncio.Event, round: Callable[[], Awaitable[object]], what: str, log: logging.Logger
) -> None:
    while not stop.is_set():
        try:
            await round()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed; retrying", what)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)
