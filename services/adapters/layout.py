"""The key layout a Redis holds (``engram_ledger.contracts.channels.LAYOUT``): checked before a service writes.

Layout 2 encodes the caller-chosen parts of key names (``channels.part``). Its keys differ from
layout 1's only for ids holding ``:`` or ``%``, so a store of layout 1 without such ids is
layout 2 already and is stamped as it is; one with them would lose their idempotency records
and streams to the new names, so the service refuses to start on it and says how to move.
"""

from __future__ import annotations

import msgspec
from redis.asyncio import Redis

from engram_ledger.contracts import channels


class _Ids(msgspec.Struct):
    user_id: str
    note_id: str
    command_id: str


_ids = msgspec.json.Decoder(_Ids)
_ENCODED = (":", "%")


class OldLayout(RuntimeError):
    """This Redis holds keys named the way of an earlier release that this one cannot read."""


async def check_layout(redis: Redis, partitions: int) -> None:
    stored = await redis.get(channels.LAYOUT_KEY)
    if stored is not None:
        if int(stored) != channels.LAYOUT:
            raise OldLayout(f"this Redis holds key layout {int(stored)}; this release reads layout {channels.LAYOUT}")
        return
    if await redis.exists(channels.PARTITIONS_KEY) and await _has_encoded_ids(redis, partitions):
        raise OldLayout(
            "this Redis holds data written before key layout 2, with user, command or conversation ids "
            "containing ':' or '%', whose keys are named differently now; move it with `engram export` "
            "(of the release that wrote it) and `engram import` (of this one) into an empty Redis"
        )
    await redis.set(channels.LAYOUT_KEY, channels.LAYOUT)


async def _has_encoded_ids(redis: Redis, partitions: int) -> bool:
    """Whether any event of the log names an id whose key name layout 2 encodes."""
    for p in range(partitions):
        after = "-"
        while batch := await redis.xrange(channels.event_log(p), after, "+", count=1000):
            for _, fields in batch:
                ids = _ids.decode(fields[b"e"])
                if any(c in i for i in (ids.user_id, ids.note_id, ids.command_id) for c in _ENCODED):
                    return True
            after = "(" + batch[-1][0].decode()
    return False
