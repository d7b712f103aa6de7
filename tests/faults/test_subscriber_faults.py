"""A subscriber SIGKILLed mid-stream and started again: every event of the log reaches it at least
once, and once it has caught up (acking after processing) it has processed exactly the log's
events, each note's in order, content opened for notes not forgotten, nothing left pending.

A private redis-server (AOF always), `engram serve` (3 partitions, index off) and the subscriber
(tests/faults/subscriber_worker.py) are separate processes; a writer keeps saving, updating and
forgetting notes, and erases a whole user, while the subscriber is killed and restarted."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError
from engram_ledger.services.adapters.event_store import decode_event
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from tests.support import ROOT, TEST_MASTER_KEY_B64, ServeProcess, engram_env, eventually, until_none, wait_until

PARTITIONS = 3
USERS = [f"user-{i}" for i in range(8)]
GROUP = "crm-sync"


def records(path: Path) -> list[dict[str, Any]]:
    """The lines the subscriber has written whole: one it is writing as this reads is not yet."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def start_subscriber(env: dict[str, str], url: str, out: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.subscriber_worker", url, GROUP, str(out), "--delay-ms", "4"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "subscribed"
    return process


async def write(client: EngramClient, texts: dict[str, str], forgotten: set[str], done: asyncio.Event) -> None:
    """Saves, updates and forgets from four callers at once, then erases one user. ``texts``:
    each note's latest content; ``forgotten``: the notes forgotten."""
    rng = random.Random(7)
    notes: dict[str, list[str]] = defaultdict(list)

    async def caller(k: int) -> None:
        for i in range(90):
            user = USERS[(k + 4 * i) % len(USERS)]
            choice = rng.random()
            try:
                if choice < 0.5 or not notes[user]:
                    text = f"{user} note {k}-{i}"
                    reply = await client.save(user, text)
                    notes[user].append(reply.note_id)
                    texts[reply.note_id] = text
                elif choice < 0.85:
                    note = rng.choice(notes[user])
                    text = f"{user} update {k}-{i}"
                    await client.update(user, note, content=text)
                    texts[note] = text
                else:
                    note = notes[user].pop(rng.randrange(len(notes[user])))
                    await client.forget(user, note_ids=[note], confirmed=True)
                    forgotten.add(note)
            except EngramError:
                pass  # a note forgotten by another caller meanwhile: nothing was written
            await asyncio.sleep(0.02)  # paces the writer

    await asyncio.gather(*(caller(k) for k in range(4)))
    erased = await client.forget_user(USERS[0], confirmed=True)
    forgotten.update(erased.forgotten)
    done.set()


async def the_log(url: str) -> list[tuple[str, Any]]:
    redis = aioredis.Redis.from_url(url)
    out = []
    for p in range(PARTITIONS):
        for entry_id, fields in await redis.xrange(channels.event_log(p)):
            out.append((channels.format_token(p, entry_id.decode()), decode_event(fields[b"e"])))
    await redis.aclose()
    return out


async def test_a_subscriber_killed_mid_stream_ends_with_exactly_the_logs_events_in_note_order(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", appendfsync="always").start()
    env = engram_env(
        ENGRAM_REDIS_URL=server.url,
        ENGRAM_DATA_DIR=str(tmp_path / "data"),
        ENGRAM_PARTITIONS=str(PARTITIONS),
        ENGRAM_INDEX="off",
        ENGRAM_MASTER_KEY=TEST_MASTER_KEY_B64,
    )
    serve = ServeProcess(env).start()
    out = tmp_path / "processed.jsonl"
    subscriber = start_subscriber(env, server.url, out)
    texts: dict[str, str] = {}
    forgotten: set[str] = set()
    done = asyncio.Event()
    try:
        async with EngramClient(server.url, timeout=15, operator=True) as client:
            writer = asyncio.create_task(write(client, texts, forgotten, done))
            await eventually(lambda: len(records(out)) >= 120, 60, 0.01, "120 events processed")
            subscriber.kill()  # SIGKILL, mid-stream: the writer is still writing
            subscriber.wait()
            assert not done.is_set(), "killed while events were still being written"
            before = len(records(out))
            await asyncio.sleep(0.5)  # down a while: the writer goes on without it
            subscriber = start_subscriber(env, server.url, out)
            await writer
        log = await the_log(server.url)
        tokens = {token for token, _ in log}
        wait_until(lambda: {r["token"] for r in records(out)} >= tokens, timeout=90, interval=0.2)
        redis = aioredis.Redis.from_url(server.url)

        async def pending() -> list[int]:
            counts = [(await redis.xpending(channels.event_log(p), GROUP))["pending"] for p in range(PARTITIONS)]
            return counts if any(counts) else []

        # A line is written before its ack: the last acks follow the last lines. Everything
        # processed is acked.
        try:
            await until_none(pending, 60, interval=0.1, what="entries processed and not acked, by partition")
        finally:
            await redis.aclose()
    finally:
        subscriber.kill()
        serve.kill()
        server.stop()

    got = records(out)
    assert before < len(log), "the first run was killed before the end of the log"
    # At least once, and nothing that is not in the log.
    assert {r["token"] for r in got} == tokens
    repeats = [t for t, n in Counter(r["token"] for r in got).items() if n > 1]
    assert all(r["redelivered"] for r in got[before:] if r["token"] in repeats), "a repeat says it is one"
    # Exactly the log's events, in each note's order: first sightings, note by note, are the log's.
    first: dict[str, dict[str, Any]] = {}
    for r in got:
        first.setdefault(r["token"], r)
    seen: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r in got:
        versions = seen[(r["user"], r["note"])]
        if r["version"] not in versions:
            versions.append(r["version"])
    in_log: dict[tuple[str, str], list[int]] = defaultdict(list)
    for _, event in log:
        in_log[(event.user_id, event.note_id)].append(event.version)
    assert seen == in_log and all(v == list(range(1, len(v) + 1)) for v in seen.values())
    # Content: open for a note never forgotten, gone for one forgotten before it was read.
    for r in first.values():
        if r["type"] in ("note_saved", "note_updated") and r["content"] is not None:
            assert r["content_state"] in ("open", "erased")
        if r["note"] in texts and r["note"] not in forgotten and r["type"] == "note_saved":
            assert r["content_state"] == "open" and r["content"].startswith(r["user"])
        if r["content_state"] == "erased":
            assert r["note"] in forgotten and r["content"] == ""
    latest = {(r["note"]): r["content"] for r in first.values() if r["content_state"] == "open" and r["content"]}
    assert all(latest[n] == text for n, text in texts.items() if n not in forgotten and n in latest)
