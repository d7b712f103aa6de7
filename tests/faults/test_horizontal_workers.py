"""Horizontal workers: several `engram serve` processes share the consumer groups. A dead
worker's pending requests are claimed and answered by a live one, without the caller retrying;
every worker does a share of the work; per-user order holds in the log."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import UpdateNote
from engram_ledger.contracts.queries import NoteWritten
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from tests.faults.workload import log_events
from tests.support import ServeProcess, engram_env, eventually, until_none

USERS = 16
UPDATES = 12  # per user, one after another


def consumer_name(worker: ServeProcess) -> str:
    for line in worker.lines:
        found = re.search(r"consumer (\S+),", line)
        if found:
            return found.group(1)
    raise AssertionError("no consumer name in the worker's log")


async def test_a_dead_workers_pending_requests_are_answered_by_a_live_one(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    env = engram_env(
        ENGRAM_REDIS_URL=server.url,
        ENGRAM_DATA_DIR=str(tmp_path / "data"),
        ENGRAM_INDEX="off",
        ENGRAM_CLAIM_IDLE_MS="1000",
        ENGRAM_LEASE_MS="1000",
    )
    # Two front workers (commands and queries), and the projections in a third.
    fronts = [ServeProcess(env, roles="commands,queries") for _ in range(2)]
    back = ServeProcess(env, roles="history,saga")
    workers = [*fronts, back]
    redis = aioredis.Redis.from_url(server.url)
    try:
        await asyncio.gather(*(asyncio.to_thread(w.start) for w in workers))
        doomed = fronts[0]
        stream = channels.command_stream(0)
        async with EngramClient(server.url, timeout=20) as client:
            notes = {
                f"user-{u}": (await client.save(f"user-{u}", f"user-{u} v1", advise=False)).note_id
                for u in range(USERS)
            }
            sent: dict[str, list[str]] = {user: [] for user in notes}

            async def updates(user: str) -> None:
                for i in range(2, UPDATES + 2):
                    command = UpdateNote(
                        command_id=f"{user}-{i}",
                        user_id=user,
                        note_id=notes[user],
                        content=f"{user} v{i}",
                        expected_version=i - 1,
                    )
                    sent[user].append(command.command_id)
                    reply = await client.execute(command, NoteWritten)
                    assert reply.version == i

            load = asyncio.gather(*(updates(user) for user in notes))

            # Freeze one worker in the middle of the load: what it has read stays pending with it.
            async def frozen_holding() -> list[dict[str, object]]:
                os.kill(doomed.process.pid, signal.SIGSTOP)  # type: ignore[union-attr]
                held = await redis.xpending_range(stream, channels.COMMAND_GROUP, "-", "+", 100, consumer_name(doomed))
                if not held:
                    os.kill(doomed.process.pid, signal.SIGCONT)  # type: ignore[union-attr]
                return held  # type: ignore[no-any-return]

            held = await eventually(frozen_holding, 60, 0.02, "the worker frozen holding requests")
            doomed.kill()
            # No caller retries (timeout 20 s): the survivor's reclaimer re-queues them after 1 s.
            await asyncio.wait_for(load, 60)

        events = await log_events(redis, 1)
        # Per-user order: each user's updates are in the log in the order the user sent them.
        for user, ids in sent.items():
            assert [e.command_id for e in events if e.user_id == user and e.version > 1] == ids
        assert len(events) == USERS * (UPDATES + 1)

        async def pending() -> dict[str, int]:
            consumers = await redis.xinfo_consumers(stream, channels.COMMAND_GROUP)
            return {c["name"].decode(): c["pending"] for c in consumers if c["pending"]}

        # Its pending requests were claimed; a request is acked just after its reply.
        await until_none(pending, what="requests pending, by consumer")
        assert len(held) > 0
    finally:
        for w in workers:
            w.kill()
        await redis.aclose()
        server.stop()
