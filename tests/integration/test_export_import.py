"""`engram export` / `engram import`: the raw log replays into an empty store, the projections
rebuild from it to the same state, forgotten notes stay forgotten and duplicates are still caught."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import msgspec
import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.base import SCHEMA_VERSION
from engram_ledger.services.adapters.crypto import load_master_key
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.ops.portable import export_log, import_log
from tests.builders import saved
from tests.conftest import RunningService, service_settings
from tests.support import master_key_for_tests


async def test_an_export_replays_into_an_empty_store(service: RunningService, tmp_path: Path) -> None:
    async with EngramClient(service.settings.redis_url, operator=True) as client:
        kept = await client.save("alice", "Alec is my boss", category="person", advise=False)
        await client.update("alice", kept.note_id, content="Alec was my boss")
        newer = await client.save("alice", "Priya is my boss now", category="person", advise=False)
        await client.supersede("alice", kept.note_id, newer.note_id)
        gone = await client.save("alice", "My locker code is 4417-quokka", advise=False)
        await client.forget("alice", note_ids=[gone.note_id], confirmed=True)
        keyed = await client.put("alice", "prefs", "tea", {"content": "green, no sugar"})
        last = keyed
        # Read through listings alone: a get counts a read, which a listing shows and an
        # export does not carry.
        before = await client.list_notes("alice", include_superseded=True, after=last.token)
        history = await client.history("alice", kept.note_id)
    source = aioredis.Redis.from_url(service.settings.redis_url)
    buffer = io.StringIO()
    try:
        counts = await export_log(source, 1, buffer)
    finally:
        await source.aclose()
    assert counts["events"] == 7 and counts["data_keys"] == 3, "the forgotten note has no key to export"
    # Words no id or digest can hold by chance (a hex id may hold "4417").
    for plain in ("4417-quokka", "Alec", "green, no sugar", "tea"):
        assert plain not in buffer.getvalue(), f"{plain!r}: content, keys and values stay sealed"

    server = RedisServer(tmp_path / "redis").start()
    try:
        target = aioredis.Redis.from_url(server.url)
        try:
            store = RedisEventStore(target, 1, 0, load_master_key(tmp_path))
            buffer.seek(0)
            imported = await import_log(target, store, buffer)
            assert imported == {"events": 7, "data_keys": 3, "content_claims": 2}
            buffer.seek(0)
            with pytest.raises(ValueError, match="not empty"):
                await import_log(target, store, buffer)
        finally:
            await target.aclose()
        running = await RunningService(service_settings(server.url, index_enabled=False)).start()
        try:
            async with EngramClient(server.url, operator=True) as client:
                # Waits for the import through a listing: a get would count a read, which a
                # listing shows and an export does not carry.
                await client.list_notes("alice", after=last.token)
                assert await client.list_notes("alice", include_superseded=True) == before
                assert await client.history("alice", kept.note_id) == history
                assert (await client.get_note("alice", gone.note_id)).status == "forgotten"
                again = await client.save("alice", "priya is my  boss now", advise=False)
                assert again.duplicate and again.note_id == newer.note_id
                # The key is still held: a put updates the imported note.
                assert (await client.get_by_key("alice", "prefs", "tea")).id == keyed.note_id  # type: ignore[union-attr]
                moved = await client.put("alice", "prefs", "tea", {"content": "black"})
                assert (moved.note_id, moved.version) == (keyed.note_id, 2)
        finally:
            await running.stop()
    finally:
        server.stop()


def _export(*items: dict[str, object], partitions: int = 1) -> list[str]:
    header = {"engram_export": 1, "partitions": partitions, "schema_version": SCHEMA_VERSION}
    return [json.dumps(header), *(json.dumps(item) for item in items)]


def _entry(entry_id: str, event: object, p: int = 0) -> dict[str, object]:
    return {"p": p, "id": entry_id, "e": msgspec.json.encode(event).decode()}


WRAPPED = base64.b64encode(master_key_for_tests().wrap(bytes(32), "alice/AAAAAAAA")).decode()
GOOD = _export(
    _entry("1-0", saved("AAAAAAAA")),
    _entry("2-0", saved("BBBBBBBB", content="Priya is my boss")),
    {"p": 0, "dek": {"user": "alice", "note": "AAAAAAAA", "wrapped": WRAPPED}},
)
BOB_PARTITION = channels.partition_of("bob", 2)
TAMPERED = {
    "not an export": (["[1]", *GOOD[1:]], 1, "not a JSON object"),
    "a partition count that is text": (
        [GOOD[0].replace('"partitions": 1', '"partitions": "1"'), *GOOD[1:]],
        1,
        "partitions '1'",
    ),
    "a partition out of range": ([GOOD[0], GOOD[1].replace('"p": 0', '"p": 1'), *GOOD[2:]], 2, "partition 1 is not"),
    "a user id out of the pattern": (
        [*GOOD[:2], json.dumps(_entry("2-0", saved("BBBBBBBB", user_id="bob}:{0"))), GOOD[3]],
        3,
        "user id 'bob}:{0'",
    ),
    "a note id out of the pattern": (
        [*GOOD[:2], json.dumps(_entry("2-0", saved("../../x"))), GOOD[3]],
        3,
        "note id '../../x'",
    ),
    "an event that is no contract": (
        [*GOOD[:2], json.dumps({"p": 0, "id": "2-0", "e": '{"type": "note_saved", "user_id": "alice"}'}), GOOD[3]],
        3,
        "not one of the contract's: Object missing required field",
    ),
    "a malformed entry id": ([GOOD[0], GOOD[1].replace('"1-0"', '"1-0-0"'), *GOOD[2:]], 2, "entry id '1-0-0'"),
    "entry ids out of order": ([GOOD[0], GOOD[1].replace('"1-0"', '"3-0"'), *GOOD[2:]], 3, "entry id '2-0'"),
    "a version gap": (
        [*GOOD[:2], json.dumps(_entry("2-0", saved("AAAAAAAA", version=3))), GOOD[3]],
        3,
        "version 3 after 1",
    ),
    "a user in another partition": (
        _export(_entry("1-0", saved("AAAAAAAA", user_id="bob"), p=1 - BOB_PARTITION), partitions=2),
        2,
        f"belongs to partition {BOB_PARTITION}",
    ),
    "a data key of another user's form": (
        [*GOOD[:3], GOOD[3].replace('"user": "alice"', '"user": "al ice"')],
        4,
        "user id 'al ice'",
    ),
    "a data key that is not base64": ([*GOOD[:3], GOOD[3].replace(WRAPPED, "!!")], 4, "not base64"),
    "a line of another shape": ([*GOOD, json.dumps({"p": 0, "e": "{}"})], 5, "neither a log entry"),
}


async def test_a_tampered_export_is_refused_naming_its_line_before_anything_is_written(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    target = aioredis.Redis.from_url(server.url)
    try:
        store = RedisEventStore(target, 1, 0, load_master_key(tmp_path))
        for case, (lines, number, reason) in TAMPERED.items():
            with pytest.raises(ValueError, match=rf"^line {number}: ") as refused:
                await import_log(target, store, io.StringIO("\n".join(lines) + "\n"))
            assert reason in str(refused.value), (case, str(refused.value))
            assert await target.dbsize() == 0, f"{case}: nothing is written"
        imported = await import_log(target, store, io.StringIO("\n".join(GOOD) + "\n"))
        assert imported == {"events": 2, "data_keys": 1, "content_claims": 2}
    finally:
        await target.aclose()
        server.stop()
