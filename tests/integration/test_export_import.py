"""`engram export` / `engram import`: the raw log replays into an empty store, the projections
rebuild from it to the same state, forgotten notes stay forgotten and duplicates are still caught."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from services.adapters.crypto import load_master_key
from services.adapters.event_store import RedisEventStore
from services.adapters.redis_server import RedisServer
from services.bus.client import EngramClient
from services.ops.portable import export_log, import_log
from tests.conftest import RunningService, service_settings


async def test_an_export_replays_into_an_empty_store(service: RunningService, tmp_path: Path) -> None:
    async with EngramClient(service.settings.redis_url) as client:
        kept = await client.save("alice", "Alec is my boss", category="person", advise=False)
        await client.update("alice", kept.note_id, content="Alec was my boss")
        newer = await client.save("alice", "Priya is my boss now", category="person", advise=False)
        await client.supersede("alice", kept.note_id, newer.note_id)
        gone = await client.save("alice", "My locker code is 4417", advise=False)
        await client.forget("alice", note_ids=[gone.note_id], confirmed=True)
        keyed = await client.put("alice", "prefs", "tea", {"content": "green, no sugar"})
        last = keyed
        await client.get_note("alice", newer.note_id, after=last.token)
        before = await client.list_notes("alice", include_superseded=True)
        history = await client.history("alice", kept.note_id)
    source = aioredis.Redis.from_url(service.settings.redis_url)
    buffer = io.StringIO()
    try:
        counts = await export_log(source, 1, buffer)
    finally:
        await source.aclose()
    assert counts["events"] == 7 and counts["data_keys"] == 3, "the forgotten note has no key to export"
    for plain in ("4417", "Alec", "green, no sugar", "tea"):
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
            async with EngramClient(server.url) as client:
                await client.get_note("alice", newer.note_id, after=last.token)
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
