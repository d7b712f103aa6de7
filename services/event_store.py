"""``RedisEventStore``: every note has its own stream, every partition one log; an append is a
single Lua script (one round trip, atomic) that checks expected versions, refuses a duplicate
``command_id`` by returning the first outcome, and writes the note streams and the log."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from redis.asyncio import Redis

from contracts import channels
from contracts.events import AnyEvent
from services.domain.decider import StreamAppend
from services.domain.note import ABSENT, NoteState, fold

_APPEND = """
local outcome = redis.call('GET', KEYS[1])
if outcome then return {'duplicate', outcome} end
local n = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local user = ARGV[3]
local extra = ARGV[4]
local plan = {}
local a = 5
-- Check every stream and every content claim before writing anything: all or nothing.
for i = 1, n do
  local note_id, expected, k = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local nc, nr = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local current = tonumber(redis.call('GET', KEYS[2 + 2 * i]) or '0')
  if current ~= expected then return {'conflict', note_id, tostring(current)} end
  local claims, releases = {}, {}
  for c = 1, nc do
    local key = KEYS[tonumber(ARGV[a + 4 + c])]
    local holder = redis.call('GET', key)
    if holder and holder ~= note_id then return {'taken', note_id, holder} end
    claims[c] = key
  end
  for r = 1, nr do releases[r] = KEYS[tonumber(ARGV[a + 4 + nc + r])] end
  local first = a + 5 + nc + nr
  plan[i] = {note_id, first, k, current, claims, releases}
  a = first + k
end
local position = false
local notes = {}
for i = 1, n do
  local note_id, first, k, current = plan[i][1], plan[i][2], plan[i][3], plan[i][4]
  for _, key in ipairs(plan[i][6]) do
    if redis.call('GET', key) == note_id then redis.call('DEL', key) end
  end
  for _, key in ipairs(plan[i][5]) do redis.call('SET', key, note_id) end
  if k > 0 then
    for j = 0, k - 1 do
      position = redis.call('XADD', KEYS[2], '*', 'e', ARGV[first + j], 'u', user)
      redis.call('XADD', KEYS[1 + 2 * i], '*', 'e', ARGV[first + j], 'l', position)
    end
    redis.call('SET', KEYS[2 + 2 * i], current + k)
    notes[#notes + 1] = {note_id, current + k}
  end
end
if not position then return {'empty'} end
outcome = cjson.encode({position = position, notes = notes, extra = cjson.decode(extra)})
if ttl > 0 then
  redis.call('SET', KEYS[1], outcome, 'EX', ttl)
else
  redis.call('SET', KEYS[1], outcome)
end
return {'appended', outcome}
"""


class Outcome(msgspec.Struct, frozen=True):
    """What an accepted command wrote: the log position of its last event and the versions the
    notes it changed are at now (``[note_id, version]`` pairs). ``extra`` is what the reply
    needs besides (a batch's duplicates), stored so a retry gets the same reply."""

    position: str
    notes: list[tuple[str, int]]
    extra: dict[str, Any] = msgspec.field(default_factory=dict)


class Appended(msgspec.Struct, frozen=True):
    outcome: Outcome
    replayed: bool


class Conflict(msgspec.Struct, frozen=True):
    note_id: str
    actual_version: int


class ContentTaken(msgspec.Struct, frozen=True):
    """The content an append claims is already held by another active note of the user."""

    note_id: str
    holder: str


class LoadedNote(msgspec.Struct, frozen=True):
    state: NoteState
    # Log position of the note's latest event: the token for a no-op reply.
    position: str | None


class LogEntry(msgspec.Struct, frozen=True):
    position: str
    event: AnyEvent


_event_decoder = msgspec.json.Decoder(AnyEvent)
_outcome_decoder = msgspec.json.Decoder(Outcome)


def decode_event(raw: bytes) -> AnyEvent:
    return _event_decoder.decode(raw)


class RedisEventStore:
    def __init__(self, redis: Redis, partitions: int, idempotency_ttl_seconds: int) -> None:
        self._redis = redis
        self.partitions = partitions
        self._ttl = idempotency_ttl_seconds
        self._append = redis.register_script(_APPEND)

    def partition_of(self, user_id: str) -> int:
        return channels.partition_of(user_id, self.partitions)

    async def content_holder(self, user_id: str, digest: str) -> str | None:
        raw = await self._redis.get(channels.content_key(self.partition_of(user_id), user_id, digest))
        return raw.decode() if raw is not None else None

    async def outcome(self, user_id: str, command_id: str) -> Outcome | None:
        p = self.partition_of(user_id)
        raw = await self._redis.get(channels.command_outcome(p, user_id, command_id))
        return None if raw is None else _outcome_decoder.decode(raw)

    async def load(self, user_id: str, note_ids: Sequence[str]) -> dict[str, LoadedNote]:
        p = self.partition_of(user_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            for note_id in note_ids:
                pipe.xrange(channels.note_stream(p, user_id, note_id))
            results = await pipe.execute()
        loaded = {}
        for note_id, entries in zip(note_ids, results, strict=True):
            if not entries:
                loaded[note_id] = LoadedNote(state=ABSENT, position=None)
                continue
            state = fold(decode_event(fields[b"e"]) for _, fields in entries)
            loaded[note_id] = LoadedNote(state=state, position=entries[-1][1][b"l"].decode())
        return loaded

    async def append(
        self, user_id: str, command_id: str, appends: Sequence[StreamAppend], extra: dict[str, Any] | None = None
    ) -> Appended | Conflict | ContentTaken:
        p = self.partition_of(user_id)
        keys = [channels.command_outcome(p, user_id, command_id), channels.event_log(p)]
        for item in appends:
            keys += [channels.note_stream(p, user_id, item.note_id), channels.note_version(p, user_id, item.note_id)]
        args: list[Any] = [len(appends), self._ttl, user_id, msgspec.json.encode(extra or {"duplicates": []})]
        for item in appends:
            args += [item.note_id, item.expected_version, len(item.events), len(item.claims), len(item.releases)]
            # Content keys go into KEYS too (a cluster must see every key a script touches).
            for content_key in (*item.claims, *item.releases):
                keys.append(channels.content_key(p, user_id, content_key))
                args.append(len(keys))
            args += [msgspec.json.encode(event) for event in item.events]
        result = await self._append(keys=keys, args=args)
        status = result[0].decode()
        if status == "conflict":
            return Conflict(note_id=result[1].decode(), actual_version=int(result[2]))
        if status == "taken":
            return ContentTaken(note_id=result[1].decode(), holder=result[2].decode())
        if status == "empty":
            raise ValueError("an append must carry at least one event")
        return Appended(outcome=_outcome_decoder.decode(result[1]), replayed=status == "duplicate")

    async def read_log(self, partition: int, after: str, count: int, block_ms: int | None = None) -> list[LogEntry]:
        """Events of one partition after position ``after`` ("0" for the start), in log order."""
        response = await self._redis.xread({channels.event_log(partition): after}, count=count, block=block_ms)
        if not response:
            return []
        ((_, entries),) = response
        return [LogEntry(position=entry_id.decode(), event=decode_event(fields[b"e"])) for entry_id, fields in entries]

    async def log_head(self, partition: int) -> tuple[str | None, int]:
        """The last position of a partition's log (None when empty) and the log's length."""
        key = channels.event_log(partition)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xrevrange(key, count=1)
            pipe.xlen(key)
            last, length = await pipe.execute()
        return (last[0][0].decode() if last else None), int(length)
