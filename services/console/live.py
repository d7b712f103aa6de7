"""What the console learns from the public event log, which no query answers: which users exist,
what each did per day, which deletions are pending and until when, and an erasure's receipt.

``LogWatch`` follows every partition's log from its start through ``Subscription`` without a
group and without the master key, so it holds metadata only (ids, event types, times, channels,
command ids): never a memory's content. What it keeps is bounded per user (the last
``DAYS_KEPT`` days of counts, the last ``RECENT_KEPT`` events), not per event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import (
    AnyEvent,
    ForgetExpired,
    ForgetRequested,
    NoteForgotten,
    UserForgotten,
    is_recall,
)
from engram_ledger.services.bus.deliveries import Delivery
from engram_ledger.services.bus.subscription import Subscription

log = logging.getLogger("engram.console")

DAYS_KEPT = 60
RECENT_KEPT = 25
# What the activity chart counts, by event type.
SERIES: dict[str, str] = {
    "note_saved": "saves",
    "message_recorded": "saves",
    "note_updated": "updates",
    "note_superseded": "updates",
    "note_reverted": "updates",
    "note_forgotten": "forgets",
}


@dataclass(frozen=True, slots=True)
class LogEvent:
    """One event as the console shows it: no content, whatever the event held."""

    type: str
    user_id: str
    note_id: str
    version: int
    at: datetime
    command_id: str
    channel: str | None
    session_id: str | None
    token: str

    @classmethod
    def of(cls, delivery: Delivery) -> LogEvent:
        e = delivery.event
        return cls(
            type=str(e.__struct_config__.tag),
            user_id=e.user_id,
            note_id=e.note_id,
            version=e.version,
            at=e.at,
            command_id=e.command_id,
            channel=e.origin.channel if e.origin else None,
            session_id=e.origin.session_id if e.origin else None,
            token=delivery.token,
        )

    def public(self) -> dict[str, Any]:
        """What the event stream sends the browser."""
        return {
            "type": self.type,
            "user_id": self.user_id,
            "note_id": self.note_id,
            "version": self.version,
            "at": self.at.isoformat(),
            "command_id": self.command_id,
            "channel": self.channel,
            "token": self.token,
        }


@dataclass(frozen=True, slots=True)
class Pending:
    """A deletion awaiting its second call (a note's, or the whole user's: ``note_id`` ACCOUNT)."""

    note_id: str
    expires_at: datetime
    request_count: int
    requested_at: datetime

    @property
    def lapsed(self) -> bool:
        return self.expires_at <= datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Receipt:
    """A whole user's erasure, as its ``UserForgotten`` event records it."""

    erased: int
    at: datetime
    command_id: str


@dataclass
class UserActivity:
    user_id: str
    events: int = 0
    first_at: datetime | None = None
    last_at: datetime | None = None
    days: dict[date, dict[str, int]] = field(default_factory=dict)
    recent: deque[LogEvent] = field(default_factory=lambda: deque(maxlen=RECENT_KEPT))
    pending: dict[str, Pending] = field(default_factory=dict)
    receipt: Receipt | None = None

    def totals(self) -> dict[str, int]:
        out = {"saves": 0, "updates": 0, "forgets": 0}
        for counts in self.days.values():
            for name, n in counts.items():
                out[name] += n
        return out


@dataclass(frozen=True, slots=True)
class DayCount:
    day: date
    saves: int
    updates: int
    forgets: int

    @property
    def total(self) -> int:
        return self.saves + self.updates + self.forgets


