"""Master-key rotation against real Redis and a running service (in-process): the compare-and-set
that keeps a note forgotten during the pass forgotten, resuming from the cursor after a crash,
keyed lookups and subject filters that still match once only the new key is left, and an export
of a rotated store that imports with the new key alone."""

from __future__ import annotations

import base64
import io
import os
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.crypto import load_master_key, wrapped_generation
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.adapters.keyring import read_state
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bootstrap import ConfigurationError
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.observability.health import live_workers
from engram_ledger.services.ops import keys
from engram_ledger.services.ops.portable import export_log, import_log
from engram_ledger.services.ops.rebuild import rebuild_history
from tests.conftest import RunningService, service_settings
from tests.support import eventually

OLD, NEW = os.urandom(32), os.urandom(32)


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


@pytest.fixture
def key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every keyring of the test (the services' and the rotation's) reads this file, as one
    machine's workers and CLI share the data dir's."""
    path = tmp_path / "master.keys"
    path.write_text(f"{b64(OLD)}\n")
    path.chmod(0o600)
    monkeypatch.delenv("ENGRAM_MASTER_KEY", raising=False)
    monkeypatch.setenv("ENGRAM_MASTER_KEY_FILE", str(path))
    yield path


def only(monkeypatch: pytest.MonkeyPatch, keyring: str) -> None:
    monkeypatch.delenv("ENGRAM_MASTER_KEY_FILE", raising=False)
    monkeypatch.setenv("ENGRAM_MASTER_KEYS", keyring)


@pytest.fixture
async def service(redis_url: str, key_file: Path) -> AsyncIterator[RunningService]:
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    yield running
    await running.stop()


async def wrapped_keys(url: str, user: str, note_ids: list[str]) -> list[bytes | None]:
    r = aioredis.Redis.from_url(url)
    try:
        return list(await r.mget([channels.data_key(0, user, n) for n in note_ids]))
    finally:
        await r.aclose()


async def test_a_note_forgotten_between_the_read_and_the_rewrap_stays_forgotten(
    service: RunningService, key_file: Path
) -> None:
    url = service.settings.redis_url
    async with EngramClient(url, operator=True) as client:
        notes = [(await client.save("alice", f"note {i}", advise=False)).note_id for i in range(3)]
    victim = channels.data_key(0, "alice", notes[1])
    sync = redis.Redis.from_url(url)
    rotating = load_master_key(service.settings.data_dir)
    rewrap = rotating.rewrap

    def forgotten_meanwhile(wrapped: bytes, label: str, generation: int) -> bytes:
        # The forget's deletion lands after the pass read the key and before it writes it back.
        if label == f"alice/{notes[1]}":
            sync.delete(victim)
        return rewrap(wrapped, label, generation)

    rotating.rewrap = forgotten_meanwhile  # type: ignore[method-assign]
    r = aioredis.Redis.from_url(url)
    try:
        done = await keys.rotate(r, rotating, 1, wait_seconds=10)
    finally:
        await r.aclose()
        sync.close()
    assert (done["from"], done["to"], done["rewrapped"], done["forgotten_meanwhile"]) == (1, 2, 2, 1)
    first, second, third = await wrapped_keys(url, "alice", notes)
    assert second is None, "the compare-and-set wrote nothing over the deleted key"
    assert first is not None and third is not None
    assert wrapped_generation(first) == wrapped_generation(third) == 2


async def test_a_crashed_rotation_resumes_from_its_cursor_and_reads_never_stop(
    service: RunningService, key_file: Path
) -> None:
    url = service.settings.redis_url
    async with EngramClient(url, operator=True) as client:
        saved = [await client.save("bob", f"fact number {i}", advise=False) for i in range(30)]
        ids = [s.note_id for s in saved]
        crashing = load_master_key(service.settings.data_dir)
        rewrap, calls = crashing.rewrap, [0]

        def crash_in_the_third_round(wrapped: bytes, label: str, generation: int) -> bytes:
            calls[0] += 1
            if calls[0] > 10:
                raise RuntimeError("killed")
            return rewrap(wrapped, label, generation)

        crashing.rewrap = crash_in_the_third_round  # type: ignore[method-assign]
        r = aioredis.Redis.from_url(url)
        try:
            with pytest.raises(RuntimeError, match="killed"):
                await keys.rotate(r, crashing, 1, batch=5, wait_seconds=10)
            state = await read_state(r)
            assert (state.active, state.target, state.phase) == (2, 2, "rewrap")
            cursor = await r.get(keys.cursor_key(0, "rotate-2"))
            assert cursor is not None and cursor.decode() == saved[9].token.split(":", 1)[1]
            generations = [wrapped_generation(w) for w in await wrapped_keys(url, "bob", ids) if w is not None]
            assert generations == [2] * 10 + [1] * 20, "two rounds done, each with its cursor"
            # Both generations are live meanwhile: every note reads, and new ones are written.
            for s in saved:
                assert (await client.get_note("bob", s.note_id)).content.startswith("fact number")
            during = await client.save("bob", "written mid-rotation", advise=False)
            (wrapped,) = await wrapped_keys(url, "bob", [during.note_id])
            assert wrapped is not None and wrapped_generation(wrapped) == 2, "new keys go under the new generation"

            resumed = await keys.rotate(r, load_master_key(service.settings.data_dir), 1, batch=5, wait_seconds=10)
            assert resumed["resumed"] is True and (resumed["from"], resumed["to"]) == (1, 2)
            assert resumed["rewrapped"] == 20
            assert resumed["events_read"] == 21, "from the cursor on (20 saves and the one since), not from the start"
            assert resumed["key_file"] is None, "the generation added before the crash is the one used"
            state = await read_state(r)
            assert (state.active, state.target, state.previous, sorted(state.roots)) == (2, None, 1, [2])
            assert await r.get(keys.cursor_key(0, "rotate-2")) is None
            status = await keys.status(r, load_master_key(service.settings.data_dir), 1)
            assert status["generation"] == 2 and status["rotation"] is None
            assert [w["key_generation"] for w in status["workers"]] == [2]
        finally:
            await r.aclose()
    text = key_file.read_text().splitlines()
    assert text[0] == b64(OLD) and text[1].startswith("2:") and len(text) == 2


async def test_one_rotation_at_a_time_a_killed_ones_claim_is_taken_over_and_variables_need_the_operator(
    service: RunningService, key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = service.settings.redis_url
    r = aioredis.Redis.from_url(url)
    try:
        await r.set(keys.LOCK_KEY, "elsewhere/1/x", px=5_000)
        with pytest.raises(EngramError) as busy:
            await keys.rotate(r, load_master_key(service.settings.data_dir), 1)
        assert busy.value.code is ErrorCode.UNAVAILABLE and "elsewhere/1/x" in busy.value.message
        assert (await read_state(r)).target is None, "nothing started"
        # A claim left by a process of this host that is gone (killed) is taken over at once.
        dead = subprocess.Popen(["true"])
        dead.wait()
        await r.set(keys.LOCK_KEY, f"{socket.gethostname()}/{dead.pid}/x", px=60_000)
        done = await keys.rotate(r, load_master_key(service.settings.data_dir), 1, wait_seconds=10)
        assert (done["to"], await r.get(keys.LOCK_KEY)) == (2, None)
    finally:
        await r.aclose()
    # A keyring from a variable cannot gain a generation by itself: the operator adds it.
    only(monkeypatch, f"1:{b64(OLD)},2:{key_file.read_text().splitlines()[1].split(':', 1)[1]}")
    with pytest.raises(EngramError) as fixed:
        await keys.run_keys(service.settings, "rotate")
    assert fixed.value.code is ErrorCode.INVALID_PARAMETER
    assert "add generation 3 there (ENGRAM_MASTER_KEYS=...,3:" in fixed.value.message


async def test_keyed_lookups_and_subject_filters_match_with_the_new_key_alone(
    redis_url: str, key_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hashes the read model and the index store were keyed by generation 1's derivation:
    after a rotation, a service holding only generation 2 must derive the very same keys."""
    settings = service_settings(redis_url, data_dir=tmp_path / "data")
    running = await RunningService(settings).start()
    try:
        async with EngramClient(redis_url, operator=True) as client:
            about = await client.save("carol", "Sarah Smith runs the Lisbon office", subject="Sarah Smith")
            put = await client.put("carol", "contacts", "sarah@example.com", {"content": "prefers email"})
            gone = await client.save("carol", "My locker code is 4417", advise=False)
            await client.get_note("carol", gone.note_id, after=gone.token)
            r = aioredis.Redis.from_url(redis_url)
            try:
                rotated = await keys.rotate(r, load_master_key(settings.data_dir), 1, wait_seconds=10)
            finally:
                await r.aclose()
            assert rotated["rewrapped"] == 3
            await client.forget("carol", note_ids=[gone.note_id], confirmed=True)
    finally:
        await running.stop()

    new_key = key_file.read_text().splitlines()[1]
    only(monkeypatch, f"1:{b64(OLD)}")  # the old key alone no longer opens this store
    with pytest.raises(ConfigurationError, match=r"generation 2, which this keyring .* does not hold"):
        await RunningService(service_settings(redis_url, index_enabled=False, data_dir=tmp_path / "x")).start()
    only(monkeypatch, new_key)  # generation 2 alone: generation 1's key is gone
    running = await RunningService(settings).start()
    try:
        async with EngramClient(redis_url, operator=True) as client:
            found = await client.get_by_key("carol", "contacts", "sarah@example.com")
            assert found is not None and found.id == put.note_id and found.value == {"content": "prefers email"}
            hits = await client.search("carol", "who runs the office", subject="sarah  SMITH")
            assert [h.note_id for h in hits.results] == [about.note_id]
            assert hits.results[0].content == "Sarah Smith runs the Lisbon office"
            tombstone = await client.get_note("carol", gone.note_id)
            assert tombstone.status == "forgotten" and tombstone.content == ""
            # A read model rebuilt by a process holding only generation 2 hashes the same.
            r = aioredis.Redis.from_url(redis_url)
            try:
                await rebuild_history(r, settings, 1, lambda what, total: _NoBar())
            finally:
                await r.aclose()
            again = await client.get_by_key("carol", "contacts", "sarah@example.com")
            assert again is not None and again.id == put.note_id
    finally:
        await running.stop()


