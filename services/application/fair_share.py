"""``FairShare``: one worker's handlers shared fairly between the users whose requests it holds.

A request stream is first in, first out: one caller sending thousands of requests at once would
put every other user's behind them. The worker therefore reads ahead of what it runs, and runs
what it read in turns: a free handler goes to the user who has waited longest for one, not to
the oldest request, and one user runs at most ``running_per_user`` requests at once (the
others' requests share the processor with no more of the flood than that). Each user may hold a
bounded number of requests in the worker (running or waiting their turn); beyond that a request
is refused at once with ``RATE_LIMITED`` and a hint of when to try again, so the flood drains at
the speed of a refusal, not of the work it asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator

from engram_ledger.contracts.errors import EngramError, ErrorCode


def turn_in(share: FairShare | None, user_id: str) -> contextlib.AbstractAsyncContextManager[None]:
    """The user's turn in ``share``; no wait at all without one (the operators' stream)."""
    return share.turn(user_id) if share is not None else contextlib.nullcontext()


class FairShare:
    def __init__(self, handlers: int, per_user: int, retry_after_ms: int = 1_000, running_per_user: int = 1) -> None:
        """``handlers``: how many requests run at once; ``per_user``: how many one user may hold
        (running and waiting) before the next is refused; ``running_per_user``: how many of one
        user's run at once."""
        self._free = handlers
        self._per_user = per_user
        self._running_per_user = running_per_user
        self._retry_after_ms = retry_after_ms
        self._held: dict[str, int] = {}
        self._running: dict[str, int] = {}
        # The users with a request waiting, oldest turn first, and each one's waiting requests.
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    def held(self, user_id: str) -> int:
        return self._held.get(user_id, 0)

    @contextlib.asynccontextmanager
    async def turn(self, user_id: str) -> AsyncIterator[None]:
        """Hold one of the user's places until the block ends; raises ``RATE_LIMITED`` when the
        user holds all of them."""
        held = self._held.get(user_id, 0)
        if held >= self._per_user:
            raise EngramError(
                ErrorCode.RATE_LIMITED,
                f"user {user_id!r} already has {held} requests waiting on this worker, its share; "
                f"nothing was done: send this request again in {self._retry_after_ms / 1000:g} s",
                retry_after_ms=self._retry_after_ms,
            )
        self._held[user_id] = held + 1
        try:
            await self._acquire(user_id)
            try:
                yield
            finally:
                self._release(user_id)
        finally:
            if (left := self._held[user_id] - 1) == 0:
                del self._held[user_id]
            else:
                self._held[user_id] = left

    async def _acquire(self, user_id: str) -> None:
        if self._free > 0 and not self._waiting and self._running.get(user_id, 0) < self._running_per_user:
            self._start(user_id)
            return
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(user_id, deque()).append(ticket)
        self._dispatch()
        try:
            await ticket
        except asyncio.CancelledError:
            if ticket.done() and not ticket.cancelled():
                self._release(user_id)  # granted as it was cancelled: pass the handler on
            else:
                self._forget(user_id, ticket)
            raise

    def _start(self, user_id: str) -> None:
        self._free -= 1
        self._running[user_id] = self._running.get(user_id, 0) + 1

    def _release(self, user_id: str) -> None:
        self._free += 1
        if (running := self._running[user_id] - 1) == 0:
            del self._running[user_id]
        else:
            self._running[user_id] = running
        self._dispatch()

    def _dispatch(self) -> None:
        """Free handlers to the users whose turn it is (each then to the back of the line),
        skipping a user who already runs its share."""
        while self._free > 0:
            user_id = next(
                (u for u in self._waiting if self._running.get(u, 0) < self._running_per_user),
                None,
            )
            if user_id is None:
                return
            tickets = self._waiting.pop(user_id)
            ticket = tickets.popleft()
            if tickets:
                self._waiting[user_id] = tickets
            if not ticket.done():
                self._start(user_id)
                ticket.set_result(None)

    def _forget(self, user_id: str, ticket: asyncio.Future[None]) -> None:
        tickets = self._waiting.get(user_id)
        if tickets is not None:
            with contextlib.suppress(ValueError):
                tickets.remove(ticket)
            if not tickets:
                del self._waiting[user_id]
