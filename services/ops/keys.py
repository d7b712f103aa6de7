"""`engram keys`: rotate the master key, say which generation is in use, retire old ones.

A rotation re-wraps every note's data key under a new master-key generation; the log, the
note streams and the read model are not rewritten (their content is sealed under the data keys,
which stay the same). It runs beside a live service, in steps recorded in Redis
(``engram:keyring``, services/adapters/keyring.py), so that a rotation killed anywhere resumes
where it stopped when `engram keys rotate` is run again:

1. *prepare*: the new generation is announced (with the derivation root wrapped under it);
   each worker reads its keyring again and reports which generations it holds. Nothing is
   wrapped under the new generation until every live worker can open it.
2. *switch*: the new generation becomes the active one; each worker wraps new data keys under
   it and says so. Re-wrapping starts once every live worker has switched, so no data key is
   wrapped under the old generation after the pass has gone by.
3. *rewrap*: each partition's log is read from a cursor kept in Redis; each note's wrapped
   key is replaced by a compare-and-set (``_REWRAP``, atomic with the cursor's move), which
   writes only over the very value that was read: a note forgotten meanwhile (its key deleted)
   stays forgotten. Once every log is done and a moment has passed for appends that were in
   flight at the switch, the logs' tails are read again until nothing is left to re-wrap.
4. The rotation completes: Redis no longer holds anything wrapped by the old generation.
   Its key stays in the keyring until `engram keys retire` removes it (after one more pass).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from redis.asyncio import Redis

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.crypto import MasterKey, MasterKeyError, load_master_key, wrapped_generation
from engram_ledger.services.adapters.keyring import KEYRING_KEY, KeyringState, attach_keyring, read_state, root_field
from engram_ledger.services.adapters.redis_conn import rewrite_aof
from engram_ledger.services.config import Settings
from engram_ledger.services.observability.health import live_workers
from engram_ledger.services.ops.operator import operator_redis

# (what, how many log entries or None) -> a context manager whose ``update(n)`` counts entries.
Progress = Callable[[str, int | None], Any]

BATCH = 500
# After the switch, how long appends that had wrapped under the old generation may still land.
SETTLE_MS = 2_000
LOCK_KEY = f"{channels.PREFIX}:keyring:lock"
LOCK_MS = 15_000

# KEYS[1]: the partition's cursor; KEYS[2..]: data keys. ARGV[1]: the cursor's new position,
# then for each data key the value that was read and its new wrapping. A key whose value is not
# the one read (deleted by a forget since) is left alone.
_REWRAP = """
local done = 0
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[2 * i - 2] then
    redis.call('SET', KEYS[i], ARGV[2 * i - 1], 'KEEPTTL')
    done = done + 1
  end
end
redis.call('SET', KEYS[1], ARGV[1])
return done
"""
# The claim's scripts, as every script here, go by EVALSHA (Script objects): an ACL user of the
# service role may not send EVAL (services/ops/acl.py).
_TAKE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""
_KEEP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class _Ids(msgspec.Struct):
    """The two fields of a log event a rotation needs (the rest is not decoded)."""

    user_id: str
    note_id: str


_ids = msgspec.json.Decoder(_Ids)


def cursor_key(partition: int, name: str) -> str:
    """Where a pass over one partition's log has got to (``name``: the rotation's)."""
    return f"{channels.tag(partition)}:keyring:cursor:{name}"


async def _now_ms(redis: Redis) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _dead_here(holder: str) -> bool:
    """Whether a lock holder (``host/pid/nonce``) was a process of this host that is gone."""
    host, _, rest = holder.partition("/")  # a host name holds no "/"
    pid = rest.split("/", 1)[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


@contextlib.asynccontextmanager
async def _exclusive(redis: Redis) -> AsyncIterator[None]:
    """One `engram keys rotate` or `retire` at a time. A claim lapses 15 s after its holder
    stops renewing it; one left by a killed process of this host is taken over at once."""
    owner = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
    if not await redis.set(LOCK_KEY, owner, nx=True, px=LOCK_MS):
        holder = await redis.get(LOCK_KEY)
        taken = holder is not None and _dead_here(holder.decode())
        if taken:
            taken = bool(await redis.register_script(_TAKE)(keys=[LOCK_KEY], args=[holder, owner, LOCK_MS]))
        if not taken and not await redis.set(LOCK_KEY, owner, nx=True, px=LOCK_MS):
            raise EngramError(
                ErrorCode.UNAVAILABLE,
                f"another `engram keys` command ({holder.decode() if holder else 'just finished'}) is rotating "
                f"or retiring keys; run this again once it is done (a killed one's claim lapses within "
                f"{LOCK_MS // 1000} s)",
            )

    keep_claim = redis.register_script(_KEEP)

    async def keep() -> None:
        while True:
            await asyncio.sleep(LOCK_MS / 3000)
            await keep_claim(keys=[LOCK_KEY], args=[owner, LOCK_MS])

    keeper = asyncio.create_task(keep())
    try:
        yield
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        with contextlib.suppress(Exception):
            await redis.register_script(_RELEASE)(keys=[LOCK_KEY], args=[owner])


async def _wait_for_workers(redis: Redis, ready: Callable[[dict[str, Any]], bool], seconds: float, what: str) -> None:
    """Until every live worker is ``ready``; a ``TIMEOUT`` naming the others after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        lagging = [w["worker"] for w in await live_workers(redis) if not ready(w)]
        if not lagging:
            return
        if time.monotonic() > deadline:
            raise EngramError(
                ErrorCode.TIMEOUT,
                f"after {seconds:g} s, worker(s) {', '.join(lagging)} {what}; run `engram keys rotate` again to resume",
            )
        await asyncio.sleep(0.2)


