"""Helpers for tests that run `engram` as real processes."""

from __future__ import annotations

import base64
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from services.adapters.crypto import MasterKey

ROOT = Path(__file__).resolve().parent.parent
TEST_MASTER_KEY_B64 = base64.b64encode(bytes(range(32))).decode()


def master_key_for_tests() -> MasterKey:
    return MasterKey(base64.b64decode(TEST_MASTER_KEY_B64))


def engram_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") and k != "REDIS_URL"}
    env.update(values)
    env["PYTHONPATH"] = str(ROOT)
    return env


class ServeProcess:
    """`engram serve` in a subprocess; waits for its ready line and keeps its log."""

    def __init__(self, env: dict[str, str], cwd: Path | None = None, roles: str = "all") -> None:
        self.env = env
        self.cwd = cwd or ROOT
        self.roles = roles
        self.lines: list[str] = []
        self.process: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 30.0) -> ServeProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "serve", "--role", self.roles],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        ready: queue.Queue[bool] = queue.Queue()

        def pump() -> None:
            assert self.process and self.process.stdout
            for line in self.process.stdout:
                self.lines.append(line)
                if "engram serving on" in line:
                    ready.put(True)
            ready.put(False)

        threading.Thread(target=pump, daemon=True).start()
        try:
            if not ready.get(timeout=timeout):
                raise RuntimeError("engram serve exited:\n" + "".join(self.lines))
        except queue.Empty:
            self.kill()
            raise RuntimeError("engram serve did not become ready:\n" + "".join(self.lines)) from None
        return self

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> int:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                return self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode if self.process else 0


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> tuple[int, Any, str]:
    """Run `engram ARGS --json`; returns (exit code, parsed stdout, stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", *args, "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = done.stdout.strip()
    return done.returncode, (json.loads(out) if out else None), done.stderr


def cli_text(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `engram ARGS` for its human output (no --json)."""
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError("condition not met in time")


async def every_value(redis: Any) -> AsyncIterator[tuple[bytes, bytes]]:
    """(key, blob) for every key name and value Redis holds: strings, hash fields and values,
    stream entries, and the members of sets, sorted sets and lists."""
    async for key in redis.scan_iter(count=1000):
        kind = (await redis.type(key)).decode()
        blobs: list[bytes] = []
        if kind == "string":
            blobs = [await redis.get(key) or b""]
        elif kind == "hash":
            blobs = [k + b"=" + v for k, v in (await redis.hgetall(key)).items()]
        elif kind == "stream":
            blobs = [v for _, fields in await redis.xrange(key) for v in fields.values()]
        elif kind == "zset":
            blobs = [m for m, _ in await redis.zrange(key, 0, -1, withscores=True)]
        elif kind == "set":
            blobs = list(await redis.smembers(key))
        elif kind == "list":
            blobs = list(await redis.lrange(key, 0, -1))
        for blob in [key, *blobs]:
            yield key, blob
