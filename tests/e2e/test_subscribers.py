"""Subscribing as a user would, against a running `engram serve`: `engram tail` (typed lines,
content only with the key, a consumer group, filters) on a single Redis and on a cluster, and
the FastStream example (examples/subscriber.py) keeping a copy and erasing what is forgotten."""

from __future__ import annotations

import base64
import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from engram_ledger.contracts import channels
from tests.support import ENGRAM_CLI, ROOT, TEST_MASTER_KEY_B64, ServeProcess, cli, cli_text, engram_env


@pytest.fixture
def env(bus: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    values = engram_env(
        **bus, ENGRAM_DATA_DIR=str(tmp_path / "data"), ENGRAM_INDEX="off", ENGRAM_MASTER_KEY=TEST_MASTER_KEY_B64
    )
    serve = ServeProcess(values).start()
    yield values
    assert serve.stop() == 0


def tail_json(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [*ENGRAM_CLI, "tail", "--json", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_tail_prints_typed_lines_reads_through_a_group_and_filters(env: dict[str, str], tmp_path: Path) -> None:
    _, alices, _ = cli(env, "save", "--user", "alice", "--subject", "Alec", "Alec is my boss")
    _, bobs, _ = cli(env, "save", "--user", "bob", "Bob's PIN is 4921")
    cli(env, "update", "--user", "alice", alices["note_id"], "Alec is my former boss")
    code, forgot, _ = cli(env, "forget", "--user", "bob", "--yes", bobs["note_id"])
    assert code == 0 and forgot["status"] == "forgotten"

    # For a person, without the key: what happened, whose, which version; no content.
    sealed = cli_text(env, "tail", "--from-start", "--count", "4", timeout=30)
    lines = sealed.stdout.splitlines()
    assert sealed.returncode == 0 and len(lines) == 4, sealed.stderr
    saved = next(line for line in lines if "note_saved" in line and "alice/" in line)
    assert f"alice/{alices['note_id']} v1" in saved and "fact in general" in saved and "(content sealed" in saved
    assert "Alec" not in sealed.stdout and "enc1:" not in sealed.stdout
    erasure = next(line for line in lines if "note_forgotten" in line)
    assert f"→ erase every copy of note {bobs['note_id']} of user bob" in erasure

    # With the key: the content of notes that still have theirs, never a forgotten one's.
    opened = cli_text(env, "tail", "--from-start", "--count", "4", "--content", timeout=30).stdout
    assert '"Alec is my boss"' in opened and '"Alec is my former boss"' in opened and "about Alec" in opened
    assert "4921" not in opened and "(content erased: the note was forgotten)" in opened
    key_file = tmp_path / "master.key"
    key_file.write_text(TEST_MASTER_KEY_B64 + "\n")
    # The same lines either way; partitions interleave as their readers are scheduled.
    by_file = tail_json(env, "--from-start", "--count", "4", "--key-file", str(key_file))
    by_content = tail_json(env, "--from-start", "--count", "4", "--content")
    assert sorted(by_file, key=lambda line: line["token"]) == sorted(by_content, key=lambda line: line["token"])
    key_file.write_text(base64.b64encode(bytes(32)).decode() + "\n")  # a key, not the service's
    code, wrong, _ = cli(env, "tail", "--from-start", "--count", "1", "--key-file", str(key_file), "--user", "alice")
    assert code == 1 and wrong["error"]["code"] == "INVALID_PARAMETER" and "cannot open" in wrong["error"]["message"]

    # Through a group: each line acked once written, so the next run goes on from there.
    everything = tail_json(env, "--from-start", "--count", "4")
    first = tail_json(env, "--group", "audit", "--from-start", "--count", "2")
    rest = tail_json(env, "--group", "audit", "--count", "2")
    assert {line["token"] for line in first + rest} == {line["token"] for line in everything}
    _, later, _ = cli(env, "save", "--user", "carol", "Carol joined")
    (new,) = tail_json(env, "--group", "audit", "--count", "1")
    assert new["event"]["note_id"] == later["note_id"] and new["type"] == "note_saved" and not new["redelivered"]
    assert new["content"] == "withheld" and new["event"]["content"] == ""

    # Filters: the kinds named, and erasures whatever the kinds; one user's events only.
    updates = tail_json(env, "--from-start", "--kinds", "note_updated", "--count", "2")
    assert sorted(line["type"] for line in updates) == ["note_forgotten", "note_updated"]
    assert updates[[line["type"] for line in updates].index("note_forgotten")]["erase"] == {
        "scope": "note", "user_id": "bob", "note_ids": [bobs["note_id"]], "session_id": None,
    }  # fmt: skip
    alice_only = tail_json(env, "--from-start", "--user", "alice", "--count", "2")
    assert [line["event"]["user_id"] for line in alice_only] == ["alice", "alice"]
    assert [line["event"]["version"] for line in alice_only] == [1, 2]
    code, bad, _ = cli(env, "tail", "--kinds", "note_saved,note_deleted")
    assert code == 1 and bad["error"]["code"] == "INVALID_PARAMETER" and "'note_deleted'" in bad["error"]["message"]


class Example:
    """examples/subscriber.py as a user runs it; its printed lines, as they come."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "examples.subscriber"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            # FastStream's own log lines go to stdout too; the example's are plain sentences.
            if line.startswith(("copied", "updated", "erased")):
                self.lines.put(line.strip())

    def next(self, n: int, timeout: float = 30) -> list[str]:
        return [self.lines.get(timeout=timeout) for _ in range(n)]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)


def test_the_faststream_example_keeps_a_copy_and_erases_what_is_forgotten(redis_url: str, tmp_path: Path) -> None:
    env = engram_env(
        ENGRAM_REDIS_URL=redis_url, ENGRAM_DATA_DIR=str(tmp_path / "data"), ENGRAM_INDEX="off", ENGRAM_PARTITIONS="2"
    )
    serve = ServeProcess(env).start()
    example: Example | None = None
    try:
        _, alices, _ = cli(env, "save", "--user", "alice", "Alice likes tea")
        cli(env, "update", "--user", "alice", alices["note_id"], "Alice likes green tea")
        _, bobs, _ = cli(env, "save", "--user", "bob", "Bob likes coffee")
        example = Example({**env, "SUBSCRIBER_CLAIM_IDLE_MS": "1000"})
        # The log from its start (the group is created at 0): each partition in order.
        got = example.next(3)
        assert sorted(got) == sorted(
            [f"copied alice/{alices['note_id']} v1 (fact)", f"updated alice/{alices['note_id']} v2 (note_updated)",
             f"copied bob/{bobs['note_id']} v1 (fact)"]
        )  # fmt: skip
        assert got.index(f"copied alice/{alices['note_id']} v1 (fact)") < got.index(
            f"updated alice/{alices['note_id']} v2 (note_updated)"
        )
        code, _, _ = cli(env, "forget", "--user", "alice", "--all")
        code, _, _ = cli(env, "forget", "--user", "alice", "--all")
        assert code == 0
        assert example.next(2) == [f"erased alice/{alices['note_id']}", "erased user alice (1 notes and messages)"]
        example.stop()

        # Redis kept the group's position: a restart goes on after what was acked.
        client = redis.Redis.from_url(redis_url)
        for p in range(2):
            (group,) = client.xinfo_groups(channels.event_log(p))
            assert group["name"] == b"crm-sync" and group["pending"] == 0 and group["lag"] == 0
        client.close()
        example = Example({**env, "SUBSCRIBER_CLAIM_IDLE_MS": "1000"})
        _, carols, _ = cli(env, "save", "--user", "carol", "Carol likes cocoa")
        assert example.next(1) == [f"copied carol/{carols['note_id']} v1 (fact)"]
        with pytest.raises(queue.Empty):
            example.next(1, timeout=2)
    finally:
        if example is not None:
            example.stop()
        serve.stop()