class _Pass:
    """Re-wraps the data keys of the notes in one partition's log under ``target``, from a
    cursor kept in Redis to the end of the log."""

    def __init__(self, redis: Redis, master: MasterKey, target: int, name: str, batch: int, pause: float) -> None:
        self._redis = redis
        self._master = master
        self._target = target
        self._name = name
        self._batch = batch
        self._pause = pause
        self._script = redis.register_script(_REWRAP)
        self.counts: Counter[str] = Counter()

    async def run(self, partition: int, bar: Any) -> int:
        """The keys re-wrapped, up to the log's end as it was when the pass began: what comes
        after is wrapped under the new generation already (or read by the next pass), and a
        pass that chased a busy log's end might never finish."""
        log_key = channels.event_log(partition)
        cursor = cursor_key(partition, self._name)
        raw = await self._redis.get(cursor)
        after = raw.decode() if raw is not None else None
        last = await self._redis.xrevrange(log_key, count=1)
        if not last or (after is not None and channels.parse_entry_id(after) >= channels.parse_entry_id(last[0][0])):
            return 0
        end = last[0][0].decode()
        rewrapped = 0
        while after != end:
            entries = await self._redis.xrange(log_key, "-" if after is None else f"({after}", end, count=self._batch)
            if not entries:
                return rewrapped
            after = entries[-1][0].decode()
            notes = list(
                dict.fromkeys((ids.user_id, ids.note_id) for ids in (_ids.decode(f[b"e"]) for _, f in entries))
            )
            names = [channels.data_key(partition, u, n) for u, n in notes]
            keys, args = [cursor], [after]
            for name, (user_id, note_id), wrapped in zip(names, notes, await self._redis.mget(names), strict=True):
                if wrapped is None or wrapped_generation(wrapped) == self._target:
                    continue
                keys.append(name)
                args += [wrapped, self._master.rewrap(wrapped, f"{user_id}/{note_id}", self._target)]
            done = int(await self._script(keys=keys, args=args))
            rewrapped += done
            self.counts["rewrapped"] += done
            self.counts["forgotten_meanwhile"] += len(keys) - 1 - done
            self.counts["events_read"] += len(entries)
            bar.update(len(entries))
            if self._pause:
                await asyncio.sleep(self._pause)
        return rewrapped


class _NoBar:
    def update(self, n: int) -> None:
        pass


def _bar(progress: Progress | None, what: str, total: int | None) -> Any:
    return progress(what, total) if progress is not None else contextlib.nullcontext(_NoBar())


async def _sweep(redis: Redis, sweep: _Pass, partitions: int, progress: Progress | None) -> int:
    rewrapped = 0
    for p in range(partitions):
        with _bar(progress, f"re-wrapping partition {p}", int(await redis.xlen(channels.event_log(p)))) as bar:
            rewrapped += await sweep.run(p, bar)
    return rewrapped


def _holds(master: MasterKey, *generations: int) -> None:
    """Raises unless ``master`` holds every generation (its source read again first)."""
    if not all(master.holds(g) for g in generations):
        master.reload()
    missing = [g for g in generations if not master.holds(g)]
    if missing:
        raise MasterKeyError(
            f"this keyring ({master.source}) does not hold master-key generation(s) {', '.join(map(str, missing))}, "
            f"which this rotation needs: add them"
        )


