"""`engram relay` as an operator runs it: a real `engram serve`, the relay as its own process
posting to a receiver on loopback, killed with SIGKILL midway and started again."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections import Counter
from pathlib import Path

import msgspec
import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.services.adapters.redis_server import free_port
from engram_ledger.services.bus.client import EngramClient
from tests.integration.test_relay import SECRET, Receiver
from tests.support import ENGRAM_CLI, ROOT, ServeProcess, engram_env

pytestmark = pytest.mark.e2e


async def log_events(url: str) -> list[tuple[str, str]]:
    """(event id, note) of every event in the log, in log order per partition."""
    async with aioredis.Redis.from_url(url) as redis:
        partitions = int(await redis.get(channels.PARTITIONS_KEY))
        found = []
        for p in range(partitions):
            for _, fields in await redis.xrange(channels.event_log(p)):
                event = msgspec.json.decode(fields[b"e"])
                found.append((event["event_id"], f"{event['user_id']}/{event['note_id']}"))
        return found


async def until(predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), timeout)


async def test_a_relay_killed_midway_and_restarted_delivers_every_event_in_note_order(
    redis_url: str, tmp_path: Path
) -> None:
    env = engram_env(ENGRAM_REDIS_URL=redis_url, ENGRAM_DATA_DIR=str(tmp_path / "data"), ENGRAM_INDEX="off")
    secret_file = tmp_path / "relay.secret"
    secret_file.write_bytes(SECRET)
    receiver = Receiver(free_port(), fail_every=10, delay=0.02)
    await receiver.start()
    serve = ServeProcess(env).start()
    command = [
        *(*ENGRAM_CLI, "relay", "--url", receiver.url, "--group", "audit"),
        *("--secret-file", str(secret_file), "--from-start"),
    ]
    relay = subprocess.Popen(command, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        async with EngramClient(redis_url, timeout=30) as client:

            async def load() -> None:
                for n in range(120):
                    written = await client.save(f"user-{n % 3}", f"note number {n}")
                    if n % 4 == 0:
                        await client.update(f"user-{n % 3}", written.note_id, content=f"note number {n}, changed")

            loading = asyncio.create_task(load())
            await until(lambda: len(receiver.accepted) >= 20, 60)
            relay.send_signal(signal.SIGKILL)  # mid-stream: posts in flight, acks not sent
            relay.wait(timeout=10)
            at_kill = len(receiver.accepted)
            await loading
        relay = subprocess.Popen(command, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        expected = await log_events(redis_url)
        await until(lambda: {i for i, _ in expected} <= {i for i, _, _ in receiver.seen}, 90)
    finally:
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=20) == 0, relay.stderr.read() if relay.stderr else ""
        assert serve.stop() == 0
        await receiver.stop()

    assert receiver.bad_signatures == 0
    assert at_kill < len(expected), "the relay was killed before it had delivered everything"
    copies = Counter(i for i, _ in receiver.accepted)
    assert set(copies) == {i for i, _ in expected}, "every event of the log, and nothing else"
    # A second copy is only ever a post retried in the same run, or one the restarted relay
    # redelivers because the killed one had not acknowledged it.
    for event_id, attempt, redelivered in receiver.seen:
        if copies[event_id] > 1 and (event_id, attempt, redelivered) != receiver.first_seen(event_id):
            assert attempt > 1 or redelivered, (event_id, attempt, redelivered)
    # Each note's events arrived (first copies) in the log's order.
    first_arrival = {i: n for n, i in reversed(list(enumerate(i for i, _ in receiver.accepted)))}
    by_note: dict[str, list[str]] = {}
    for event_id, note in expected:
        by_note.setdefault(note, []).append(event_id)
    for note, ids in by_note.items():
        assert [first_arrival[i] for i in ids] == sorted(first_arrival[i] for i in ids), note
