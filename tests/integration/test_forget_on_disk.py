"""The embedded default keeps Redis's append-only file and the Qdrant Edge shard under the data
dir: after a forget, no file there may hold the plaintext, content or subject (the AOF is
rewritten once the read model has dropped it; the index never held either)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService, service_settings

# Generous: in one full CI run on a slow evening the start-up scrub was still owed after 10 s (its
# cause not seen; a failure now says what held it). What is checked is what is on disk, not how soon.
SETTLE_SECONDS = 60.0


async def why_not_settled(running: RunningService, redis: aioredis.Redis, redis_log: Path) -> str:
    """What kept the start-up scrub owed: a pending command, the history behind the log, or an
    AOF rewrite that would not start (Redis's log says why); pytest adds what the scrubber logged."""
    engram = running.engram
    scrubber = engram.scrubber
    assert scrubber is not None
    persistence = await redis.info("persistence")
    lag = [
        (p, (await engram.store.log_head(p))[0], await engram.history.checkpoint(p))
        for p in range(engram.settings.partitions)
    ]
    return (
        f"quiet={await scrubber._quiet()} commands pending={await scrubber._commands_pending()} "
        f"(partition, log head, history checkpoint)={lag} "
        f"aof_rewrite_in_progress={persistence.get('aof_rewrite_in_progress')} "
        f"aof_rewrite_scheduled={persistence.get('aof_rewrite_scheduled')}\n"
        f"redis.log ends:\n{''.join(redis_log.read_text().splitlines(keepends=True)[-15:])}"
    )


async def test_no_file_under_the_data_dir_holds_a_forgotten_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="engram.scrub")
    secret = "The alarm code for the Pacific Heights flat is 8093-zebra"
    subject = "Wilhelmina Cartwright-Oduya"
    needles = [b"8093-zebra", b"Wilhelmina", b"wilhelmina", b"Cartwright"]
    server = RedisServer(tmp_path / "redis", appendfsync="always").start()
    running = await RunningService(service_settings(server.url, data_dir=tmp_path)).start()

    def leaks() -> list[Path]:
        return [p for p in tmp_path.rglob("*") if p.is_file() and any(n in p.read_bytes() for n in needles)]

    try:
        # A service starts owing a scrub (one a crash may have cut short) and settles it in its
        # first quiet moment; a rewrite after the saves below would take away what this test
        # checks is there before the forget.
        async with aioredis.Redis.from_url(server.url) as redis:
            deadline = asyncio.get_running_loop().time() + SETTLE_SECONDS
            while await redis.get(channels.SCRUB_OWED_KEY) is not None:
                if asyncio.get_running_loop().time() > deadline:
                    why = await why_not_settled(running, redis, server.directory / "redis.log")
                    pytest.fail(f"the start-up scrub did not settle: {why}")
                await asyncio.sleep(0.05)
        async with EngramClient(server.url, operator=True) as client:
            note = (await client.save("alice", secret, subject=subject)).note_id
            tea = await client.save("alice", "I like tea", advise=False)
            await client.search("alice", "tea", after=tea.token)
            aof = b"".join(p.read_bytes() for p in (tmp_path / "redis").rglob("*") if p.is_file())
            assert secret.encode() in aof, "before the forget the AOF holds the read model's copy"
            assert subject.encode() in aof, "and the subject"
            await client.forget("alice", note_ids=[note], confirmed=True)
        # The scrub runs once the forget is acknowledged; the rewrite in the background.
        deadline = asyncio.get_running_loop().time() + SETTLE_SECONDS
        while leaks() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        assert leaks() == []
    finally:
        await running.stop()
        server.stop()
    assert leaks() == []
