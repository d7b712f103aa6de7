"""Helpers for tests that run `engram` as real processes, and for reading back what a service
stored (Redis values, history generations, index points, the event log). What tests build is in
tests/builders.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.channels import HistoryKeys
from engram_ledger.projections.index import PointsProjection
from engram_ledger.services.adapters.crypto import MasterKey
from engram_ledger.services.adapters.event_store import decode_event
from engram_ledger.services.adapters.redis_server import answers, find_redis_server, free_port
from engram_ledger.services.application.ports import EventStore
from engram_ledger.services.config import default_model_cache

# The engram CLI as a subprocess command line.
ENGRAM_CLI = (sys.executable, "-m", "engram_ledger.services.cli")
ROOT = Path(__file__).resolve().parent.parent
TEST_MASTER_KEY_B64 = base64.b64encode(bytes(range(32))).decode()


def master_key_for_tests() -> MasterKey:
    return MasterKey(base64.b64decode(TEST_MASTER_KEY_B64))


# The ONNX export of the model: the machine's, as a service's default (the set-up makes it).
TEST_MODEL_CACHE = default_model_cache()


def engram_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") and k != "REDIS_URL"}
    env["ENGRAM_MODEL_CACHE"] = str(TEST_MODEL_CACHE)
    env.update(values)
    env["PYTHONPATH"] = str(ROOT)
    return env


def die_with_parent() -> None:
    """In a child before it runs: killed when the process that started it dies (Linux), so a test
    worker killed mid-test (a time-out) leaves no service behind to answer the next tests."""
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class ServeProcess:
    """`engram serve` in a subprocess; waits for its ready line and keeps its log."""

    def __init__(self, env: dict[str, str], cwd: Path | None = None, roles: str = "all") -> None:
        self.env = env
        self.cwd = cwd or ROOT
        self.roles = roles
        self.lines: list[str] = []
        self.process: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 60.0, line: str = "engram serving on") -> ServeProcess:
        """Start it and wait for ``line`` in its log (by default, the one saying it serves)."""
        self.process = subprocess.Popen(
            [*ENGRAM_CLI, "serve", "--role", self.roles],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=die_with_parent,
        )
        ready: queue.Queue[bool] = queue.Queue()
        awaited = line

        def pump() -> None:
            assert self.process and self.process.stdout
            for line in self.process.stdout:
                self.lines.append(line)
                if awaited in line:
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


# In-process calls of the CLI share the process's environment and standard streams: one at a time.
_IN_PROCESS = threading.Lock()


@contextmanager
def python_environment(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` reads as exactly ``env`` for Python code until the block ends, the process's
    own (C) environment left as it is. Setting ``os.environ`` calls setenv/unsetenv, which free
    what a getenv of a native thread running meanwhile (a Redis client's resolver, ONNX Runtime,
    gRPC) may be reading: the test process died of a segmentation fault that way."""
    data: dict[bytes, bytes] = vars(os.environ)["_data"]
    saved = dict(data)
    data.clear()
    data.update({os.environ.encodekey(k): os.environ.encodevalue(v) for k, v in env.items()})
    try:
        yield
    finally:
        data.clear()
        data.update(saved)


