"""The embedded default keeps Redis's append-only file under the data dir: after a forget, no
file there may hold the plaintext (the AOF is rewritten once the read model has dropped it)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.adapters.redis_server import RedisServer
from services.bus.client import EngramClient
from tests.conftest import RunningService, service_settings


async def test_no_file_under_the_data_dir_holds_a_forgotten_text(tmp_path: Path) -> None:
    secret = "The alarm code for the Pacific Heights flat is 8093-zebra"
    server = RedisServer(tmp_path / "redis", appendfsync="always").start()
    running = await RunningService(service_settings(server.url, data_dir=tmp_path, index_enabled=False)).start()
    try:
        async with EngramClient(server.url) as client:
            note = (await client.save("alice", secret)).note_id
            await client.get_note("alice", note, after=(await client.save("alice", "I like tea")).token)
            aof = b"".join(p.read_bytes() for p in (tmp_path / "redis").rglob("*") if p.is_file())
            assert secret.encode() in aof, "before the forget the AOF holds the read model's copy"
            await client.forget("alice", note_ids=[note], confirmed=True)
        # The scrub runs once the forget is acknowledged; the rewrite in the background.
        for _ in range(200):
            leaks = [p for p in tmp_path.rglob("*") if p.is_file() and b"8093-zebra" in p.read_bytes()]
            if not leaks:
                break
            await asyncio.sleep(0.05)
        assert leaks == []
    finally:
        await running.stop()
        server.stop()
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and b"8093-zebra" in p.read_bytes()]
