"""Promises 1, 3, 6 and 8 under faults, with every worker kind in its own process.

A private redis-server (AOF, appendfsync always) and `engram serve --role ...` processes: two
command handlers, a query responder, the history projection and the forget saga. A mixed
workload of a few hundred commands (saves, updates with expected versions, two-call forgets,
some sent twice at once) runs while each worker kind is SIGKILLed at a random point and
restarted, and Redis itself is SIGKILLed and restarted from its AOF. Afterwards old commands are
replayed out of order. Then: every replied command is in the log exactly once, per-note versions
are gapless, every actor's notes are what it was told, the projections equal a rebuild from the
log, pending forgets kept their deadlines, and no forgotten text is left in Redis or its files.
It runs twice: on one Redis, and on a Redis Cluster of three masters with six partitions, where
the Redis that is killed is one of the masters.

The vector index is off here: the embedded Qdrant Edge shard belongs to one process, so the
command and query roles could not live apart from it (tests/faults/test_index_faults.py kills
the index projection instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.channels import SCRUB_OWED_KEY, HistoryKeys
from engram_ledger.contracts.commands import RequestForget, SaveNote, UpdateNote
from engram_ledger.contracts.queries import ForgetReply, NoteWritten
from engram_ledger.projections.forget_saga import ForgetSagaProjection, member
from engram_ledger.projections.history import HistoryProjection, drop_generation, live_generation
from engram_ledger.services.adapters.crypto import load_master_key
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.adapters.redis_conn import close_redis, open_redis
from engram_ledger.services.adapters.redis_conn import servers as each_server
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from tests.cluster import LocalCluster
from tests.faults.workload import Actor, check_log, check_read_model, retry_read, run_actor
from tests.support import ServeProcess, dump, engram_env, eventually, every_value, holding, until_none

USERS = 10
STEPS = 30  # commands per user: 300 in all, plus the reads and the duplicates
WORKERS = {"commands": 2, "queries": 1, "history": 1, "saga": 1}
# Fixed, so that a failure replays; ENGRAM_FAULT_SEED explores other schedules.
SEED = int(os.environ.get("ENGRAM_FAULT_SEED", "20261122"))
PAUSE = 0.3  # mean seconds between one actor's commands: the load lasts about 15 s


class Workers:
    """The worker processes by role; a killed one is restarted in its place. ``timeline``: when
    each fault struck and each restart ended, for a failure to tell."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.by_role = {role: [ServeProcess(env, roles=role) for _ in range(n)] for role, n in WORKERS.items()}
        self.timeline: list[str] = []
        self._started = time.monotonic()

    def mark(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self._started:7.1f} s  {what}")

    def report(self) -> str:
        """The timeline and the last lines of every worker's log."""
        logs = [f"--- {p.roles} worker, last lines:\n" + "".join(p.lines[-12:]) for p in self.all()]
        return "\n".join(["faults and restarts:", *self.timeline, *logs])

    def all(self) -> Iterator[ServeProcess]:
        for processes in self.by_role.values():
            yield from processes

    async def start(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(p.start) for p in self.all()))

    async def kill_and_restart(self, role: str, rng: random.Random) -> None:
        victim = rng.choice(self.by_role[role])
        victim.kill()
        self.mark(f"{role} worker killed")
        await asyncio.sleep(rng.uniform(0.2, 1.0))  # down a while, as a worker a supervisor restarts
        for attempt in range(10):
            # As a supervisor would (compose's restart policy): a worker that finds Redis down exits.
            try:
                await asyncio.to_thread(victim.start)
                self.mark(f"{role} worker serving again (start {attempt + 1})")
                return
            except RuntimeError:
                if attempt == 9:
                    raise
                await asyncio.sleep(0.5)  # the supervisor's pause between restarts

    def restarted_later(self, role: str, rng: random.Random) -> asyncio.Task[None]:
        return asyncio.create_task(self.kill_and_restart(role, rng))

    def kill_all(self) -> None:
        for p in self.all():
            p.kill()