class LogWatch:
    """Follows the log from its start for the console's lifetime; see the module docstring."""

    def __init__(self, subscription: Subscription) -> None:
        self._subscription = subscription
        self._users: dict[str, UserActivity] = {}
        self._task: asyncio.Task[None] | None = None
        # Per partition, the last position applied, for ``reached``.
        self._positions: dict[int, tuple[int, int]] = {}
        self._moved = asyncio.Condition()
        self.recent: deque[LogEvent] = deque(maxlen=RECENT_KEPT)
        self.events_read = 0
        self.error: str | None = None

    @classmethod
    def connect(cls, url: str, *, cluster: bool, partitions: int) -> LogWatch:
        return cls(Subscription.connect(url, None, cluster=cluster, from_start=True, partition_count=partitions))

    async def start(self) -> None:
        await self._subscription.start()
        self._task = asyncio.create_task(self._run(), name="engram-console-log")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._subscription.close()

    async def _run(self) -> None:
        try:
            async for delivery in self._subscription:
                self.apply(delivery.event, LogEvent.of(delivery))
                self._positions[delivery.partition] = channels.parse_entry_id(delivery.position)
                async with self._moved:
                    self._moved.notify_all()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # Pages still work through the bus; only what the log tells (users, chart, pending) stops.
            self.error = e.message if isinstance(e, EngramError) else f"{type(e).__name__}: {e}"
            log.error("the console stopped following the event log: %s", self.error)

    async def reached(self, token: str | None, timeout: float = 3.0) -> bool:
        """Waits (bounded) until the event at ``token`` has been applied: a page drawn right
        after a write then shows what the write did to the pending deletions and the chart."""
        if token is None:
            return True
        try:
            partition, position = channels.parse_token(token)
        except ValueError:
            raise EngramError(ErrorCode.INVALID_PARAMETER, f"after: {token!r} is not a consistency token") from None

        def done() -> bool:
            return self._positions.get(partition, (-1, -1)) >= position or self._task is None or self._task.done()

        async with self._moved:
            try:
                await asyncio.wait_for(self._moved.wait_for(done), timeout)
            except TimeoutError:
                return False
        return True

    def apply(self, event: AnyEvent, shown: LogEvent) -> None:
        self.events_read += 1
        user = self._users.get(event.user_id)
        if user is None:
            user = self._users[event.user_id] = UserActivity(event.user_id)
        user.events += 1
        user.first_at = user.first_at or event.at
        user.last_at = event.at if user.last_at is None else max(user.last_at, event.at)
        user.recent.append(shown)
        self.recent.append(shown)
        # A recall (what a search showed) changes no memory, nor does its erasure.
        series = SERIES.get(shown.type) if not is_recall(event.note_id) else None
        if series is not None:
            day = event.at.astimezone(UTC).date()
            counts = user.days.setdefault(day, {"saves": 0, "updates": 0, "forgets": 0})
            counts[series] += 1
            if len(user.days) > DAYS_KEPT:
                for old in sorted(user.days)[: len(user.days) - DAYS_KEPT]:
                    del user.days[old]
        if isinstance(event, ForgetRequested):
            user.pending[event.note_id] = Pending(event.note_id, event.expires_at, event.request_count, event.at)
        elif isinstance(event, ForgetExpired | NoteForgotten):
            user.pending.pop(event.note_id, None)
        elif isinstance(event, UserForgotten):
            user.pending.clear()
            user.receipt = Receipt(len(event.erased), event.at, event.command_id)

    # reading --------------------------------------------------------------------------------

    def users(self, contains: str = "", offset: int = 0, limit: int = 50) -> tuple[list[UserActivity], int]:
        """Users whose id holds ``contains`` (case aside), most recently active first."""
        needle = contains.casefold()
        found = [u for u in self._users.values() if needle in u.user_id.casefold()]
        found.sort(key=lambda u: (u.last_at or datetime.min.replace(tzinfo=UTC), u.user_id), reverse=True)
        return found[offset : offset + limit], len(found)

    def user(self, user_id: str) -> UserActivity | None:
        return self._users.get(user_id)

    def pending(self, user_id: str) -> list[Pending]:
        user = self._users.get(user_id)
        return sorted(user.pending.values(), key=lambda p: p.expires_at) if user else []

    def chart(self, user_id: str, days: int = 14, today: date | None = None) -> list[DayCount]:
        """Saves, updates and forgets per day (UTC) over the last ``days`` days, oldest first."""
        user = self._users.get(user_id)
        last = today or datetime.now(UTC).date()
        out = []
        for back in range(days - 1, -1, -1):
            day = last - timedelta(days=back)
            counts = user.days.get(day, {}) if user else {}
            out.append(DayCount(day, counts.get("saves", 0), counts.get("updates", 0), counts.get("forgets", 0)))
        return out


async def live_events(url: str, *, cluster: bool, partitions: int, user_id: str | None) -> AsyncIterator[LogEvent]:
    """Events appended from now on (one user's, or everyone's), as they come: each stream of the
    console's page has a subscription of its own that starts at the log's end."""
    subscription = Subscription.connect(
        url, None, cluster=cluster, partition_count=partitions, users=[user_id] if user_id else None
    )
    async with subscription:
        async for delivery in subscription:
            yield LogEvent.of(delivery)
