"""Pending-entry reclaimer for the request streams (commands, queries).

FastStream acks after a handler returns and leaves an entry pending when it raises or when its
worker dies, and it neither redelivers nor counts deliveries. This sweeper does both: an entry
pending longer than ``idle_ms`` is re-queued as a new entry with its attempt count, and after
``max_deliveries`` attempts it goes to the dead-letter stream instead, which keeps the newest
``DEAD_LETTERS_KEPT``. A dead letter says what failed (the request's type, command id, user,
correlation id and size) without its body: a body can hold a user's text, and no forget reaches
a dead letter. Both moves are one Lua script each (claim, copy, ack), so two sweepers
never move the same entry twice.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from faststream.redis.message import bDATA_KEY
from redis.asyncio import Redis

from engram_ledger.contracts import channels
from engram_ledger.contracts.limits import REQUEST_STREAM_BYTES
from engram_ledger.services.bus.envelope import EnvelopeFormat
from engram_ledger.services.common.periodic import every

log = logging.getLogger("engram.reclaimer")

ATTEMPT_FIELD = "engram-attempt"
# The dead letters a stream keeps, the newest: enough to see what fails and how, and a bound on
# what requests made to fail can pile up. Letters are capped by bytes too, as the request streams
# are (REQUEST_STREAM_BYTES over a letter's size), and trimmed exactly, not by whole nodes: they
# are rare, so the exact trim costs nothing.
DEAD_LETTERS_KEPT = 1_000

_MOVE = """
local stream, dead = KEYS[1], KEYS[2]
local group, id, consumer, idle, max = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
-- Taking ownership with a min-idle time fails if another sweeper (or the worker) just touched it.
local claimed = redis.call('XCLAIM', stream, group, consumer, idle, id, 'JUSTID')
if #claimed == 0 then return 'busy' end
local entry = redis.call('XRANGE', stream, id, id)
if #entry == 0 then
  redis.call('XACK', stream, group, id)
  return 'gone'
end
local fields, copy, attempt = entry[1][2], {}, 1
for i = 1, #fields, 2 do
  if fields[i] == ARGV[6] then attempt = tonumber(fields[i + 1]) else
    copy[#copy + 1] = fields[i]; copy[#copy + 1] = fields[i + 1] end
end
if attempt >= max then
  -- The letter: what the request was (ARGV[9] onwards, read off it by the sweeper), not its body.
  local letter = {ARGV[6], tostring(attempt), 'engram-original-id', id}
  for i = 9, #ARGV do letter[#letter + 1] = ARGV[i] end
  -- The newest ARGV[7], and as on the request streams no more than ARGV[8] bytes' worth of
  -- letters this size or larger.
  local size = 0
  for i = 1, #letter do size = size + #letter[i] end
  local keep = math.max(1, math.min(tonumber(ARGV[7]), math.floor(tonumber(ARGV[8]) / size)))
  redis.call('XADD', dead, 'MAXLEN', keep, '*', unpack(letter))
  redis.call('XACK', stream, group, id)
  redis.call('XDEL', stream, id)
  return 'dead'
end
copy[#copy + 1] = ARGV[6]; copy[#copy + 1] = tostring(attempt + 1)
redis.call('XADD', stream, '*', unpack(copy))
redis.call('XACK', stream, group, id)
-- The copy carries the body on; the original (a caller's text) is not left to the length cap.
redis.call('XDEL', stream, id)
return 'requeued'
"""


# What a dead letter names of its request, each cut to a length an operator can read.
LETTER_FIELDS = ("type", "command_id", "user_id")
LETTER_VALUE_CHARS = 200


def describe(data: bytes) -> dict[str, str]:
    """What a request entry's ``__data__`` was, without its body: the fields that name it (those
    of ``LETTER_FIELDS`` it has as strings), its correlation id and its size in bytes."""
    letter = {"bytes": str(len(data))}
    body, headers = EnvelopeFormat.parse(data)
    correlation_id = headers.get("correlation_id")
    if isinstance(correlation_id, str):
        letter["correlation_id"] = correlation_id[:LETTER_VALUE_CHARS]
    try:
        request = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError, ValueError):
        return letter
    if isinstance(request, dict):
        for name in LETTER_FIELDS:
            if isinstance(value := request.get(name), str):
                letter[name] = value[:LETTER_VALUE_CHARS]
    return letter


class PendingReclaimer:
    def __init__(
        self,
        redis: Redis,
        stream: str,
        group: str,
        idle_ms: int,
        max_deliveries: int,
        consumer: str,
        dead_letters_kept: int = DEAD_LETTERS_KEPT,
        dead_letter_bytes: int = REQUEST_STREAM_BYTES,
        max_entries: int | None = None,
    ) -> None:
        """``max_entries``: the most entries the stream is let hold. Clients add requests with a
        cap, but one writing to Redis itself may not: each sweep trims the stream to it."""
        self._redis = redis
        self._max_entries = max_entries
        self._dead_kept = dead_letters_kept
        self._dead_bytes = dead_letter_bytes
        self.stream = stream
        self.dead_letters = channels.dead_letter_stream(stream)
        self._group = group
        self._idle_ms = idle_ms
        self._max = max_deliveries
        self._consumer = consumer
        self._move = redis.register_script(_MOVE)

    async def sweep(self) -> dict[str, int]:
        """One pass over the entries pending longer than the idle time. Returns counts by outcome."""
        counts: dict[str, int] = {}
        # The oldest go first: a caller whose request is trimmed gets no reply and sends it again
        # (a command under its id, applied once).
        if self._max_entries is not None and (
            trimmed := await self._redis.xtrim(self.stream, maxlen=self._max_entries, approximate=True)
        ):
            counts["trimmed"] = trimmed
        try:
            pending = await self._redis.xpending_range(
                self.stream, self._group, min="-", max="+", count=100, idle=self._idle_ms
            )
        except Exception as e:  # the group does not exist yet
            if "NOGROUP" in str(e):
                return counts
            raise
        for item in pending:
            entry_id = item["message_id"]
            entry = await self._redis.xrange(self.stream, entry_id, entry_id)
            letter = describe(entry[0][1].get(bDATA_KEY, b"")) if entry else {}
            result = await self._move(
                keys=[self.stream, self.dead_letters],
                args=[
                    self._group,
                    entry_id,
                    self._consumer,
                    self._idle_ms,
                    self._max,
                    ATTEMPT_FIELD,
                    self._dead_kept,
                    self._dead_bytes,
                    *(part for pair in letter.items() for part in pair),
                ],
            )
            outcome = result.decode() if isinstance(result, bytes) else str(result)
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome == "dead":
                log.error(
                    "%s entry %s failed %d deliveries: moved to %s", self.stream, entry_id, self._max, self.dead_letters
                )
        return counts

    async def run(self, stop: asyncio.Event, interval: float | None = None) -> None:
        interval = interval if interval is not None else max(self._idle_ms / 4000, 0.05)
        await every(interval, stop, self.sweep, f"reclaiming {self.stream}", log)
