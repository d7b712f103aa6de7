"""``CallerDeadline``: the caller's wait (``engram-wait-ms``), counted from when its request
entered the stream (the entry id's time), made known to the handler
(``services/application/deadline.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from faststream import BaseMiddleware

from engram_ledger.contracts import channels
from engram_ledger.services.application.deadline import caller_waits_until
from engram_ledger.services.bus.admission import WAIT_HEADER


class CallerDeadline(BaseMiddleware):
    async def consume_scope(self, call_next: Callable[[Any], Awaitable[Any]], msg: Any) -> Any:
        with caller_waits_until(_ends(msg)):
            return await call_next(msg)


def _ends(msg: Any) -> float | None:
    try:
        wait_ms = int(str(msg.headers[WAIT_HEADER]))
        ids = msg.raw_message["message_ids"]
        entered_ms, _ = channels.parse_entry_id(ids[0])
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return None
    return (entered_ms + wait_ms) / 1000
