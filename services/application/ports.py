"""The ports the application services depend on. ``RedisEventStore`` is the production adapter;
``tests/fakes.py`` has an in-memory one; ``tests/integration/test_event_store_contract.py``
holds both to the same contract."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from services.adapters.event_store import Appended, Conflict, ContentTaken, LoadedNote, LogEntry, Outcome
from services.domain.decider import StreamAppend


class EventStore(Protocol):
    partitions: int

    def partition_of(self, user_id: str) -> int: ...

    async def outcome(self, user_id: str, command_id: str) -> Outcome | None:
        """The first outcome of an accepted command, or None."""

    async def load(self, user_id: str, note_ids: Sequence[str]) -> dict[str, LoadedNote]:
        """Each note's folded state and the log position of its latest event."""

    async def append(
        self, user_id: str, command_id: str, appends: Sequence[StreamAppend], extra: dict[str, Any] | None = None
    ) -> Appended | Conflict | ContentTaken:
        """Atomically: return the first outcome of a seen command id; refuse if any note is not at
        its expected version or claims a content another note holds; else release and claim the
        content keys, write every event, and store and return the outcome (with ``extra``)."""

    async def content_holder(self, user_id: str, digest: str) -> str | None:
        """The active note holding a content digest, if any."""

    async def read_log(self, partition: int, after: str, count: int, block_ms: int | None = None) -> list[LogEntry]:
        """Events of one partition after a position, in log order."""

    async def log_head(self, partition: int) -> tuple[str | None, int]:
        """The last position of a partition's log and its length."""