def run_cli(env: dict[str, str], args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`engram ARGS` through its ``main(argv)`` in this process, as the subprocess would run it:
    with exactly ``env`` as its environment, stdout and stderr captured, the exit status as
    ``returncode``. It runs on a thread of its own, with an event loop of its own (``main`` calls
    ``asyncio.run``), so async tests may call it too. A few tests run the real executable
    (``ENGRAM_CLI``) for what only a process shows: argv bytes, a closed pipe, start-up."""
    from engram_ledger.services.cli import main

    outcome: dict[str, Any] = {}

    def call() -> None:
        out, err = io.StringIO(), io.StringIO()
        try:
            with python_environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    outcome["code"] = main(list(args))
                except SystemExit as e:  # --help, --version
                    outcome["code"] = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException as e:  # reported by the caller's thread
            outcome["error"] = e
        finally:
            outcome["out"], outcome["err"] = out.getvalue(), err.getvalue()

    if not _IN_PROCESS.acquire(timeout=timeout):
        raise subprocess.TimeoutExpired(["engram", *args], timeout)
    worker = threading.Thread(target=call, name="engram-cli", daemon=True)
    try:
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise subprocess.TimeoutExpired(["engram", *args], timeout)
    finally:
        if not worker.is_alive():  # a call still running keeps the lock: the next one times out
            _IN_PROCESS.release()
    if "error" in outcome:
        raise outcome["error"]
    return subprocess.CompletedProcess(["engram", *args], outcome["code"], outcome["out"], outcome["err"])


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> tuple[int, Any, str]:
    """Run `engram ARGS --json`; returns (exit code, parsed stdout, stderr)."""
    done = run_cli(env, [*args, "--json"], timeout)
    out = done.stdout.strip()
    return done.returncode, (json.loads(out) if out else None), done.stderr


def cli_text(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `engram ARGS` for its human output (no --json)."""
    return run_cli(env, list(args), timeout)


async def longest_stall(stop: asyncio.Event) -> float:
    """Until ``stop``: the longest the event loop went without running this task. A reader that
    spins on a dead connection without yielding freezes every other task of the process."""
    longest, last = 0.0, time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.05)
        now = time.monotonic()
        longest, last = max(longest, now - last), now
    return longest


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):  # type: ignore[no-untyped-def]
    """The first truthy answer of ``predicate``, asked until ``timeout`` (a bound for a busy
    machine): ``eventually`` for code that is not async."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout:g} s")
        time.sleep(interval)


async def eventually(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):  # type: ignore[no-untyped-def]
    """The first truthy answer of ``predicate`` (a function, or a coroutine function), asked
    until ``timeout``: a wait for a condition, never for a fixed time. The timeout is a bound
    for a busy machine, not an expectation."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout:g} s")
        await asyncio.sleep(interval)


async def serving_task(server: Any) -> asyncio.Task[None]:
    """``server`` (a ``uvicorn.Server``) serving on a task of its own, once it has started."""
    task = asyncio.create_task(server.serve())

    def started() -> bool:
        if task.done():
            task.result()  # its error, if it has one
            raise AssertionError("uvicorn stopped before it started")
        return bool(server.started)

    await eventually(started, what="uvicorn started")
    return task


async def until_none(find, timeout: float = 30.0, interval: float = 0.05, what: str = "nothing left"):  # type: ignore[no-untyped-def]
    """Asks ``find`` (a function, or a coroutine function) until it finds nothing (an empty or
    zero answer); a failure names what it still found. For what goes away a moment after a
    reply: a request stream trimmed, a pending entry acknowledged, plaintext scrubbed."""
    deadline = time.monotonic() + timeout
    while True:
        found = find()
        if asyncio.iscoroutine(found):
            found = await found
        if not found:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {found!r} after {timeout:g} s")
        await asyncio.sleep(interval)


def files_holding(root: Path, needles: list[bytes]) -> list[str]:
    """The files under ``root`` holding any of ``needles`` (paths relative to it). Runs of zero
    bytes (preallocated pages, which Qdrant and Redis files are mostly made of) are squeezed to
    one before searching: a needle never holds such a run, so none is missed, and the search is
    over what the files really hold."""
    found = []
    # os.walk passes over a folder removed while it looks (a running service rewrites its files).
    for folder, _, names in os.walk(root):
        for name in sorted(names):
            path = Path(folder) / name
            try:
                data = re.sub(rb"\x00{64,}", b"\x00", path.read_bytes())
            except (FileNotFoundError, IsADirectoryError):
                continue
            if any(needle in data for needle in needles):
                found.append(str(path.relative_to(root)))
    return found


