"""`engram relay` as an operator runs it: a real `engram serve`, the relay as its own process
posting to a receiver on loopback, killed with SIGKILL midway and started again."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import msgspec
import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.redis_server import free_port
from engram_ledger.services.bus.client import EngramClient
from tests.integration.test_recalls import alter, user_log
from tests.integration.test_relay import SECRET, Receiver
from tests.support import ENGRAM_CLI, ROOT, ServeProcess, cli_text, engram_env, eventually

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
            await eventually(lambda: len(receiver.accepted) >= 20, 60, what="20 events delivered")
            relay.send_signal(signal.SIGKILL)  # mid-stream: posts in flight, acks not sent
            relay.wait(timeout=10)
            at_kill = len(receiver.accepted)
            await loading
        relay = subprocess.Popen(command, env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        expected = await log_events(redis_url)
        every = {i for i, _ in expected}
        await eventually(lambda: every <= {i for i, _, _ in receiver.seen}, 90, what="every event of the log delivered")
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


async def warm(client: EngramClient, token: str) -> None:
    """Once the index has the write ``token`` names: the model loads in the background at start
    (6-9 s warm, more from a cold disk cache), and a search waits for the token only 5 s."""

    async def searched() -> bool:
        try:
            await client.search("warm-up", "anything", after=token)
            return True
        except EngramError as e:
            if e.code is not ErrorCode.TIMEOUT:
                raise
            return False

    await eventually(searched, 300, what="the index at the token")


async def test_relay_and_tail_with_content_open_recalls_and_pass_over_an_event_that_does_not_open(
    redis_url: str, tmp_path: Path
) -> None:
    """With the recall audit on, `engram relay --content` posts each recall with its query open
    while the notes it names live, and `engram tail --content` prints it; a log entry that does
    not open (altered) is passed over with one line, acknowledged, and what follows still comes."""
    env = engram_env(ENGRAM_REDIS_URL=redis_url, ENGRAM_DATA_DIR=str(tmp_path / "data"), ENGRAM_RECALL_AUDIT="alice")
    secret_file = tmp_path / "relay.secret"
    secret_file.write_bytes(SECRET)
    receiver = Receiver(free_port(), fail_every=10**9)
    await receiver.start()
    serve = ServeProcess(env).start()
    command = [
        *(*ENGRAM_CLI, "relay", "--url", receiver.url, "--group", "hooks", "--content"),
        *("--secret-file", str(secret_file), "--from-start"),
    ]
    # To a file, not a pipe: a pipe nobody reads until the end fills, and the relay then blocks.
    stderr_file = tmp_path / "relay.stderr"
    with open(stderr_file, "w") as stderr_out:
        relay = subprocess.Popen(command, env=env, cwd=ROOT, stderr=stderr_out, text=True)
    try:
        async with EngramClient(redis_url, timeout=30) as client:
            alec = await client.save("alice", "Alec works at TechCorp", subject="Alec")
            await warm(client, alec.token)
            await client.search("alice", "where does Alec work now", min_relevance=0, after=alec.token)
            await client.context("alice", query="Alec", min_relevance=0, after=alec.token)
            recalls = [e for e in await user_log(redis_url, "alice") if e["type"] == "memory_recalled"]
            assert len(recalls) == 2
            altered = await alter(redis_url, recalls[0])
            later = await client.save("alice", "Alec moved to Lisbon", subject="Alec")
        await eventually(
            lambda: later.note_id in {b["event"]["note_id"] for b in receiver.bodies.values()},  # type: ignore[index]
            60,
            what="the note saved after the altered entry delivered",
        )
        assert relay.poll() is None, "the relay goes on"
        async with aioredis.Redis.from_url(redis_url) as redis:
            log = channels.event_log(channels.partition_of("alice", int(await redis.get(channels.PARTITIONS_KEY))))

            async def all_acked() -> bool:
                # Each entry is acked once its post is answered: the last may still be on its way.
                return (await redis.xpending(log, "hooks"))["pending"] == 0

            await eventually(all_acked, 30, what="every entry acked, the altered one too")
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=20) == 0
        await tail_passes_over(env, redis_url, altered)
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.wait()
        serve.stop()
        await receiver.stop()

    posted = {b["id"]: b["event"] for b in receiver.bodies.values()}
    assert altered not in posted
    assert {posted[r["event_id"]]["query"] for r in recalls} == {"where does Alec work now", "Alec"}  # type: ignore[index]
    stderr = stderr_file.read_text()
    said = [line for line in stderr.splitlines() if "passed over" in line]
    assert len(said) == 1 and altered in said[0], stderr


async def tail_passes_over(env: dict[str, str], redis_url: str, altered: str) -> None:
    """`engram tail --content` through a group of its own: every event but the altered one (which
    it acks all the same), recalls with their queries open."""
    shown = len(await user_log(redis_url, "alice")) - 1
    done = cli_text(env, "tail", "--from-start", "--content", "--json", "--group", "tail", "--user", "alice",
                    "--count", str(shown))  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert altered not in {line["event"]["event_id"] for line in lines}
    assert {(line["event"]["query"], line["content"]) for line in lines if line["type"] == "memory_recalled"} == {
        ("where does Alec work now", "open"),
        ("Alec", "open"),
    }
    async with aioredis.Redis.from_url(redis_url) as redis:
        log = channels.event_log(channels.partition_of("alice", int(await redis.get(channels.PARTITIONS_KEY))))
        assert (await redis.xpending(log, "tail"))["pending"] == 0
