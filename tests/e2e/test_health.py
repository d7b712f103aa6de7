"""`engram health` as a deployment waits on it (issue 13, item 10): a real `engram serve`, the real
CLI, real Redis. It exits 0 only once the model is loaded and the index has caught up with the
log, says which of the two it is waiting for, and says when no worker is running at all."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from contracts.commands import NoteDraft
from services.bus.client import EngramClient
from tests.support import ServeProcess, cli, engram_env, wait_until

BACKLOG = 200  # notes the index has to embed when it starts: more than "caught up" allows


async def save_backlog(url: str) -> None:
    async with EngramClient(url, timeout=30) as client:
        for start in range(0, BACKLOG, 100):
            drafts = [
                NoteDraft(content=f"backlog note number {n} about topic {n % 7}") for n in range(start, start + 100)
            ]
            await client.save_many("alice", drafts)


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

    serve = ServeProcess(env).start()
    try:
        # The model loads in the background (seconds); until then the index cannot embed its backlog.
        code, first, _ = cli(env, "health")
        assert code == 1 and first["status"] == "starting", first
        assert first["model"] in ("loading", "loaded") and first["index"] == "catching up", first
        seen: list[dict[str, Any]] = [first]

        def ready() -> bool:
            code, report, _ = cli(env, "health")
            seen.append(report)
            return code == 0

        wait_until(ready, timeout=120, interval=0.5)
        final = seen[-1]
        assert final["status"] == "ok" and final["model"] == "loaded" and final["index"] == "ready", final
        assert "loading" in [r["model"] for r in seen], "the model's load was reported while it ran"
        index_lag = final["partitions"][0]["index"]["lag_entries"]
        assert index_lag == 0
        log = "".join(serve.lines)
        assert "embedding model sentence-transformers/all-MiniLM-L6-v2 loaded in" in log, log
    finally:
        assert serve.stop() == 0

    code, report, _ = cli(env, "health")
    assert code == 1 and report["status"] == "down", "a stopped worker withdraws its report"
