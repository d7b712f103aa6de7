"""`engram keys rotate` through the real CLI beside a running `engram serve` (real processes,
real Redis, and a real Redis Cluster): rotated under a write load, SIGKILLed midway, resumed,
then the service restarted with the new key alone reads every note, and the notes forgotten
during the rotation stay forgotten."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
from pathlib import Path
from typing import Any

from engram_ledger.contracts import channels
from engram_ledger.services.adapters.crypto import wrapped_generation
from engram_ledger.services.adapters.redis_conn import close_redis, open_redis
from engram_ledger.services.bus.client import EngramClient
from tests.support import ENGRAM_CLI, ROOT, ServeProcess, cli, engram_env, eventually

USERS = [f"user-{i}" for i in range(8)]


class Load:
    """A client saving notes one after another until stopped; what was acknowledged, and what failed."""

    def __init__(self, client: EngramClient) -> None:
        self.client = client
        self.saved: list[tuple[str, str, str]] = []  # (user, note id, content)
        self.failures: list[str] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        i = 0
        while not self._stop.is_set():
            user, content = USERS[i % len(USERS)], f"written under load, number {i}"
            try:
                reply = await self.client.save(user, content, advise=False)
                self.saved.append((user, reply.note_id, content))
            except Exception as e:
                self.failures.append(repr(e))
            i += 1
            await asyncio.sleep(0.01)  # paces the load

    def stop(self) -> None:
        self._stop.set()


async def generations(url: str, cluster: bool, partitions: int, notes: list[tuple[str, str, str]]) -> list[int | None]:
    """The generation each note's data key is wrapped under (None: it has none)."""
    redis = open_redis(url, cluster)
    try:
        out = []
        for user, note_id, _ in notes:
            raw = await redis.get(channels.data_key(channels.partition_of(user, partitions), user, note_id))
            out.append(None if raw is None else wrapped_generation(raw))
        return out
    finally:
        await close_redis(redis)


async def any_cursor(url: str, cluster: bool, partitions: int) -> bool:
    redis = open_redis(url, cluster)
    try:
        for p in range(partitions):
            if await redis.exists(f"{channels.tag(p)}:keyring:cursor:rotate-2"):
                return True
        return False
    finally:
        await close_redis(redis)


async def run_cli(env: dict[str, str], *args: str) -> tuple[int, Any, str]:
    """`engram ARGS --json` off the event loop, so the load keeps going meanwhile."""
    return await asyncio.to_thread(cli, env, *args, timeout=180)


async def test_rotate_under_load_killed_midway_resumed_then_read_with_the_new_key_alone(
    bus: dict[str, str], tmp_path: Path
) -> None:
    old_key = base64.b64encode(os.urandom(32)).decode()
    key_file = tmp_path / "master.keys"
    key_file.write_text(old_key + "\n")  # a key file as every release before generations wrote it
    key_file.chmod(0o600)
    env = engram_env(
        **bus, ENGRAM_DATA_DIR=str(tmp_path / "data"), ENGRAM_INDEX="off", ENGRAM_MASTER_KEY_FILE=str(key_file)
    )
    url, cluster = bus["ENGRAM_REDIS_URL"], bus.get("ENGRAM_REDIS_CLUSTER") == "on"
    partitions = int(bus.get("ENGRAM_PARTITIONS", "1"))
    serve = ServeProcess(env).start()
    try:
        async with EngramClient(url, timeout=30, cluster=cluster, operator=True) as client:
            before = []
            for i in range(160):
                user = USERS[i % len(USERS)]
                content = f"saved before the rotation, number {i}"
                before.append((user, (await client.save(user, content, advise=False)).note_id, content))
            put = await client.put("user-0", "contacts", "sarah@example.com", {"content": "prefers email"})
            forgotten = [before[3], before[17]]

            load = Load(client)
            writer = asyncio.create_task(load.run())
            rotation = await asyncio.create_subprocess_exec(
                *ENGRAM_CLI, "keys", "rotate", "--json", "--batch", "5", "--pause", "0.05",
                env=env, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip

            async def midway_or_ended() -> bool:
                return rotation.returncode is not None or await any_cursor(url, cluster, partitions)

            await eventually(midway_or_ended, 60, 0.02, "the rotation under way")
            assert rotation.returncode is None, "the rotation ended before it could be killed midway"
            rotation.send_signal(signal.SIGKILL)
            await rotation.wait()

            midway = await generations(url, cluster, partitions, before)
            assert 1 in midway and 2 in midway, f"killed midway: some keys re-wrapped, some not ({midway})"
            code, status, _ = await run_cli(env, "keys", "status")
            assert code == 0 and status["generation"] == 2
            assert status["rotation"]["from"] == 1 and status["rotation"]["to"] == 2
            assert status["rotation"]["phase"] == "rewrap"
            assert [w["key_generation"] for w in status["workers"]] == [2], "the service switched, no restart"
            code, health, _ = await run_cli(env, "health")
            assert health["keys"]["generation"] == 2 and health["keys"]["rotation"]["to"] == 2
            # Both generations are live while the rotation is stopped: a forget goes through.
            gone = await client.forget(forgotten[0][0], note_ids=[forgotten[0][1]], confirmed=True)
            assert gone.status == "forgotten"

            resumed = await asyncio.create_subprocess_exec(
                *ENGRAM_CLI, "keys", "rotate", "--json", "--batch", "5", "--pause", "0.02",
                env=env, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            # A forget while the resumed rotation re-wraps: its key must not come back.
            gone = await client.forget(forgotten[1][0], note_ids=[forgotten[1][1]], confirmed=True)
            assert gone.status == "forgotten"
            out, err = await asyncio.wait_for(resumed.communicate(), 180)
            assert resumed.returncode == 0, err.decode()
            done = json.loads(out)
            assert (done["from"], done["to"], done["status"], done["resumed"]) == (1, 2, "done", True)
            assert done["key_file"] is None, "generation 2 was added to the file once, by the killed run"

            await asyncio.sleep(0.3)  # writes go on a while under the new key alone
            load.stop()
            await writer
            assert not load.failures, load.failures[:3]
            assert len(load.saved) > 20, "writes went on during the rotation"
            code, health, _ = await run_cli(env, "health")
            assert code == 0 and health["keys"]["generation"] == 2 and health["keys"]["rotation"] is None

            code, retired, err = await run_cli(env, "keys", "retire")
            assert code == 0, err
            assert retired["retired"] == [1] and retired["key_file"] == str(key_file)
        assert serve.stop() == 0
    finally:
        serve.kill()

    keyring = key_file.read_text()
    assert old_key not in keyring and keyring.startswith("2:"), "the new key alone is left"
    everything = before + load.saved
    assert set(await generations(url, cluster, partitions, everything)) == {2, None}
    serve = ServeProcess(env).start()
    try:
        async with EngramClient(url, timeout=30, cluster=cluster, operator=True) as client:
            for user, note_id, content in everything:
                note = await client.get_note(user, note_id)
                if (user, note_id, content) in forgotten:
                    assert note.status == "forgotten" and note.content == "", "forgotten stays forgotten"
                else:
                    assert note.content == content
            found = await client.get_by_key("user-0", "contacts", "sarah@example.com")
            assert found is not None and found.id == put.note_id and found.value == {"content": "prefers email"}
        code, shown, _ = cli(env, "get", "--user", before[0][0], before[0][1])
        assert code == 0 and shown["content"] == before[0][2]
        assert await generations(url, cluster, partitions, forgotten) == [None, None]
        assert serve.stop() == 0
    finally:
        serve.kill()
