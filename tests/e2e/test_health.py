"""`engram health` as a deployment waits on it: a real `engram serve`, the real
CLI, real Redis. It exits 0 only once the model is loaded and the index has caught up with the
log, says which of the two it is waiting for, and says when no worker is running at all."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.observability.health import LAG_ENTRIES_LIMIT, health
from tests.support import TEST_MODEL_CACHE, ServeProcess, cli, engram_env, eventually, wait_until

# Notes the index has to embed when it starts: more than "caught up" allows, and more than the lag
# that makes a request group or another projection "degraded" (an index catching up is "starting").
BACKLOG = LAG_ENTRIES_LIMIT + 200


async def save_backlog(url: str) -> None:
    async with EngramClient(url, timeout=30) as client:
        for start in range(0, BACKLOG, 100):
            drafts = [
                NoteDraft(content=f"backlog note number {n} about topic {n % 7}") for n in range(start, start + 100)
            ]
            await client.save_many("alice", drafts)


async def watch_the_model_load(url: str) -> list[tuple[str, str, str]]:
    """What `engram health` reports (status, model, index), read every 50 ms until the model
    is loaded."""
    redis = aioredis.Redis.from_url(url)
    states: list[tuple[str, str, str]] = []

    async def loaded() -> bool:
        report = await health(redis)
        states.append((report["status"], report["model"], report["index"]))
        return report["model"] == "loaded"

    try:
        await eventually(loaded, 120, what="the model loaded")
    finally:
        await redis.aclose()
    return states


def test_health_waits_for_the_model_and_the_index(redis_url: str, tmp_path: Path) -> None:
    env = engram_env(ENGRAM_REDIS_URL=redis_url, ENGRAM_DATA_DIR=str(tmp_path / "data"))

    code, report, _ = cli(env, "health")
    assert code == 1 and report["status"] == "down" and "no engram worker" in report["error"]

    # Without the index: nothing to load, nothing to catch up; the notes are the index's backlog.
    plain = ServeProcess({**env, "ENGRAM_INDEX": "off"}).start()
    try:
        code, report, _ = cli(env, "health")
        assert code == 0 and report["status"] == "ok", report
        assert report["model"] == "off" and report["index"] == "off"
        assert [w["roles"] for w in report["workers"]] == [["commands", "history", "index", "queries", "saga"]]
        asyncio.run(save_backlog(redis_url))
    finally:
        assert plain.stop() == 0

    # From its first line: it says it serves only once the model is loaded.
    serve = ServeProcess(env).start(line="engram starting on")
    try:
        # The model loads in the background (seconds); until then the index cannot embed its
        # backlog. Watched here every 50 ms (a CLI call takes about a second, and a warm model
        # may load in less), then through the CLI, whose exit code follows the status.
        watched = asyncio.run(watch_the_model_load(redis_url))
        assert watched[0] == ("starting", "loading", "catching up"), watched
        code, first, _ = cli(env, "health")
        assert code == (0 if first["status"] == "ok" else 1), first
        seen: list[dict[str, Any]] = [first]

        def ready() -> bool:
            code, report, _ = cli(env, "health")
            seen.append(report)
            return code == 0

        wait_until(ready, timeout=120, interval=0.5)
        assert all(status != "degraded" for status, _, _ in watched), watched
        assert all(report["status"] != "degraded" for report in seen), [r["status"] for r in seen]
        final = seen[-1]
        assert final["status"] == "ok" and final["model"] == "loaded" and final["index"] == "ready", final
        index_lag = final["partitions"][0]["index"]["lag_entries"]
        assert index_lag == 0
        log = "".join(serve.lines)
        assert "embedding model sentence-transformers/all-MiniLM-L6-v2 loaded in" in log, log
    finally:
        assert serve.stop() == 0

    code, report, _ = cli(env, "health")
    assert code == 1 and report["status"] == "down", "a stopped worker withdraws its report"


async def _save_and_search(url: str) -> tuple[str, list[str]]:
    async with EngramClient(url) as client:  # the default wait, as a new user's
        saved = await client.save("newcomer", "My cat Zyzzyva sleeps on the piano")
        found = await client.search("newcomer", "where does my cat sleep?", after=saved.token)
    return saved.note_id, [hit.note_id for hit in found.results]


def test_a_save_and_a_search_sent_as_the_service_starts_are_answered(redis_url: str, tmp_path: Path) -> None:
    """Ready means ready: a fresh data dir, and a save and a search with its token sent the
    moment the first line of the start appears, while the model still loads: both answered, the
    search finding the note (it waits for the model within its caller's wait). The line saying
    the service serves comes only once the model is loaded."""
    # The model's export is the machine's, kept in the user's cache (made by the set-up, or by
    # any earlier start), not the data dir's: a fresh data dir only loads it.
    cache = tmp_path / "cache"
    (cache / "engram").mkdir(parents=True)
    (cache / "engram" / "models").symlink_to(TEST_MODEL_CACHE)
    env = engram_env(ENGRAM_REDIS_URL=redis_url, ENGRAM_DATA_DIR=str(tmp_path / "data"), XDG_CACHE_HOME=str(cache))
    del env["ENGRAM_MODEL_CACHE"]
    serve = ServeProcess(env).start(timeout=60, line="engram starting on")
    try:
        serving_lines = [line for line in serve.lines if "engram serving on" in line]
        note_id, found = asyncio.run(_save_and_search(redis_url))
        assert found[:1] == [note_id]
        wait_until(lambda: any("engram serving on" in line for line in serve.lines), timeout=60)
        assert not serving_lines, "it said it serves before the model was loaded"
        assert any("the embedding model loaded in" in line for line in serve.lines)
        # Loaded from the machine's export: none made for this data dir.
        assert not any("exporting" in line for line in serve.lines) and not (tmp_path / "data" / "models").exists()
    finally:
        assert serve.stop() == 0
