"""In-memory adapters of the ports, for unit tests. Held to the same contract as the Redis ones."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec

from contracts import channels
from services.adapters.event_store import Appended, Conflict, ContentTaken, LoadedNote, LogEntry, Outcome, decode_event
from services.domain.decider import StreamAppend
from services.domain.note import ABSENT, fold


class InMemoryEventStore:
    def __init__(self, partitions: int = 1) -> None:
        self.partitions = partitions
        self._notes: dict[tuple[str, str], list[tuple[bytes, str]]] = {}
        self._outcomes: dict[tuple[str, str], Outcome] = {}
        self._logs: dict[int, list[tuple[str, bytes]]] = {p: [] for p in range(partitions)}
        self._clock = 0
        self._contents: dict[tuple[str, str], str] = {}
        self._appended = asyncio.Condition()

    def partition_of(self, user_id: str) -> int:
        return channels.partition_of(user_id, self.partitions)

    async def outcome(self, user_id: str, command_id: str) -> Outcome | None:
        return self._outcomes.get((user_id, command_id))

    async def load(self, user_id: str, note_ids: Sequence[str]) -> dict[str, LoadedNote]:
        loaded = {}
        for note_id in note_ids:
            entries = self._notes.get((user_id, note_id), [])
            state = fold(decode_event(raw) for raw, _ in entries) if entries else ABSENT
            loaded[note_id] = LoadedNote(state=state, position=entries[-1][1] if entries else None)
        return loaded

    async def content_holder(self, user_id: str, digest: str) -> str | None:
        return self._contents.get((user_id, digest))

    async def append(
        self, user_id: str, command_id: str, appends: Sequence[StreamAppend], extra: dict[str, Any] | None = None
    ) -> Appended | Conflict | ContentTaken:
        # No await before the writes: atomic with respect to other coroutines.
        first = self._outcomes.get((user_id, command_id))
        if first is not None:
            return Appended(outcome=first, replayed=True)
        for item in appends:
            current = len(self._notes.get((user_id, item.note_id), []))
            if current != item.expected_version:
                return Conflict(note_id=item.note_id, actual_version=current)
            for digest in item.claims:
                holder = self._contents.get((user_id, digest))
                if holder is not None and holder != item.note_id:
                    return ContentTaken(note_id=item.note_id, holder=holder)
        if not any(item.events for item in appends):
            raise ValueError("an append must carry at least one event")
        log = self._logs[self.partition_of(user_id)]
        position = ""
        notes = []
        for item in appends:
            for digest in item.releases:
                if self._contents.get((user_id, digest)) == item.note_id:
                    del self._contents[(user_id, digest)]
            for digest in item.claims:
                self._contents[(user_id, digest)] = item.note_id
            stream = self._notes.setdefault((user_id, item.note_id), [])
            for event in item.events:
                self._clock += 1
                position = f"{self._clock}-0"
                raw = msgspec.json.encode(event)
                log.append((position, raw))
                stream.append((raw, position))
            if item.events:
                notes.append((item.note_id, len(stream)))
        outcome = Outcome(
            position=position, notes=notes, extra=msgspec.json.decode(msgspec.json.encode(extra or {"duplicates": []}))
        )
        self._outcomes[(user_id, command_id)] = outcome
        return Appended(outcome=outcome, replayed=False)

    async def read_log(self, partition: int, after: str, count: int, block_ms: int | None = None) -> list[LogEntry]:
        done = channels.parse_entry_id(after)
        entries = [(p, raw) for p, raw in self._logs[partition] if channels.parse_entry_id(p) > done][:count]
        return [LogEntry(position=p, event=decode_event(raw)) for p, raw in entries]

    async def log_head(self, partition: int) -> tuple[str | None, int]:
        log = self._logs[partition]
        return (log[-1][0] if log else None), len(log)
