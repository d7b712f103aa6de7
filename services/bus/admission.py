"""``Admission``: how many requests of one user the request streams may hold at once.

Each request of a user takes a place before it is written to a stream and gives it back when
its reply comes (or its wait ends). A client's own requests beyond the bound wait for a place
(one process sending thousands at once is slowed to the bound, not refused); the places are
kept in Redis (``channels.in_flight``), so the bound holds across every client of the user;
a request that finds them all taken by other clients waits for one as long as it would wait
for its reply, and only then is refused ``RATE_LIMITED``. A place is taken by a Lua script before the request is written
(by a plain XADD: a script's keys need read rights, and an agent's role may only write the
request streams, which hold other users' requests). A place is held at most as long as the
request's wait, so a client that dies does not keep it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode

# A client's default bound. Each request of a user in flight is one more that another user's
# request shares the worker's processor with: with two, a flooding agent left the others' p99 at
# about twice what it is alone (bench/bench_flood.py); more only wait in front of theirs.
DEFAULT_USER_IN_FLIGHT = 2
# While other clients hold a user's places: how often to ask again (a place is usually given
# back within milliseconds, when its reply comes), and the hint a refusal gives.
FIRST_PAUSE_SECONDS = 0.005
LAST_PAUSE_SECONDS = 0.2
RETRY_AFTER_MS = 1_000

_TAKE = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local until_ms = now_ms + tonumber(ARGV[1])
-- Each place is scored by when it lapses, the first lapses soonest; lapsed places (their clients
-- died) are cleared only when they would refuse, which keeps the common case to four commands.
local cap = tonumber(ARGV[2])
-- Places this client could not give back (Redis was unreachable when their wait ended).
for i = 4, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
if redis.call('ZCARD', KEYS[1]) >= cap then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
  if redis.call('ZCARD', KEYS[1]) >= cap then
    local soonest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, tonumber(soonest[2]) - now_ms}
  end
end
redis.call('ZADD', KEYS[1], until_ms, ARGV[3])
-- The key goes when its newest place would lapse (an older place held longer then goes early:
-- a place too many, for a moment, not one lost).
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return {1, 0}
"""


class Admission:
    def __init__(self, redis: Redis, per_user: int = DEFAULT_USER_IN_FLIGHT) -> None:
        """``per_user``: the bound; 0 for none (requests are written as they come)."""
        self._redis = redis
        self.per_user = per_user
        self._take_script: AsyncScript | None = None
        # Places whose release failed (Redis down or restarting), given back with the next take
        # of the same user: else this client's own dead requests would refuse its retries.
        self._unreleased: dict[tuple[int, str], set[str]] = {}
        self._local: dict[str, tuple[asyncio.Semaphore, int]] = {}

    @contextlib.asynccontextmanager
    async def place(self, user_id: str) -> AsyncIterator[None]:
        """One of this client's places for the user (waited for when all are taken)."""
        semaphore, users = self._local.get(user_id, (asyncio.Semaphore(self.per_user), 0))
        self._local[user_id] = (semaphore, users + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, users = self._local[user_id]
            if users == 1:
                del self._local[user_id]
            else:
                self._local[user_id] = (semaphore, users - 1)

    async def take(self, partition: int, user_id: str, request: str, hold_ms: int, wait: float = 0.0) -> None:
        """Take a place in Redis as ``request``. While the user's are all taken (by other
        clients), wait for one for up to ``wait`` seconds, asking again at growing intervals;
        then ``RATE_LIMITED``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        pause = FIRST_PAUSE_SECONDS
        while not await self._take(partition, user_id, request, hold_ms):
            if loop.time() + pause > deadline:
                raise EngramError(
                    ErrorCode.RATE_LIMITED,
                    f"user {user_id!r} has had {self.per_user} requests waiting for a reply for the last "
                    f"{wait:g} s, its share of the service; nothing was sent: send this request again in "
                    f"{RETRY_AFTER_MS / 1000:g} s",
                    retry_after_ms=RETRY_AFTER_MS,
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, LAST_PAUSE_SECONDS)

    async def _take(self, partition: int, user_id: str, request: str, hold_ms: int) -> bool:
        if self._take_script is None:
            self._take_script = self._redis.register_script(_TAKE)
        stale = self._unreleased.pop((partition, user_id), set())
        try:
            admitted, _ = await self._take_script(
                keys=[channels.in_flight(partition, user_id)], args=[hold_ms, self.per_user, request, *stale]
            )
        except BaseException:
            if stale:
                self._unreleased.setdefault((partition, user_id), set()).update(stale)
            raise
        return bool(admitted)

    async def release(self, partition: int, user_id: str, request: str) -> None:
        """Give the place back; when Redis cannot be reached, with the user's next take."""
        try:
            await self._redis.zrem(channels.in_flight(partition, user_id), request)
        except (RedisError, OSError, AttributeError, TypeError):
            # AttributeError, TypeError: redis-py 8.1 (redis/redis-py#4287) can leak them from a
            # connection the server has just closed, instead of its ConnectionError (the fault
            # tests kill Redis under load). A lost connection all the same.
            self._unreleased.setdefault((partition, user_id), set()).add(request)
