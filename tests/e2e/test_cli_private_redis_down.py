"""A user whose notes are in the private redis-server `engram serve` started: when it is down, the
CLI says which Redis, that it is not running and how to start it, and sends nothing anywhere else;
least of all to whatever answers at the default address, which here is a Redis of the test's own
(a spy) so that even a connection to it shows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from engram_ledger.contracts.errors import EngramError
from engram_ledger.services.adapters.private_files import private_dir
from engram_ledger.services.adapters.redis_server import RedisServer, free_port
from engram_ledger.services.config import Settings
from engram_ledger.services.ops.operator import PASSWORD_FILE, PRIVATE_URL_FILE, resolve_url
from engram_ledger.services.ops.serve import start_private_redis
from tests.support import ServeProcess, cli, cli_text, engram_env


class Spy:
    """A Redis at the default address that counts who connects to it (one watching connection,
    its own, held for the whole test)."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.server = RedisServer(directory, port=port).start()
        self.watch = redis.Redis.from_url(self.server.url)
        self.watch.ping()
        self.connections = self.seen()

    @property
    def url(self) -> str:
        return self.server.url

    def seen(self) -> int:
        return int(self.watch.info("stats")["total_connections_received"])

    def untouched(self) -> bool:
        return self.seen() == self.connections and self.watch.dbsize() == 0

    def stop(self) -> None:
        self.watch.close()
        self.server.stop()


@pytest.fixture
def spy(tmp_path: Path) -> Iterator[Spy]:
    spy = Spy(tmp_path / "spy")
    yield spy
    spy.stop()


def says_the_private_redis_is_down(message: str, data: Path) -> bool:
    return (
        "private Redis" in message
        and str(data / "redis") in message
        and "is not running" in message
        and "`engram serve`" in message
        and "`bash scripts/serve.sh`" in message
    )


def test_a_recorded_private_redis_that_is_down_is_named_and_the_default_address_gets_nothing(
    tmp_path: Path, spy: Spy
) -> None:
    data = private_dir(tmp_path / "data")
    private = start_private_redis(Settings(data_dir=data))
    private.kill()  # as a crash or a reboot leaves it: the URL still recorded
    assert (data / PRIVATE_URL_FILE).exists()
    env = engram_env(ENGRAM_DEFAULT_REDIS_URL=spy.url, ENGRAM_DATA_DIR=str(data))

    save = cli_text(env, "save", "--user", "zoe", "Zoe keeps bees on the roof")
    assert save.returncode == 1 and save.stdout == ""
    assert save.stderr.startswith("engram: UNAVAILABLE: ") and len(save.stderr.strip().splitlines()) == 1
    assert says_the_private_redis_is_down(save.stderr, data), save.stderr
    assert f"last at redis://:***@127.0.0.1:{private.port}/0" in save.stderr
    code, found, _ = cli(env, "search", "--user", "zoe", "bees")
    assert code == 1 and found["error"]["code"] == "UNAVAILABLE"
    assert says_the_private_redis_is_down(found["error"]["message"], data)
    password = (data / PASSWORD_FILE).read_text().strip()
    assert password not in save.stderr + found["error"]["message"]
    assert spy.untouched(), "the CLI reached the Redis at the default address"


def test_after_serve_stopped_the_cli_refuses_the_default_address_and_the_next_serve_starts_the_private_one(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    port = free_port()  # the default address: nothing there while serve first starts
    env = engram_env(
        ENGRAM_DEFAULT_REDIS_URL=f"redis://127.0.0.1:{port}/0", ENGRAM_DATA_DIR=str(data), ENGRAM_INDEX="off"
    )
    serve = ServeProcess(env).start()
    try:
        code, saved, _ = cli(env, "save", "--user", "zoe", "Zoe keeps bees on the roof")
        assert code == 0, saved
    finally:
        assert serve.stop() == 0
    assert not (data / PRIVATE_URL_FILE).exists(), "a clean stop removes the URL; the password stays"

    spy = Spy(tmp_path / "spy", port=port)  # someone starts a Redis at the default address
    try:
        code, listed, _ = cli(env, "list", "--user", "zoe")
        assert code == 1 and listed["error"]["code"] == "UNAVAILABLE"
        assert says_the_private_redis_is_down(listed["error"]["message"], data)

        serve = ServeProcess(env).start()
        try:
            assert any("keeps its notes in a private one: started a private redis-server" in s for s in serve.lines)
            code, listed, _ = cli(env, "list", "--user", "zoe", "--after", saved["token"])
            assert code == 0 and [n["content"] for n in listed["notes"]] == ["Zoe keeps bees on the roof"]
        finally:
            assert serve.stop() == 0
        assert spy.untouched(), "serve or the CLI reached the Redis at the default address"
    finally:
        spy.stop()


def test_an_explicit_url_wins_and_without_a_private_redis_the_default_address_is_used(tmp_path: Path, spy: Spy) -> None:
    data = private_dir(tmp_path / "data")
    assert resolve_url(Settings(redis_url=spy.url, data_dir=data)) == spy.url
    (data / PASSWORD_FILE).write_text("a private Redis was started here once\n")
    with pytest.raises(EngramError):
        resolve_url(Settings(redis_url=spy.url, data_dir=data))
    chosen = Settings(redis_url=spy.url, redis_url_configured=True, data_dir=data)
    assert resolve_url(chosen) == spy.url
    # Through the CLI too: `health` reads that Redis (no service runs there, so it says so).
    code, health, _ = cli(engram_env(ENGRAM_REDIS_URL=spy.url, ENGRAM_DATA_DIR=str(data)), "health")
    assert code == 1 and health["status"] == "down" and "is `engram serve` running?" in health["error"]
    assert spy.seen() > spy.connections, "ENGRAM_REDIS_URL is the user's choice"
