"""The forget saga's clock: sends ``ExpireForget`` for every pending deletion whose deadline has
passed, and ``ExpireNote`` for every note whose time to live has run out. Both commands are
idempotent (each id names the note and the deadline), so several workers running this, or a
tick repeating one before the saga has seen its outcome, are harmless."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from engram_ledger.contracts.commands import ExpireForget, ExpireNote
from engram_ledger.services.application.ports import PendingDeletions
from engram_ledger.services.common.periodic import every

log = logging.getLogger("engram.forget")


class ForgetExpiryTimer:
    def __init__(
        self,
        pending: PendingDeletions,
        partitions: int,
        execute: Callable[[ExpireForget | ExpireNote], Awaitable[object]],
        clock: Callable[[], datetime],
        interval: float = 0.5,
    ) -> None:
        self._pending = pending
        self._partitions = partitions
        self._execute = execute
        self._clock = clock
        self._interval = interval

    async def tick(self) -> int:
        sent = 0
        now_ms = self._clock().timestamp() * 1000
        for p in range(self._partitions):
            for user_id, note_id, deadline in await self._pending.due(p, now_ms):
                command = ExpireForget(
                    command_id=f"expire-forget-{note_id}-{int(deadline)}", user_id=user_id, note_id=note_id
                )
                await self._execute(command)
                sent += 1
            for user_id, note_id, expiry in await self._pending.expiring(p, now_ms):
                # Named by the expiry (as ``expiry_command_id``): a renewal makes a later one new.
                expire = ExpireNote(command_id=f"expire-note-{note_id}-{int(expiry)}", user_id=user_id, note_id=note_id)
                await self._execute(expire)
                sent += 1
        return sent

    async def run(self, stop: asyncio.Event) -> None:
        await every(self._interval, stop, self.tick, "forget expiry tick", log)
