"""``RedisEventStore``: every note has its own stream, every partition one log; an append is a
single Lua script (one round trip, atomic) that checks expected versions, refuses a duplicate
``command_id`` by returning the first outcome, and writes the note streams and the log."""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec
from redis.asyncio import Redis

from engram_ledger.contracts import channels
from engram_ledger.contracts.events import AnyEvent, MemoryRecalled, is_control_stream
from engram_ledger.services.adapters.crypto import (
    REQUEST_FINGERPRINT_LABEL,
    MasterKey,
    NoteCipher,
    is_sealed,
    keyed_hash,
    needs_key,
    recall_key,
    recall_key_notes,
    shredded,
)
from engram_ledger.services.application.ports import (
    Appended,
    Conflict,
    ContentTaken,
    LoadedNote,
    LogEntry,
    Outcome,
    OutcomeDetail,
)
from engram_ledger.services.domain.appends import StreamAppend
from engram_ledger.services.domain.note import ABSENT, fold

_APPEND = """
local outcome = redis.call('GET', KEYS[1])
if outcome then return {'duplicate', outcome} end
local n = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local user = ARGV[3]
local extra = ARGV[4]
local plan = {}
local a = 5
-- Per note: KEYS[3i] its stream, KEYS[3i+1] its version, KEYS[3i+2] its wrapped data key.
-- Check every stream and every content claim before writing anything: all or nothing.
for i = 1, n do
  local note_id, expected, k = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local nc, nr = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local new_key, shred, sealed_with = ARGV[a + 5], ARGV[a + 6], ARGV[a + 7]
  local current = tonumber(redis.call('GET', KEYS[3 * i + 1]) or '0')
  if current ~= expected then return {'conflict', note_id, tostring(current)} end
  -- The events were sealed under the key as loaded: gone (forgotten) or rewrapped since, decide again.
  if sealed_with ~= '' and redis.call('GET', KEYS[3 * i + 2]) ~= sealed_with then
    return {'conflict', note_id, '-1'}
  end
  local claims, releases = {}, {}
  for c = 1, nc do
    local key = KEYS[tonumber(ARGV[a + 7 + c])]
    local holder = redis.call('GET', key)
    if holder and holder ~= note_id then return {'taken', note_id, holder} end
    claims[c] = key
  end
  for r = 1, nr do releases[r] = KEYS[tonumber(ARGV[a + 7 + nc + r])] end
  local first = a + 8 + nc + nr
  plan[i] = {note_id, first, k, current, claims, releases, new_key, shred}
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
  if plan[i][7] ~= '' then redis.call('SET', KEYS[3 * i + 2], plan[i][7]) end
  if plan[i][8] == '1' then redis.call('DEL', KEYS[3 * i + 2]) end
  if k > 0 then
    for j = 0, k - 1 do
      position = redis.call('XADD', KEYS[2], '*', 'e', ARGV[first + j], 'u', user)
      redis.call('XADD', KEYS[3 * i], '*', 'e', ARGV[first + j], 'l', position)
    end
    redis.call('SET', KEYS[3 * i + 1], current + k)
    notes[#notes + 1] = {note_id, current + k}
  end
end
if not position then return {'empty'} end
-- The detail is spliced in as given: a cjson round trip would turn its empty lists into {}.
outcome = '{"position":' .. cjson.encode(position) .. ',"notes":' .. cjson.encode(notes) .. ',"extra":' .. extra .. '}'
if ttl > 0 then
  redis.call('SET', KEYS[1], outcome, 'EX', ttl)
else
  redis.call('SET', KEYS[1], outcome)
end
return {'appended', outcome}
"""

