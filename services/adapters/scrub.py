"""``Scrubber``: after a forget, removes the plaintext copies crypto-shredding cannot reach
(handled request entries in Redis streams, and the append-only file's history of old values)."""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from engram_ledger.contracts import channels
from engram_ledger.services.adapters.redis_conn import group_info, servers
from engram_ledger.services.application.ports import EventStore, NoteHistory
from engram_ledger.services.common.periodic import every

log = logging.getLogger("engram.scrub")

_CLEAR_DEBT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Scrubber:
    """After a forget, removes copies of plaintext the crypto-shredding cannot reach: handled
    request entries (a SaveNote's text sits in the command stream until trimmed; a search's in
    the query stream) and, when Redis keeps an append-only file, its history of old values (a
    rewrite keeps only the current data). Redis frees a stream's entries by whole nodes (up to
    100 entries): a handled entry that shares its node with one still pending keeps its bytes
    until that node goes, and a rewrite before the history applied the tombstone would keep the
    old view. So every forget records a debt (``channels.SCRUB_OWED_KEY``), scrubs at once as well as it
    can, and the debt is settled only by a scrub made in a quiet moment: no command pending and
    the history caught up with the log. Settling runs in every command worker, and a worker
    that starts owes one, since a crash may have cut a scrub short.

    Implements the application's ``Scrub`` port."""

    def __init__(self, redis: Redis, partitions: int, history: NoteHistory, store: EventStore) -> None:
        self._redis = redis
        self._partitions = partitions
        self._history = history
        self._store = store
        self._clear = redis.register_script(_CLEAR_DEBT)

    async def owe(self) -> None:
        await self._redis.incr(channels.SCRUB_OWED_KEY)

    async def wait_until_acknowledged(self, timeout: float) -> None:
        """Until no command is pending (bounded: under load there always is one)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if not await self._commands_pending():
                return
            await asyncio.sleep(0.02)

    async def _commands_pending(self) -> bool:
        for p in range(self._partitions):
            for stream in (channels.command_stream(p), channels.operator_stream(p)):
                if (await self._redis.xpending(stream, channels.COMMAND_GROUP))["pending"]:
                    return True
        return False

    async def _quiet(self) -> bool:
        if await self._commands_pending():
            return False
        for p in range(self._partitions):
            head, _ = await self._store.log_head(p)
            if head is not None and await self._history.checkpoint(p) < channels.parse_entry_id(head):
                return False
        return True

    async def settle(self) -> bool:
        """Scrub if a scrub is owed and the moment is quiet. True when nothing is owed any more."""
        owed = await self._redis.get(channels.SCRUB_OWED_KEY)
        if owed is None:
            return True
        if not await self._quiet() or not await self.scrub():
            return False
        # Cleared only if no forget added to the debt since it was read.
        return bool(await self._clear(keys=[channels.SCRUB_OWED_KEY], args=[owed]))

    async def run(self, stop: asyncio.Event, interval: float = 1.0) -> None:
        await self.owe()
        await every(interval, stop, self.settle, "settling the scrub after a forget", log)

    async def scrub(self) -> bool:
        """Trim handled request entries and rewrite the AOF. False when it could not finish."""
        try:
            for p in range(self._partitions):
                await trim_handled(self._redis, channels.command_stream(p), channels.COMMAND_GROUP)
                await trim_handled(self._redis, channels.operator_stream(p), channels.COMMAND_GROUP)
                await trim_handled(self._redis, channels.query_stream(p), channels.QUERY_GROUP)
            for server in await servers(self._redis):
                aof = await server("CONFIG GET", "appendonly")
                if aof.get("appendonly") in ("yes", b"yes"):
                    await server("BGREWRITEAOF")
        except ResponseError as e:
            if "already in progress" in str(e):
                # A rewrite started by an earlier forget (or another worker) may predate this
                # one: still owed, and the next round starts a fresh rewrite.
                log.debug("an AOF rewrite is running; scrubbing again after it")
            else:  # CONFIG or BGREWRITEAOF refused by an ACL: an operator must know
                log.warning("scrubbing after a forget incomplete: %s", e)
            return False
        return True


async def trim_handled(redis: Redis, stream: str, group: str) -> int:
    """Delete the entries every consumer of ``group`` has handled: older than the oldest pending
    one, and not after the last delivered one."""
    info = await group_info(redis, stream, group)
    if info is None:
        return 0
    last = channels.parse_entry_id(info["last-delivered-id"])
    bound = (last[0], last[1] + 1)
    pending = await redis.xpending(stream, group)
    if pending["pending"]:
        oldest = channels.parse_entry_id(pending["min"])
        bound = min(bound, oldest)
    return int(await redis.xtrim(stream, minid=f"{bound[0]}-{bound[1]}", approximate=False))