async def every_value(redis: Any) -> AsyncIterator[tuple[bytes, bytes]]:
    """(key, blob) for every key name and value Redis holds: strings, hash fields and values,
    stream entry fields and values, and the members of sets, sorted sets and lists. A key of any
    other type fails the scan rather than being skipped."""
    async for key in redis.scan_iter(count=1000):
        kind = (await redis.type(key)).decode()
        blobs: list[bytes] = []
        if kind == "string":
            blobs = [await redis.get(key) or b""]
        elif kind == "hash":
            blobs = [k + b"=" + v for k, v in (await redis.hgetall(key)).items()]
        elif kind == "stream":
            blobs = [k + b"=" + v for _, fields in await redis.xrange(key) for k, v in fields.items()]
        elif kind == "zset":
            blobs = [m for m, _ in await redis.zrange(key, 0, -1, withscores=True)]
        elif kind == "set":
            blobs = list(await redis.smembers(key))
        elif kind == "list":
            blobs = list(await redis.lrange(key, 0, -1))
        elif kind != "none":  # "none": the key went away between SCAN and TYPE
            raise AssertionError(f"every_value cannot read {key!r} of type {kind}")
        for blob in [key, *blobs]:
            yield key, blob


async def holding(redis: Any, needles: list[bytes]) -> list[bytes]:
    """The Redis keys whose name or value (any part of it) holds any of ``needles``."""
    return sorted({key async for key, blob in every_value(redis) if any(n in blob for n in needles)})


async def leaked(redis_url: str, needle: bytes) -> list[bytes]:
    """The Redis keys whose name or value (any part of it) holds ``needle``."""
    redis = aioredis.Redis.from_url(redis_url)
    try:
        return [key async for key, blob in every_value(redis) if needle in blob]
    finally:
        await redis.aclose()


async def dump(redis: aioredis.Redis, partition: int, generation: int) -> dict[bytes, object]:
    """Every key of one history generation, with its value, keyed without the generation prefix."""
    prefix = HistoryKeys(partition, generation).prefix
    out: dict[bytes, object] = {}
    async for key in redis.scan_iter(match=f"{prefix}*"):
        kind = (await redis.type(key)).decode()
        if kind == "string":
            value: object = await redis.get(key)
        elif kind == "hash":
            value = await redis.hgetall(key)
        elif kind == "zset":
            value = await redis.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            value = sorted(await redis.smembers(key))
        else:
            raise AssertionError(kind)
        out[key[len(prefix) :]] = value
    return out


# What identifies an index point and what a search filters on.
POINT_FIELDS = ("user_id", "note_id", "chunk", "version", "status", "category", "subject_key", "kind")


def shape(payloads: list[dict]) -> list[tuple]:  # type: ignore[type-arg]
    """Index point payloads, reduced to their POINT_FIELDS and sorted: comparable across indexes."""
    return sorted(tuple(p.get(f) for f in POINT_FIELDS) for p in payloads)


async def log_events(url: str, partition: int = 0) -> list:  # type: ignore[type-arg]
    """The events in one partition's log, decoded, in log order."""
    r = aioredis.Redis.from_url(url)
    entries = await r.xrange(channels.event_log(partition))
    await r.aclose()
    return [decode_event(fields[b"e"]) for _, fields in entries]


@contextmanager
def redis_with_password(directory: Path, password: str) -> Iterator[int]:
    """A redis-server that refuses clients without ``password`` (requirepass); its port."""
    port = free_port()
    process = subprocess.Popen(
        [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password,
         "--save", "", "--appendonly", "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: answers(f"redis://:{password}@127.0.0.1:{port}/0"))
        yield port
    finally:
        process.terminate()
        process.wait(10)


async def replay_the_log(redis: aioredis.Redis, store: EventStore, projection: PointsProjection) -> None:
    """The whole log applied again to a projection that has applied it (promise 3: nothing
    changes): at or before its checkpoint, with its checkpoint lost (skipped by the notes'
    applied versions), then out of order (a note never goes back)."""
    everything = await store.read_log(projection.partition, "0", 10_000)
    await projection.apply(everything)
    await redis.delete(projection.keys.checkpoint)
    await projection.apply(everything)
    await redis.delete(projection.keys.checkpoint)
    await projection.apply(list(reversed(everything)))
