"""Promises 1, 3, 6 and 8 under faults, with every worker kind in its own process.

A private redis-server (AOF, appendfsync always) and `engram serve --role ...` processes: two
command handlers, a query responder, the history projection and the forget saga. A mixed
workload of a few hundred commands (saves, updates with expected versions, two-call forgets,
some sent twice at once) runs while each worker kind is SIGKILLed at a random point and
restarted, and Redis itself is SIGKILLed and restarted from its AOF. Afterwards old commands are
replayed out of order. Then: every replied command is in the log exactly once, per-note versions
are gapless, every actor's notes are what it was told, the projections equal a rebuild from the
log, pending forgets kept their deadlines, and no forgotten text is left in Redis or its files.

The vector index is off here: the embedded Qdrant Edge shard belongs to one process, so the
command and query roles could not live apart from it (tests/faults/test_index_faults.py kills
the index projection instead).
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from contracts.commands import RequestForget, SaveNote, UpdateNote
from contracts.queries import ForgetReply, NoteWritten
from projections.forget_saga import ForgetSagaProjection, member
from projections.history import HistoryProjection, drop_generation, live_generation
from services.client import EngramClient
from services.crypto import load_master_key
from services.event_store import RedisEventStore
from services.forget import SCRUB_OWED_KEY
from services.redis_server import RedisServer
from tests.faults.workload import Actor, check_log, check_read_model, retry_read, run_actor
from tests.integration.test_forget import every_value
from tests.integration.test_history_projection import dump
from tests.support import ServeProcess, engram_env

USERS = 10
STEPS = 30  # commands per user: 300 in all, plus the reads and the duplicates
WORKERS = {"commands": 2, "queries": 1, "history": 1, "saga": 1}
# Fixed, so that a failure replays; ENGRAM_FAULT_SEED explores other schedules.
SEED = int(os.environ.get("ENGRAM_FAULT_SEED", "20261122"))
PAUSE = 0.3  # mean seconds between one actor's commands: the load lasts about 15 s


class Workers:
    """The worker processes by role; a killed one is restarted in its place."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.by_role = {role: [ServeProcess(env, roles=role) for _ in range(n)] for role, n in WORKERS.items()}

    def all(self) -> Iterator[ServeProcess]:
        for processes in self.by_role.values():
            yield from processes

    async def start(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(p.start) for p in self.all()))

    async def kill_and_restart(self, role: str, rng: random.Random) -> None:
        victim = rng.choice(self.by_role[role])
        victim.kill()
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        for attempt in range(10):
            # As a supervisor would (compose's restart policy): a worker that finds Redis down exits.
            try:
                await asyncio.to_thread(victim.start)
                return
            except RuntimeError:
                if attempt == 9:
                    raise
                await asyncio.sleep(0.5)

    def restarted_later(self, role: str, rng: random.Random) -> asyncio.Task[None]:
        return asyncio.create_task(self.kill_and_restart(role, rng))

    def kill_all(self) -> None:
        for p in self.all():
            p.kill()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", appendfsync="always").start()
    yield server
    server.stop()


