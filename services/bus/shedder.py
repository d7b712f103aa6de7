"""``BacklogShedder``: a flood written straight onto a request stream is refused before it is read.

Clients take a place per request (``admission.py``), but a caller that writes XADDs itself takes
none, and a stream is read in order: thousands of one caller's requests in front meant everyone
else's waited while the worker read them one by one (about a millisecond each, refused or not).
So when a stream's unread backlog passes ``backlog`` entries, the shedder reads it ahead of the
subscriber (``XRANGE`` past the group's last delivered entry), keeps each user's first
``per_user`` requests, and answers the rest ``RATE_LIMITED`` at once, in the format each was sent
in. Their entries are deleted by a script that first reads the group's position, so an entry the
subscriber has meanwhile taken is never refused as well as answered. A request whose user cannot
be read is left for the subscriber, which answers it with the precise error.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass

import msgspec
from faststream.redis.message import bDATA_KEY
from faststream.redis.parser.binary import BinaryMessageFormatV1
from redis.asyncio import Redis

from engram_ledger.contracts.errors import ErrorCode, ErrorReply
from engram_ledger.services.bus.envelope import EnvelopeFormat, JSONEnvelopeFormat, is_binary
from engram_ledger.services.common.periodic import every

log = logging.getLogger("engram.shedder")

# How many unread entries make a backlog worth reading ahead, and how many are read at a time.
BACKLOG = 256
READ_AHEAD = 5_000
RETRY_AFTER_MS = 1_000

_DELETE_UNREAD = """
local last = '0-0'
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local fields = {}
  for i = 1, #group, 2 do fields[group[i]] = group[i + 1] end
  if fields['name'] == ARGV[1] then last = fields['last-delivered-id'] end
end
local function after(a, b)
  local ams, aseq = string.match(a, '(%d+)-(%d+)')
  local bms, bseq = string.match(b, '(%d+)-(%d+)')
  ams, bms = tonumber(ams), tonumber(bms)
  return ams > bms or (ams == bms and tonumber(aseq) > tonumber(bseq))
end
local deleted = {}
for i = 2, #ARGV do
  if after(ARGV[i], last) then
    deleted[#deleted + 1] = ARGV[i]
    redis.call('XDEL', KEYS[1], ARGV[i])
  end
end
return deleted
"""


class _Who(msgspec.Struct):
    user_id: str | None = None


_who = msgspec.json.Decoder(_Who)
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class _Request:
    entry_id: bytes
    user_id: str
    reply_to: str | None
    correlation_id: str
    binary: bool


def _read(entry_id: bytes, data: bytes) -> _Request | None:
    try:
        body, headers = EnvelopeFormat.parse(data)
        user_id = _who.decode(body).user_id
    except (msgspec.DecodeError, ValueError, RecursionError):
        return None
    if not isinstance(user_id, str):
        return None
    reply_to = headers.get("reply_to")
    correlation_id = headers.get("correlation_id")
    return _Request(
        entry_id,
        user_id,
        reply_to if isinstance(reply_to, str) and reply_to else None,
        correlation_id if isinstance(correlation_id, str) else "",
        is_binary(data),
    )


class BacklogShedder:
    def __init__(self, redis: Redis, stream: str, group: str, per_user: int, backlog: int = BACKLOG) -> None:
        self._redis = redis
        self.stream = stream
        self._group = group
        self._per_user = per_user
        self._backlog = backlog
        self._delete = redis.register_script(_DELETE_UNREAD)

    async def shed(self) -> int:
        """One look at the backlog; how many requests were refused."""
        try:
            groups = await self._redis.xinfo_groups(self.stream)
        except Exception as e:  # no stream yet
            if "no such key" in str(e).lower():
                return 0
            raise
        group = next((g for g in groups if g["name"].decode() == self._group), None)
        if group is None or (group.get("lag") is not None and group["lag"] < self._backlog):
            return 0
        last = group["last-delivered-id"].decode()
        entries = await self._redis.xrange(self.stream, min=f"({last}", max="+", count=READ_AHEAD)
        if len(entries) < self._backlog:
            return 0
        seen: Counter[str] = Counter()
        over: dict[bytes, _Request] = {}
        for entry_id, fields in entries:
            request = _read(entry_id, fields.get(bDATA_KEY, b""))
            if request is None:
                continue
            seen[request.user_id] += 1
            if seen[request.user_id] > self._per_user:
                over[entry_id] = request
        if not over:
            return 0
        deleted = await self._delete(keys=[self.stream], args=[self._group, *over])
        await self._refuse([over[entry_id] for entry_id in deleted])
        log.warning("%s: refused %d requests of users past their share of the backlog", self.stream, len(deleted))
        return len(deleted)

    async def _refuse(self, requests: list[_Request]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for request in requests:
                if request.reply_to is None:
                    continue
                reply = ErrorReply(
                    code=ErrorCode.RATE_LIMITED,
                    message=(
                        f"user {request.user_id!r} has more requests waiting on this stream than its share; "
                        f"nothing was done: send this request again in {RETRY_AFTER_MS / 1000:g} s"
                    ),
                    retry_after_ms=RETRY_AFTER_MS,
                )
                form = BinaryMessageFormatV1 if request.binary else JSONEnvelopeFormat
                message = await form.encode(
                    message=_encoder.encode(reply),
                    reply_to=None,
                    headers={},
                    correlation_id=request.correlation_id,
                )
                pipe.publish(request.reply_to, message)
            await pipe.execute()

    async def run(self, stop: asyncio.Event, interval: float = 0.1) -> None:
        await every(interval, stop, self.shed, f"shedding the backlog of {self.stream}", log)
