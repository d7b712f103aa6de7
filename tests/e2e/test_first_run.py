"""A new user's first run on a machine with no Redis: ``scripts/serve.sh`` from the repository
starts a private redis-server under the user's state directory, and ``engram`` finds it from
any directory, before whatever answers at the default address."""

from __future__ import annotations

import json
import os
import queue
import signal
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from engram_ledger.services.adapters.redis_server import RedisServer, free_port
from tests.support import ROOT, TEST_MODEL_CACHE, wait_until


class ServeScript:
    """``bash scripts/serve.sh`` as a user runs it; its output kept."""

    def __init__(self, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            ["bash", "scripts/serve.sh"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.ready: queue.Queue[bool] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if "engram serving on" in line:
                self.ready.put(True)
        self.ready.put(False)

    def wait_ready(self, timeout: float = 120) -> None:
        try:
            ok = self.ready.get(timeout=timeout)
        except queue.Empty:
            ok = False
        assert ok, "serve.sh did not start:\n" + "".join(self.lines)

    def stop(self) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                return self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.wait()


@pytest.fixture
def new_user(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A user's environment: a home of their own, no ENGRAM_* settings, and nothing answering at
    the default address."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAM_", "XDG_")) and k != "REDIS_URL"}
    env.update(
        HOME=str(home),
        ENGRAM_DEFAULT_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        # The model's ONNX export is made once for the whole suite, not once per test.
        ENGRAM_MODEL_CACHE=str(TEST_MODEL_CACHE),
        HF_HUB_OFFLINE="1",
    )
    yield env


def engram(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / ".venv" / "bin" / "engram"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_sh_without_redis_starts_its_own_and_the_cli_finds_it_anywhere(
    new_user: dict[str, str], tmp_path: Path
) -> None:
    serve = ServeScript(new_user)
    decoy: RedisServer | None = None
    try:
        serve.wait_ready()
        data_dir = Path(new_user["HOME"]) / ".local" / "state" / "engram"
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
        assert (data_dir / "redis.url").exists()
        assert str(data_dir) in "".join(serve.lines)

        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        # Someone else starts a Redis at the default address: the CLI still goes to the service's.
        port = int(new_user["ENGRAM_DEFAULT_REDIS_URL"].rsplit(":", 1)[1].split("/")[0])
        decoy = RedisServer(tmp_path / "decoy", port=port).start()

        saved = engram(new_user, elsewhere, "save", "--json", "--user", "zoe", "Zoe keeps bees on the roof")
        assert saved.returncode == 0, saved.stdout + saved.stderr
        token = json.loads(saved.stdout)["token"]

        def found() -> list[str]:
            done = engram(new_user, elsewhere, "search", "--json", "--user", "zoe", "--after", token, "bees")
            if done.returncode != 0:
                return []
            return [hit["content"] for hit in json.loads(done.stdout)["results"]]

        assert wait_until(found, timeout=60, interval=1) == ["Zoe keeps bees on the roof"]
        with redis.Redis(port=port) as spy:
            assert spy.dbsize() == 0, "a write went to the Redis at the default address"

        # A data dir that other users may write is refused: they could point us at their Redis.
        data_dir.chmod(0o777)
        refused = engram(new_user, elsewhere, "list", "--user", "zoe")
        data_dir.chmod(0o700)
        assert refused.returncode == 1
        assert "PERMISSION_DENIED" in refused.stderr and "open to other users" in refused.stderr
    finally:
        if decoy is not None:
            decoy.stop()
        assert serve.stop() == 0, "".join(serve.lines)
    assert not (Path(new_user["HOME"]) / ".local" / "state" / "engram" / "redis.url").exists()