async def rotate(
    redis: Redis,
    master: MasterKey,
    partitions: int,
    *,
    wait_seconds: float = 60.0,
    batch: int = BATCH,
    pause: float = 0.0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Start a rotation to the newest generation ``master`` holds (adding one to its file when
    it holds none newer than the active one), or resume the one in progress; run it to the end."""
    async with _exclusive(redis):
        state = await attach_keyring(redis, master)
        resumed = state.rotating
        key_file = None
        if state.target is None:
            newer = [g for g in master.generations if g > state.active]
            target = max(newer) if newer else max(*master.generations, state.active) + 1
            if not newer:
                key_file = str(master.add_generation(target))
            await redis.hset(
                KEYRING_KEY,
                mapping={
                    "target": target,
                    "from": state.active,
                    "phase": "prepare",
                    "started_at": await _now_ms(redis),
                    # A worker given only the new key finds the root under it.
                    root_field(target): master.wrapped_root(target),
                },
            )
            state = await read_state(redis)
        assert state.target is not None and state.source is not None
        target, source = state.target, state.source
        _holds(master, target, source)
        if state.phase == "prepare":
            await _wait_for_workers(
                redis,
                lambda w: target in w.get("key_generations", ()),
                wait_seconds,
                f"do not hold master-key generation {target}: add it to their keyring (the file is read again "
                "every second; a keyring from a variable needs a restart)",
            )
            await redis.hset(
                KEYRING_KEY, mapping={"active": target, "phase": "rewrap", "switched_at": await _now_ms(redis)}
            )
            state = await read_state(redis)
        master.use(target)
        await _wait_for_workers(
            redis,
            lambda w: w.get("key_generation") == target,
            wait_seconds,
            f"have not switched to master-key generation {target} yet",
        )
        sweep = _Pass(redis, master, target, f"rotate-{target}", batch, pause)
        await _sweep(redis, sweep, partitions, progress)
        # Appends that wrapped a new key under the old generation just before their worker
        # switched may land after the pass went by: read the logs' tails again once they have.
        settled = state.times.get("switched_at", 0) + SETTLE_MS
        while (now := await _now_ms(redis)) < settled:
            await asyncio.sleep((settled - now) / 1000)
        while await _sweep(redis, sweep, partitions, None):
            pass
        for p in range(partitions):
            await redis.delete(cursor_key(p, f"rotate-{target}"))
        await redis.hset(KEYRING_KEY, mapping={"previous": source, "completed_at": await _now_ms(redis)})
        await redis.hdel(KEYRING_KEY, "target", "from", "phase", *(root_field(g) for g in state.roots if g != target))
        return {
            "from": source,
            "to": target,
            "generation": target,
            "status": "done",
            "resumed": resumed,
            "key_file": key_file,
            "rewrapped": sweep.counts["rewrapped"],
            "forgotten_meanwhile": sweep.counts["forgotten_meanwhile"],
            "events_read": sweep.counts["events_read"],
        }


async def status(redis: Redis, master: MasterKey, partitions: int) -> dict[str, Any]:
    """The generation in use, a rotation in progress (with each partition's cursor), what this
    command's keyring holds, and which generation each live worker wraps under."""
    state = await read_state(redis)
    report = state.summary()
    report["keyring"] = {"source": master.source, "generations": master.generations}
    if report["rotation"] is not None:
        report["rotation"]["partitions"] = [
            {
                "partition": p,
                "cursor": (raw.decode() if (raw := await redis.get(cursor_key(p, f"rotate-{state.target}"))) else None),
                "log_length": int(await redis.xlen(channels.event_log(p))),
            }
            for p in range(partitions)
        ]
    report["workers"] = [
        {k: w.get(k) for k in ("worker", "key_generation", "key_generations")} for w in await live_workers(redis)
    ]
    return report


async def retire(
    redis: Redis,
    master: MasterKey,
    partitions: int,
    *,
    wait_seconds: float = 60.0,
    batch: int = BATCH,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Remove the generations older than the active one from this keyring's file (a keyring
    from a variable is the operator's to change), once one more pass over every log has found
    each data key under the active generation (re-wrapping any a process that was not a live
    worker wrapped late)."""
    async with _exclusive(redis):
        state: KeyringState = await attach_keyring(redis, master)
        if state.rotating:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER,
                f"a rotation to master-key generation {state.target} is in progress: finish it first "
                "(`engram keys rotate` resumes it)",
            )
        active = state.active
        old = [g for g in master.generations if g < active]
        stale_roots = [root_field(g) for g in state.roots if g < active]
        if not old and not stale_roots:
            return {"generation": active, "retired": [], "key_file": None, "rewrapped": 0, "note": None}
        await _wait_for_workers(
            redis,
            lambda w: w.get("key_generation") == active,
            wait_seconds,
            f"do not wrap new data keys under master-key generation {active}",
        )
        sweep = _Pass(redis, master, active, f"retire-{active}", batch, 0.0)
        await _sweep(redis, sweep, partitions, progress)
        for p in range(partitions):
            await redis.delete(cursor_key(p, f"retire-{active}"))
        if stale_roots:
            await redis.hdel(KEYRING_KEY, *stale_roots)
        # Every data key is under the active generation now: running workers let go of the
        # older ones when they read this (adapters/keyring.KeyringWatcher).
        await redis.hset(KEYRING_KEY, "retired_below", active)
        # The data keys' older wrappings stay in the AOF's history, where the retired key would
        # open them from a copy of the files: rewritten, so that no file holds them.
        aof = await rewrite_aof(redis, wait_seconds)
        path = master.drop_generations(old)
        note = None
        if old and path is None:
            note = f"remove generation(s) {', '.join(map(str, old))} from {master.source} of every worker"
        elif old:
            note = f"other hosts' keyring files may still hold generation(s) {', '.join(map(str, old))}"
        return {
            "generation": active,
            "retired": old,
            "key_file": str(path) if path is not None and old else None,
            "rewrapped": sweep.counts["rewrapped"],
            "aof": aof,
            "note": note,
        }


async def run_keys(
    settings: Settings,
    action: str,
    progress: Progress | None = None,
    *,
    wait_seconds: float = 60.0,
    batch: int = BATCH,
    pause: float = 0.0,
) -> dict[str, Any]:
    """`engram keys ACTION` (rotate, status, retire) with the keyring as configured; a keyring
    that cannot do it is an ``INVALID_PARAMETER`` naming what to change."""
    try:
        master = load_master_key(settings.data_dir)
        async with operator_redis(settings) as (redis, partitions):
            if action == "rotate":
                return await rotate(
                    redis, master, partitions, wait_seconds=wait_seconds, batch=batch, pause=pause, progress=progress
                )
            if action == "retire":
                return await retire(
                    redis, master, partitions, wait_seconds=wait_seconds, batch=batch, progress=progress
                )
            return await status(redis, master, partitions)
    except MasterKeyError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, str(e)) from None


def human(action: str, result: dict[str, Any]) -> str:
    """What `engram keys ACTION` says to a person."""
    if action == "rotate":
        added = f"; generation {result['to']} was added to {result['key_file']}" if result["key_file"] else ""
        return (
            f"rotated the master key from generation {result['from']} to {result['to']}: "
            f"{result['rewrapped']} data keys re-wrapped, {result['forgotten_meanwhile']} forgotten meanwhile "
            f"(left forgotten){added}. Nothing in Redis needs generation {result['from']} now; "
            "`engram keys retire` removes it from the keyring (keep a copy with any older backup)"
        )
    if action == "retire":
        if not result["retired"]:
            return f"nothing to retire: this keyring holds no generation older than {result['generation']}"
        where = f" (removed from {result['key_file']})" if result["key_file"] else ""
        note = f"; {result['note']}" if result["note"] else ""
        aof = f"; Redis: {result['aof']}" if result.get("aof") else ""
        return f"retired generation(s) {', '.join(map(str, result['retired']))}{where}{aof}{note}"
    lines = [f"master-key generation in use: {result['generation']}"]
    rotation = result["rotation"]
    if rotation is not None:
        lines.append(
            f"rotation from {rotation['from']} to {rotation['to']} in progress ({rotation['phase']}): "
            "`engram keys rotate` resumes it"
        )
    keyring = result["keyring"]
    lines.append(
        f"this keyring ({keyring['source']}) holds generation(s) {', '.join(map(str, keyring['generations']))}"
    )
    lines += [
        f"worker {w['worker']}: wraps under {w['key_generation']}, holds {w['key_generations']}"
        for w in result["workers"]
    ]
    return "\n".join(lines)