@dataclass
class Backend:
    """The Redis under test: one server, or a cluster of three (AOF always on each)."""

    url: str
    cluster: bool
    partitions: int
    servers: list[RedisServer]  # what the chaos kills one of, and whose files are scanned

    def env(self) -> dict[str, str]:
        values = {"ENGRAM_REDIS_URL": self.url, "ENGRAM_PARTITIONS": str(self.partitions)}
        return values | ({"ENGRAM_REDIS_CLUSTER": "on"} if self.cluster else {})


@pytest.fixture(params=["redis", "cluster"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "redis":
        server = RedisServer(tmp_path / "redis", appendfsync="always").start()
        yield Backend(server.url, False, 1, [server])
        server.stop()
    else:
        cluster = LocalCluster(tmp_path / "cluster", appendfsync="always").start()
        yield Backend(cluster.url, True, 6, cluster.nodes)
        cluster.stop()


async def test_every_worker_kind_and_redis_killed_mid_load_loses_nothing(tmp_path: Path, backend: Backend) -> None:
    env = engram_env(
        **backend.env(),
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
        async with EngramClient(backend.url, timeout=3, cluster=backend.cluster) as client:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120

            def progress() -> None:
                nonlocal done
                done += 1

            landed: list[int] = []  # how many commands had been answered when each fault struck

            async def chaos() -> list[str]:
                # Each worker kind once and Redis once, in a random order at random points.
                kinds = [*WORKERS, "redis"]
                rng.shuffle(kinds)
                points = sorted(rng.uniform(0.1, 0.8) for _ in kinds)
                restarts = []
                for point, kind in zip(points, kinds, strict=True):
                    await eventually(
                        lambda point=point: done >= point * USERS * STEPS, 120, 0.01, f"{point:.0%} of the load"
                    )
                    landed.append(done)
                    if kind == "redis":  # on a cluster, one of its masters
                        server = rng.choice(backend.servers)
                        server.kill()
                        workers.mark(f"redis {server.port} killed")
                        await asyncio.sleep(0.3)  # down a moment, as a crashed Redis is
                        await asyncio.to_thread(server.start)
                        workers.mark(f"redis {server.port} answering again")
                    else:
                        restarts.append(workers.restarted_later(kind, rng))
                await asyncio.gather(*restarts)
                return kinds

            killed, *_ = await asyncio.gather(
                chaos(), *(run_actor(client, a, STEPS, deadline, progress, pause=PAUSE) for a in actors)
            )
            assert set(killed) == {*WORKERS, "redis"} and done == USERS * STEPS
            assert max(landed) < USERS * STEPS, f"every fault struck mid-load: {landed}"

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

            redis = open_redis(backend.url, backend.cluster)
            try:
                await check_log(redis, backend.partitions, actors)
                await check_read_model(client, actors)
                await _projections_equal_a_rebuild(redis, backend.partitions, tmp_path / "data", actors)
                await _pending_forgets_kept_their_deadlines(redis, backend.partitions, actors)
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
                await _no_forgotten_text_left(redis, backend.servers, actors)
            finally:
                await close_redis(redis)
    except BaseException as e:
        e.add_note(workers.report())
        with contextlib.suppress(Exception):
            e.add_note(await asyncio.wait_for(_where_requests_wait(backend, actors), 30))
        raise
    finally:
        workers.kill_all()


async def _projections_equal_a_rebuild(
    redis: aioredis.Redis, partitions: int, data_dir: Path, actors: list[Actor]
) -> None:
    master = load_master_key(data_dir, env={})  # the workers' key
    store = RedisEventStore(redis, partitions, 3600, master)
    sizes = []
    for p in range(partitions):
        if (await store.log_head(p))[0] is None:
            continue  # no user of this run landed here
        live = await live_generation(redis, p)
        rebuilt = HistoryProjection(redis, p, live + 100, master)
        await rebuilt.rebuild(store)
        live_state, rebuilt_state = await dump(redis, p, live), await dump(redis, p, live + 100)
        assert rebuilt_state == live_state
        sizes.append(len(live_state))
        await drop_generation(redis, p, live + 100)  # a copy for comparing, not a read model to keep

        saga = ForgetSagaProjection(redis, p)
        deadlines = await redis.zrange(saga.keys.deadlines, 0, -1, withscores=True)
        pending = {a.user: await redis.smembers(saga.keys.pending(a.user)) for a in actors}
        await saga.rebuild(store)
        assert await redis.zrange(saga.keys.deadlines, 0, -1, withscores=True) == deadlines
        assert {a.user: await redis.smembers(saga.keys.pending(a.user)) for a in actors} == pending
    assert sum(sizes) > 100


async def _pending_forgets_kept_their_deadlines(redis: aioredis.Redis, partitions: int, actors: list[Actor]) -> None:
    stored: dict[str, float] = {}
    for p in range(partitions):
        deadlines = await redis.zrange(ForgetSagaProjection(redis, p).keys.deadlines, 0, -1, withscores=True)
        stored.update({m.decode(): score for m, score in deadlines})
    expected = {member(a.user, n): at.timestamp() * 1000 for a in actors for n, at in a.pending.items()}
    assert expected, "the workload leaves some deletions pending"
    assert stored.keys() == expected.keys()
    assert all(abs(stored[k] - expected[k]) < 1 for k in expected)


async def _no_forgotten_text_left(redis: aioredis.Redis, servers: list[RedisServer], actors: list[Actor]) -> None:
    needles = [t.encode() for a in actors for n in a.forgotten for t in a.texts[n]]
    kept = [n.encode() for a in actors for n in a.notes]

    async def left() -> str:
        """Where forgotten text is left (nothing: the scrub is settled and nothing holds any)."""
        # The scrub owed by the forgets is settled once no command is pending; then the AOF rewrites.
        settled = await redis.get(SCRUB_OWED_KEY) is None
        infos = [await server("INFO", "persistence") for server in await each_server(redis)]
        if not settled or any(info["aof_rewrite_in_progress"] for info in infos):
            return f"scrub settled {settled}, AOF rewrites {[info['aof_rewrite_in_progress'] for info in infos]}"
        found = await holding(redis, needles)
        files = [p for s in servers for p in s.directory.rglob("*") if p.is_file() and p.name != "redis.log"]
        on_disk = {str(p) for p in files for n in needles if n in p.read_bytes()}
        return f"keys {found}, files {on_disk}" if found or on_disk else ""

    await until_none(left, 60, interval=0.2, what="forgotten text left")
    # The scan does reach the notes still alive (their text is sealed: no plain text is left to see).
    keys = [key async for key, _ in every_value(redis)]
    assert kept and all(any(k in key for key in keys) for k in kept[:3])


async def _where_requests_wait(backend: Backend, actors: list[Actor]) -> str:
    """For a failure to tell: each actor's partition, its last token and how far the read model
    has applied that partition, and its partition's queries waiting for admission (inbox), in the
    stream, and taken but not answered (pending)."""
    redis = open_redis(backend.url, backend.cluster)
    lines = ["where requests wait:"]
    try:
        for actor in actors:
            p = channels.partition_of(actor.user, backend.partitions)
            applied = await redis.get(HistoryKeys(p, await live_generation(redis, p)).checkpoint)
            queries = channels.query_stream(p)
            waiting = await redis.llen(channels.inbox(queries))
            pending = (await redis.xpending(queries, channels.QUERY_GROUP))["pending"]
            lines.append(
                f"{actor.user}: partition {p}, last token {actor.last_token}, applied {applied!r}; "
                f"queries in the inbox {waiting}, in the stream {await redis.xlen(queries)}, pending {pending}"
            )
    finally:
        await close_redis(redis)
    return "\n".join(lines)