async def test_every_worker_kind_and_redis_killed_mid_load_loses_nothing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    env = engram_env(
        ENGRAM_REDIS_URL=redis_server.url,
        ENGRAM_DATA_DIR=str(tmp_path / "data"),
        ENGRAM_INDEX="off",
        ENGRAM_CLAIM_IDLE_MS="1000",
        ENGRAM_LEASE_MS="1000",
        ENGRAM_MAX_DELIVERIES="10",
        ENGRAM_READ_WAIT_SECONDS="20",
        ENGRAM_FORGET_TTL_SECONDS="3600",
    )
    workers = Workers(env)
    rng = random.Random(SEED)
    actors = [Actor(f"user-{u}", random.Random(SEED + u)) for u in range(USERS)]
    done = 0
    try:
        await workers.start()
        async with EngramClient(redis_server.url, timeout=3) as client:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120

            def progress() -> None:
                nonlocal done
                done += 1

            async def chaos() -> list[str]:
                # Each worker kind once and Redis once, in a random order at random points.
                kinds = [*WORKERS, "redis"]
                rng.shuffle(kinds)
                points = sorted(rng.uniform(0.1, 0.8) for _ in kinds)
                restarts = []
                for point, kind in zip(points, kinds, strict=True):
                    while done < point * USERS * STEPS:
                        await asyncio.sleep(0.01)
                    if kind == "redis":
                        redis_server.kill()
                        await asyncio.sleep(0.3)
                        await asyncio.to_thread(redis_server.start)
                    else:
                        restarts.append(workers.restarted_later(kind, rng))
                await asyncio.gather(*restarts)
                return kinds

            killed, *_ = await asyncio.gather(
                chaos(), *(run_actor(client, a, STEPS, deadline, progress, pause=PAUSE) for a in actors)
            )
            assert set(killed) == {*WORKERS, "redis"} and done == USERS * STEPS
            assert sum(a.retries for a in actors) > 0, "the faults cost some replies (else they hit nothing)"

            # Replayed out of order: early commands again, after later ones changed their notes.
            for actor in actors:
                for command in [c for c in actor.sent if isinstance(c, SaveNote | UpdateNote)][:3]:
                    again = await retry_read(lambda c=command: client.execute(c, NoteWritten), deadline)
                    first = actor.replies[command.command_id]
                    assert again.replayed and (again.note_id, again.version, again.token) == (
                        first.note_id,
                        first.version,
                        first.token,
                    )

            redis = aioredis.Redis.from_url(redis_server.url)
            try:
                await check_log(redis, 1, actors)
                await check_read_model(client, actors)
                await _projections_equal_a_rebuild(redis, tmp_path / "data", actors)
                await _pending_forgets_kept_their_deadlines(redis, actors)
                # Confirm the pending deletions now: the second call still works after everything.
                for actor in actors:
                    for note_id in list(actor.pending):
                        command = RequestForget(
                            command_id=f"{actor.user}-final", user_id=actor.user, note_ids=[note_id]
                        )
                        reply = await client.execute(command, ForgetReply)
                        assert reply.status == "forgotten"
                        actor.record(command, reply)
                assert sum(len(a.forgotten) for a in actors) >= 10
                await _no_forgotten_text_left(redis, redis_server, actors)
            finally:
                await redis.aclose()
    finally:
        workers.kill_all()


async def _projections_equal_a_rebuild(redis: aioredis.Redis, data_dir: Path, actors: list[Actor]) -> None:
    store = RedisEventStore(redis, 1, 3600, load_master_key(data_dir, env={}))  # the workers' key
    live = await live_generation(redis, 0)
    rebuilt = HistoryProjection(redis, 0, generation=live + 100)
    await rebuilt.rebuild(store)
    live_state, rebuilt_state = await dump(redis, 0, live), await dump(redis, 0, live + 100)
    assert len(live_state) > 100 and rebuilt_state == live_state
    await drop_generation(redis, 0, live + 100)  # a copy for comparing, not a read model to keep

    saga = ForgetSagaProjection(redis, 0)
    deadlines = await redis.zrange(saga.keys.deadlines, 0, -1, withscores=True)
    pending = {a.user: await redis.smembers(saga.keys.pending(a.user)) for a in actors}
    await saga.rebuild(store)
    assert await redis.zrange(saga.keys.deadlines, 0, -1, withscores=True) == deadlines
    assert {a.user: await redis.smembers(saga.keys.pending(a.user)) for a in actors} == pending


async def _pending_forgets_kept_their_deadlines(redis: aioredis.Redis, actors: list[Actor]) -> None:
    saga = ForgetSagaProjection(redis, 0)
    stored = {m.decode(): score for m, score in await redis.zrange(saga.keys.deadlines, 0, -1, withscores=True)}
    expected = {member(a.user, n): at.timestamp() * 1000 for a in actors for n, at in a.pending.items()}
    assert expected, "the workload leaves some deletions pending"
    assert stored.keys() == expected.keys()
    assert all(abs(stored[k] - expected[k]) < 1 for k in expected)


async def _no_forgotten_text_left(redis: aioredis.Redis, server: RedisServer, actors: list[Actor]) -> None:
    needles = [t.encode() for a in actors for n in a.forgotten for t in a.texts[n]]
    kept = [t.encode() for a in actors for n in a.notes for t in a.texts[n][-1:]]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    found: set[bytes] = set()
    on_disk: set[str] = set()
    while True:
        # The scrub owed by the forgets is settled once no command is pending; then the AOF rewrite.
        settled = await redis.get(SCRUB_OWED_KEY) is None
        rewriting = (await redis.info("persistence"))["aof_rewrite_in_progress"]
        if settled and not rewriting:
            found = {key async for key, blob in every_value(redis) for n in needles if n in blob}
            files = [p for p in server.directory.rglob("*") if p.is_file() and p.name != "redis.log"]
            on_disk = {p.name for p in files for n in needles if n in p.read_bytes()}
            if not found and not on_disk:
                break
        assert loop.time() < deadline, f"forgotten text left: settled {settled}, keys {found}, files {on_disk}"
        await asyncio.sleep(0.2)
    # The scan does see text where text is: the notes still alive.
    blobs = [blob async for _, blob in every_value(redis)]
    assert kept and all(any(k in blob for blob in blobs) for k in kept[:3])