class _NoBar:
    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def update(self, n: int) -> None:
        pass


async def test_an_export_of_a_rotated_store_imports_with_the_new_key_alone(
    service: RunningService, key_file: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with EngramClient(redis_url, operator=True) as client:
        put = await client.put("dave", "prefs", "tea", {"content": "green, no sugar"})
        r = aioredis.Redis.from_url(redis_url)
        try:
            await keys.rotate(r, load_master_key(service.settings.data_dir), 1, wait_seconds=10)
            buffer = io.StringIO()
            await export_log(r, 1, buffer)
        finally:
            await r.aclose()
    await service.stop()
    assert '"keyring": {"generation": 2' in buffer.getvalue().splitlines()[0]
    only(monkeypatch, key_file.read_text().splitlines()[1])
    target = aioredis.Redis.from_url(redis_url)
    try:
        await target.flushdb()
        store_master = load_master_key(service.settings.data_dir)
        header, rest = buffer.getvalue().split("\n", 1)
        tampered = header.replace('"generation": 2', '"generation": "2"')
        with pytest.raises(ValueError, match="line 1: keyring is not a generation"):
            await import_log(target, RedisEventStore(target, 1, 0, store_master), io.StringIO(tampered + "\n" + rest))
        await import_log(target, RedisEventStore(target, 1, 0, store_master), buffer)
    finally:
        await target.aclose()
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    try:
        async with EngramClient(redis_url, operator=True) as client:
            found = await client.get_by_key("dave", "prefs", "tea", after=put.token)
            assert found is not None and found.value == {"content": "green, no sugar"}
    finally:
        await running.stop()


async def test_a_running_worker_lets_go_of_the_generations_retire_takes_out(
    service: RunningService, key_file: Path
) -> None:
    """After `engram keys retire`, the retired key opens nothing a running worker holds: the
    worker drops it from its keyring (and says so in its report) without a restart."""
    url = service.settings.redis_url
    async with EngramClient(url, operator=True) as client:
        saved = await client.save("alice", "kept through the rotation", advise=False)
    r = aioredis.Redis.from_url(url)
    try:
        await keys.rotate(r, load_master_key(service.settings.data_dir), 1, wait_seconds=10)
        worker = service.engram.master
        assert worker is not None and worker.generations == [1, 2], "both, until the old one is retired"
        retired = await keys.retire(r, load_master_key(service.settings.data_dir), 1, wait_seconds=10)
        assert retired["retired"] == [1]

        async def let_go() -> bool:
            reports = await live_workers(r)
            return worker.generations == [2] and [w.get("key_generations") for w in reports] == [[2]]

        await eventually(let_go, what="the worker holding generation 2 alone, and saying so")
    finally:
        await r.aclose()
    async with EngramClient(url, operator=True) as client:  # what it holds still opens
        assert (await client.get_note("alice", saved.note_id)).content == "kept through the rotation"


async def test_after_retire_no_file_of_redis_holds_a_data_key_wrapped_under_the_retired_key(
    tmp_path: Path, key_file: Path
) -> None:
    """The AOF keeps every value a key ever had until it is rewritten: a copy of its files and the
    retired key would open the whole log. Retire rewrites it, and waits."""
    server = RedisServer(tmp_path / "redis", appendfsync="always").start()
    running = await RunningService(service_settings(server.url, index_enabled=False, data_dir=tmp_path)).start()
    r = aioredis.Redis.from_url(server.url)
    try:
        async with EngramClient(server.url, operator=True) as client:
            saved = [(await client.save("alice", f"note {i}", advise=False)).note_id for i in range(3)]
        old = await wrapped_keys(server.url, "alice", saved)
        assert all(w is not None and wrapped_generation(w) == 1 for w in old)
        await keys.rotate(r, load_master_key(tmp_path), 1, wait_seconds=10)
        files = [p for p in (tmp_path / "redis").rglob("*") if p.is_file()]
        assert any(w in p.read_bytes() for p in files for w in old if w), "the AOF's history holds them"
        retired = await keys.retire(r, load_master_key(tmp_path), 1, wait_seconds=30)
        assert retired["aof"] == "append-only file rewritten"
        assert "Redis: append-only file rewritten" in keys.human("retire", retired)
        files = [p for p in (tmp_path / "redis").rglob("*") if p.is_file()]
        assert [p.name for p in files for w in old if w and w in p.read_bytes()] == []
    finally:
        await r.aclose()
        await running.stop()
        server.stop()