# Replaces an outcome only if it is still the one read (an outcome is written once, but a
# rewrite must never resurrect one that expired or was replaced meanwhile), keeping its expiry.
_REPLACE_OUTCOME = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL') end
return 0
"""

_event_decoder = msgspec.json.Decoder(AnyEvent)


def decode_outcome(raw: bytes) -> Outcome:
    """An outcome as stored. Those written before the detail was spliced in verbatim went through
    cjson, which writes an empty list as ``{}``: read those as the empty lists they were."""
    try:
        return msgspec.json.decode(raw, type=Outcome)
    except msgspec.ValidationError:
        stored = msgspec.json.decode(raw)
        detail = stored.get("extra") or {}
        for field in ("duplicates", "forget"):
            if detail.get(field) == {}:
                detail[field] = []
        if isinstance(detail.get("user"), dict) and detail["user"].get("erased") == {}:
            detail["user"]["erased"] = []
        return msgspec.convert(stored, Outcome)


def decode_event(raw: bytes) -> AnyEvent:
    return _event_decoder.decode(raw)


# How many notes' data keys the store keeps between a load and the append that follows it, and
# for how long: an append follows its load within milliseconds, and an unwrapped key of a note
# forgotten by another worker is not to stay in this one's memory.
LOADED_KEYS = 1024
LOADED_KEY_SECONDS = 2.0


class _LoadedKeys:
    """The data keys of the notes loaded last, by note: wrapped as read, and unwrapped. An append
    seals with the key its load read instead of reading it again, and its script checks that
    the wrapped key is still the one stored, so a key kept here seals nothing once a forget has
    deleted it (and a forget made here drops it at once). Each is kept for seconds only."""

    def __init__(self, size: int = LOADED_KEYS, seconds: float = LOADED_KEY_SECONDS) -> None:
        self._size = size
        self._seconds = seconds
        self._keys: OrderedDict[tuple[str, str], tuple[float, bytes, NoteCipher]] = OrderedDict()

    def keep(self, user_id: str, note_id: str, wrapped: bytes, cipher: NoteCipher) -> None:
        now = time.monotonic()
        self._keys[user_id, note_id] = (now + self._seconds, wrapped, cipher)
        self._keys.move_to_end((user_id, note_id))
        # Oldest first: drop the expired, and the least recent beyond the bound.
        while self._keys and (len(self._keys) > self._size or next(iter(self._keys.values()))[0] <= now):
            self._keys.popitem(last=False)

    def get(self, user_id: str, note_id: str) -> tuple[bytes, NoteCipher] | None:
        held = self._keys.get((user_id, note_id))
        if held is None or held[0] <= time.monotonic():
            return None
        return held[1], held[2]

    def drop(self, user_id: str, note_id: str) -> None:
        self._keys.pop((user_id, note_id), None)


def _open(event: AnyEvent, cipher: NoteCipher | None) -> AnyEvent:
    if not is_sealed(event):
        return event
    if isinstance(event, MemoryRecalled):
        # Its own key alone does not open it (``recall_key``): read with ``recall_queries``.
        # Empty, not None: it was asked with a query.
        return msgspec.structs.replace(event, query="")
    return cipher.open_event(event) if cipher is not None else shredded(event)


class _Unsealed(NoteCipher):
    """A recall whose query's text is not kept (it showed nothing, or a note it names was
    forgotten meanwhile): empty, so it still says it was asked."""

    def __init__(self) -> None:
        pass

    def seal_event(self, event: AnyEvent) -> AnyEvent:
        if isinstance(event, MemoryRecalled) and event.query:
            return msgspec.structs.replace(event, query="")
        return event


class RedisEventStore:
    """Content fields are sealed under each note's data key on the way in and opened on the way
    out (``engram_ledger.services.adapters.crypto``): callers see plaintext, Redis holds ciphertext. A forgotten note's
    events read with their content empty."""

    def __init__(self, redis: Redis, partitions: int, idempotency_ttl_seconds: int, master: MasterKey) -> None:
        self._master = master
        self._redis = redis
        self.partitions = partitions
        self._ttl = idempotency_ttl_seconds
        self._append = redis.register_script(_APPEND)
        self._replace_outcome = redis.register_script(_REPLACE_OUTCOME)
        self._loaded_keys = _LoadedKeys()
        self._fingerprint_key = functools.cache(functools.partial(master.derive, REQUEST_FINGERPRINT_LABEL))

    def partition_of(self, user_id: str) -> int:
        return channels.partition_of(user_id, self.partitions)

    async def content_holder(self, user_id: str, digest: str) -> str | None:
        raw = await self._redis.get(channels.content_key(self.partition_of(user_id), user_id, digest))
        return raw.decode() if raw is not None else None

    async def note_ids(self, user_id: str) -> list[str]:
        """Every note and message id the user has a stream for (account and session streams aside)."""
        prefix = channels.note_version(self.partition_of(user_id), user_id, "")
        keys = self._redis.scan_iter(match=channels.matching(prefix), count=1000)
        ids = [channels.unpart(key.decode()[len(prefix) :]) async for key in keys]
        return sorted(i for i in ids if not is_control_stream(i))

    async def outcome(self, user_id: str, command_id: str) -> Outcome | None:
        p = self.partition_of(user_id)
        raw = await self._redis.get(channels.command_outcome(p, user_id, command_id))
        return None if raw is None else decode_outcome(raw)

    def fingerprint(self, user_id: str, request: bytes) -> str:
        return keyed_hash(self._fingerprint_key(), user_id, request.decode())

    async def drop_fingerprints(self, user_id: str, note_ids: Sequence[str]) -> None:
        """The commands are found by the ids their events carry (readable without the note's key)."""
        p = self.partition_of(user_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            for note_id in note_ids:
                pipe.xrange(channels.note_stream(p, user_id, note_id))
            streams = await pipe.execute()
        command_ids = dict.fromkeys(
            decode_event(fields[b"e"]).command_id for entries in streams for _, fields in entries
        )
        for command_id in command_ids:
            key = channels.command_outcome(p, user_id, command_id)
            raw = await self._redis.get(key)
            if raw is None:
                continue
            stored = msgspec.json.decode(raw)
            if not isinstance(stored.get("extra"), dict) or not stored["extra"].pop("request", None):
                continue
            await self._replace_outcome(keys=[key], args=[raw, msgspec.json.encode(stored)])

    async def load(self, user_id: str, note_ids: Sequence[str]) -> dict[str, LoadedNote]:
        p = self.partition_of(user_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            for note_id in note_ids:
                pipe.xrange(channels.note_stream(p, user_id, note_id))
                pipe.get(channels.data_key(p, user_id, note_id))
            results = await pipe.execute()
        loaded = {}
        for i, note_id in enumerate(note_ids):
            entries, wrapped = results[2 * i], results[2 * i + 1]
            if not entries:
                loaded[note_id] = LoadedNote(state=ABSENT, position=None)
                continue
            cipher = self._cipher(wrapped, user_id, note_id)
            if cipher is not None:
                self._loaded_keys.keep(user_id, note_id, wrapped, cipher)
            else:  # forgotten: its key is gone from Redis, and from here
                self._loaded_keys.drop(user_id, note_id)
            state = fold(_open(decode_event(fields[b"e"]), cipher) for _, fields in entries)
            loaded[note_id] = LoadedNote(state=state, position=entries[-1][1][b"l"].decode())
        return loaded

    async def append(
        self,
        user_id: str,
        command_id: str,
        appends: Sequence[StreamAppend],
        detail: OutcomeDetail | None = None,
    ) -> Appended | Conflict | ContentTaken:
        p = self.partition_of(user_id)
        keys = [channels.command_outcome(p, user_id, command_id), channels.event_log(p)]
        for item in appends:
            keys += [
                channels.note_stream(p, user_id, item.note_id),
                channels.note_version(p, user_id, item.note_id),
                channels.data_key(p, user_id, item.note_id),
            ]
        sealing = await self._ciphers_for(p, user_id, appends)
        if isinstance(sealing, Conflict):
            return sealing
        args: list[Any] = [len(appends), self._ttl, user_id, msgspec.json.encode(detail or OutcomeDetail())]
        for item in appends:
            cipher, new_key, sealed_with = sealing.get(item.note_id, (None, b"", b""))
            args += [item.note_id, item.expected_version, len(item.events), len(item.claims), len(item.releases)]
            args += [new_key, "1" if item.shred else "0", sealed_with]
            if item.shred:
                self._loaded_keys.drop(user_id, item.note_id)
            # Content keys go into KEYS too (a cluster must see every key a script touches).
            for content_key in (*item.claims, *item.releases):
                keys.append(channels.content_key(p, user_id, content_key))
                args.append(len(keys))
            args += [msgspec.json.encode(cipher.seal_event(e) if cipher else e) for e in item.events]
        result = await self._append(keys=keys, args=args)
        status = result[0].decode()
        if status == "conflict":
            return Conflict(note_id=result[1].decode(), actual_version=int(result[2]))
        if status == "taken":
            return ContentTaken(note_id=result[1].decode(), holder=result[2].decode())
        if status == "empty":
            raise ValueError("an append must carry at least one event")
        return Appended(outcome=decode_outcome(result[1]), replayed=status == "duplicate")

    async def _ciphers_for(
        self, partition: int, user_id: str, appends: Sequence[StreamAppend]
    ) -> dict[str, tuple[NoteCipher, bytes, bytes]] | Conflict:
        """A cipher for each note whose events carry content, with the wrapped key to store (a
        new note's) and the wrapped key it was sealed with (an existing note's, which the script
        checks is still there). A new note gets a fresh data key (stored by the append itself,
        wrapped), an existing one its key as its load read it (read again only if the load was
        not this store's). A key that is gone means the note was forgotten since it was loaded:
        a conflict, so it is decided again."""
        sealing: dict[str, tuple[NoteCipher, bytes, bytes]] = {}
        unread: list[str] = []
        for item in appends:
            if not any(needs_key(e) for e in item.events):
                continue
            recalled = next((e for e in item.events if isinstance(e, MemoryRecalled)), None)
            if recalled is not None and item.expected_version == 0:
                data_key = self._master.new_data_key()
                wrapped = self._master.wrap(data_key, f"{user_id}/{item.note_id}")
                named = await self._data_keys(partition, user_id, recall_key_notes(recalled))
                # A note forgotten since it was shown: the query is not kept (its key is gone).
                key = recall_key(data_key, named) if named is not None and recalled.query else None
                sealing[item.note_id] = (NoteCipher(key) if key else _Unsealed(), wrapped, b"")
                continue
            if item.expected_version == 0:
                data_key = self._master.new_data_key()
                wrapped = self._master.wrap(data_key, f"{user_id}/{item.note_id}")
                sealing[item.note_id] = (NoteCipher(data_key), wrapped, b"")
            elif (held := self._loaded_keys.get(user_id, item.note_id)) is not None:
                sealing[item.note_id] = (held[1], b"", held[0])
            else:
                unread.append(item.note_id)
        if unread:
            stored = await self._redis.mget([channels.data_key(partition, user_id, n) for n in unread])
            for note_id, raw in zip(unread, stored, strict=True):
                cipher = self._cipher(raw, user_id, note_id)
                if cipher is None or raw is None:
                    return Conflict(note_id=note_id, actual_version=-1)
                sealing[note_id] = (cipher, b"", raw)
        return sealing

    async def _data_keys(self, partition: int, user_id: str, note_ids: Sequence[str]) -> list[bytes] | None:
        """The notes' data keys, in order; None if one is gone (forgotten)."""
        if not note_ids:
            return []
        stored = await self._redis.mget([channels.data_key(partition, user_id, n) for n in note_ids])
        if any(raw is None for raw in stored):
            return None
        return [self._master.unwrap(raw, f"{user_id}/{n}") for n, raw in zip(note_ids, stored, strict=True)]

    async def recall_queries(self, user_id: str, recall_ids: Sequence[str]) -> dict[str, str | None]:
        """Each recall's query, opened with its own data key and those of the notes it named;
        None where one of them is gone (a note it showed, or the user, was forgotten)."""
        p = self.partition_of(user_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            for recall_id in recall_ids:
                pipe.xrange(channels.note_stream(p, user_id, recall_id), count=1)
                pipe.get(channels.data_key(p, user_id, recall_id))
            raws = await pipe.execute()
        found: dict[str, str | None] = {}
        for i, recall_id in enumerate(recall_ids):
            entries, own = raws[2 * i], raws[2 * i + 1]
            found[recall_id] = None
            if not entries or own is None:
                continue
            event = decode_event(entries[0][1][b"e"])
            if not isinstance(event, MemoryRecalled) or not event.query:
                continue
            named = await self._data_keys(p, user_id, recall_key_notes(event))
            if named is None:
                continue
            own_key = self._master.unwrap(own, f"{user_id}/{recall_id}")
            opened = NoteCipher(recall_key(own_key, named)).open_event(event)
            found[recall_id] = opened.query if isinstance(opened, MemoryRecalled) else None
        return found

    def _cipher(self, wrapped: bytes | None, user_id: str, note_id: str) -> NoteCipher | None:
        if wrapped is None:
            return None
        return NoteCipher(self._master.unwrap(wrapped, f"{user_id}/{note_id}"))

    async def read_log(self, partition: int, after: str, count: int, block_ms: int | None = None) -> list[LogEntry]:
        """Events of one partition after position ``after`` ("0" for the start), in log order,
        content opened (or empty, for notes forgotten since)."""
        response = await self._redis.xread({channels.event_log(partition): after}, count=count, block=block_ms)
        if not response:
            return []
        ((_, entries),) = response
        events = [(entry_id.decode(), decode_event(fields[b"e"])) for entry_id, fields in entries]
        notes = list(dict.fromkeys((e.user_id, e.note_id) for _, e in events if is_sealed(e)))
        ciphers: dict[tuple[str, str], NoteCipher | None] = {}
        if notes:
            wrapped = await self._redis.mget([channels.data_key(partition, u, n) for u, n in notes])
            ciphers = {note: self._cipher(raw, *note) for note, raw in zip(notes, wrapped, strict=True)}
        return [
            LogEntry(position=position, event=_open(event, ciphers.get((event.user_id, event.note_id))))
            for position, event in events
        ]

    async def log_head(self, partition: int) -> tuple[str | None, int]:
        """The last position of a partition's log (None when empty) and the log's length."""
        key = channels.event_log(partition)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xrevrange(key, count=1)
            pipe.xlen(key)
            last, length = await pipe.execute()
        return (last[0][0].decode() if last else None), int(length)
