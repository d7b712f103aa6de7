"""The `engram` CLI against a running `engram serve`, both real processes, on real Redis."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts import channels
from services.adapters.redis_server import free_port
from tests.support import ROOT, ServeProcess, cli, cli_text, engram_env, wait_until


def serving(bus: dict[str, str], data: Path, **extra: str) -> Iterator[dict[str, str]]:
    values = engram_env(**bus, ENGRAM_DATA_DIR=str(data), **extra)
    serve = ServeProcess(values).start()
    if values.get("ENGRAM_INDEX") != "off":
        # The model loads in the background at start (6-9 s warm, more from a cold disk cache);
        # the tests begin once the index answers, as in tests/e2e/test_mcp.py.
        wait_until(lambda: cli(values, "search", "--user", "warm-up", "anything")[0] == 0, timeout=90, interval=0.5)
    yield values
    assert serve.stop() == 0


@pytest.fixture
def env(bus: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    # These tests are about the CLI and the core; the index (and its model load) is off.
    yield from serving(bus, tmp_path / "data", ENGRAM_INDEX="off")


@pytest.fixture
def env_with_index(bus: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    yield from serving(bus, tmp_path / "data")


def test_the_note_lifecycle_through_the_cli(env: dict[str, str]) -> None:
    code, saved, _ = cli(
        env,
        "save",
        "--user",
        "alice",
        "--category",
        "person",
        "--subject",
        "Alec",
        "--command-id",
        "cli-1",
        "Alec is my boss",
    )
    assert code == 0 and saved["version"] == 1 and len(saved["note_id"]) == 8
    # The token names alice's partition: the users are spread over partitions (and cluster slots).
    partitions = int(env.get("ENGRAM_PARTITIONS", "1"))
    assert channels.parse_token(saved["token"])[0] == channels.partition_of("alice", partitions)
    note_id = saved["note_id"]
    code, again, _ = cli(env, "save", "--user", "alice", "--command-id", "cli-1", "Alec is my boss")
    assert again["note_id"] == note_id and again["replayed"] is True

    code, updated, _ = cli(
        env, "update", "--user", "alice", "--expected-version", "1", note_id, "Alec is my former boss"
    )
    assert code == 0 and updated["version"] == 2
    code, conflict, _ = cli(env, "update", "--user", "alice", "--expected-version", "1", note_id, "stale write")
    assert code == 1 and conflict["error"]["code"] == "VERSION_CONFLICT"

    code, note, _ = cli(env, "get", "--user", "alice", "--after", updated["token"], note_id)
    assert code == 0 and note["content"] == "Alec is my former boss" and note["subject"] == "Alec"
    code, history, _ = cli(env, "history", "--user", "alice", note_id)
    assert [v["content"] for v in history["versions"]] == ["Alec is my boss", "Alec is my former boss"]
    assert history["note_id"] == note_id and all("created_at" in v for v in history["versions"])

    code, newer, _ = cli(env, "save", "--user", "alice", "--category", "person", "Alec retired")
    code, superseded, _ = cli(env, "supersede", "--user", "alice", note_id, newer["note_id"])
    assert code == 0 and superseded["superseded_by"] == newer["note_id"]
    code, listing, _ = cli(env, "list", "--user", "alice", "--after", superseded["token"])
    assert [n["id"] for n in listing["notes"]] == [newer["note_id"]]
    code, everything, _ = cli(env, "list", "--user", "alice", "--include-superseded")
    assert len(everything["notes"]) == 2
    code, recent, _ = cli(env, "recent", "--user", "alice", "--limit", "1")
    assert [n["id"] for n in recent["notes"]] == [newer["note_id"]]

    code, other, _ = cli(env, "get", "--user", "mallory", note_id)
    assert code == 1 and other == {
        "error": {"code": "MEMORY_NOT_FOUND", "message": f"Memory with ID {note_id} not found"}
    }
    code, bad, _ = cli(env, "save", "--user", "alice", "--confidence", "7", "x")
    assert code == 1 and bad["error"]["code"] == "INVALID_PARAMETER" and "confidence" in bad["error"]["message"]

    tail = subprocess.run(
        [sys.executable, "-m", "services.cli", "tail", "--from-start", "--count", "4"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    lines = [json.loads(line) for line in tail.stdout.splitlines()]
    assert [line["event"]["type"] for line in lines] == ["note_saved", "note_updated", "note_saved", "note_superseded"]

    code, rebuilt, _ = cli(env, "rebuild", "history")
    assert code == 0 and rebuilt["events"] == 4
    code, report, _ = cli(env, "health")
    assert code == 0 and report["status"] == "ok" and len(report["partitions"]) == partitions
    assert sum(p["log_length"] for p in report["partitions"]) == 4
    code, after_rebuild, _ = cli(env, "list", "--user", "alice", "--include-superseded")
    assert after_rebuild == everything


def test_human_output_and_schema(env: dict[str, str], tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "services.cli", "save", "--user", "bob", "Likes black coffee"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0 and run.stdout.startswith("saved ")
    code, _written, _ = cli(env, "schema", "--out", str(tmp_path / "schema.json"))
    schema = json.loads((tmp_path / "schema.json").read_text())
    assert code == 0 and {"SaveNote", "NoteSaved", "GetNote", "ErrorReply"} <= set(schema["$defs"])


def test_an_unreachable_bus_is_one_clear_line(tmp_path: Path) -> None:
    env = engram_env(ENGRAM_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", ENGRAM_DATA_DIR=str(tmp_path))
    code, out, _err = cli(env, "list", "--user", "alice")
    assert (
        code == 1 and out["error"]["code"] == "UNAVAILABLE" and "cannot reach the Engram bus" in out["error"]["message"]
    )
    plain = subprocess.run(
        [sys.executable, "-m", "services.cli", "get", "--user", "a", "AAAAAAAA"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    assert len(plain.stderr.strip().splitlines()) == 1 and plain.stderr.startswith("engram: UNAVAILABLE")


def test_serve_starts_a_private_redis_when_none_is_configured_or_answering(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = engram_env(
        ENGRAM_DEFAULT_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", ENGRAM_DATA_DIR=str(data), ENGRAM_INDEX="off"
    )
    serve = ServeProcess(env).start()
    try:
        assert any("started a private redis-server" in line for line in serve.lines)
        code, saved, _ = cli(env, "save", "--user", "alice", "kept in the private Redis")
        assert code == 0
        code, note, _ = cli(env, "get", "--user", "alice", "--after", saved["token"], saved["note_id"])
        assert note["content"] == "kept in the private Redis"
        assert list((data / "redis").rglob("*.aof*")), "the private Redis writes an AOF under the data dir"
    finally:
        assert serve.stop() == 0
    assert not (data / "redis.url").exists()


def test_search_and_an_index_rebuild_while_serving(env_with_index: dict[str, str]) -> None:
    env = env_with_index
    code, saved, _ = cli(env, "save", "--user", "alice", "--category", "person", "Alec is my boss at TechCorp")
    assert code == 0, saved
    cli(env, "save", "--user", "alice", "I like my coffee black")
    code, found, _ = cli(env, "search", "--user", "alice", "--after", saved["token"], "who is my manager?")
    assert code == 0 and found["results"][0]["note_id"] == saved["note_id"]
    assert found["results"][0]["content"] == "Alec is my boss at TechCorp" and found["results"][0]["similarity"] > 0.3
    code, filtered, _ = cli(env, "search", "--user", "alice", "--category", "food", "who is my manager?")
    assert code == 0 and filtered["results"] == []
    code, by_kind, _ = cli(env, "search", "--user", "alice", "--kind", "fact", "--top-k", "1", "coffee")
    assert code == 0 and by_kind["results"][0]["content"] == "I like my coffee black"
    code, bad, _ = cli(env, "search", "--user", "alice", "--top-k", "99", "x")
    assert code == 1 and bad["error"]["code"] == "INVALID_PARAMETER"

    index_dir = Path(env["ENGRAM_DATA_DIR"]) / "index"
    assert [d.name for d in index_dir.iterdir()] == ["g0"]
    code, rebuilt, err = cli(env, "rebuild", "index", timeout=180)
    assert code == 0, err
    assert rebuilt["events"] == 2 and rebuilt["generation"] >= 1 and rebuilt["previous"] == 0
    # The serving process follows the switch and drops the old generation.
    wait_until(lambda: [d.name for d in index_dir.iterdir()] == [f"g{rebuilt['generation']}"], timeout=30)
    code, again, _ = cli(env, "search", "--user", "alice", "who is my manager?")
    assert again["results"][0]["note_id"] == saved["note_id"]
    code, newer, _ = cli(env, "save", "--user", "alice", "My dentist is Dr. Molar")
    code, fresh, _ = cli(env, "search", "--user", "alice", "--after", newer["token"], "dentist")
    assert fresh["results"][0]["note_id"] == newer["note_id"]


def test_forget_in_two_calls_with_yes_and_for_a_whole_user(env: dict[str, str]) -> None:
    _, first, _ = cli(env, "save", "--user", "alice", "User lives in San Francisco")
    _, second, _ = cli(env, "save", "--user", "alice", "User visited Lisbon")
    code, asked, _ = cli(env, "forget", "--user", "alice", first["note_id"])
    assert code == 0 and asked["status"] == "confirmation_required"
    assert asked["pending"][0]["preview"] == "User lives in San Francisco"
    code, done, _ = cli(env, "forget", "--user", "alice", first["note_id"])
    assert code == 0 and done["status"] == "forgotten" and done["forgotten"] == [first["note_id"]]
    code, missing, _ = cli(env, "forget", "--user", "alice", first["note_id"])
    assert code == 1 and missing["error"]["code"] == "MEMORY_NOT_FOUND"
    code, at_once, _ = cli(env, "forget", "--user", "alice", "--yes", second["note_id"])
    assert at_once["status"] == "forgotten"
    cli(env, "save", "--user", "alice", "User likes tea")
    code, ask_all, _ = cli(env, "forget", "--user", "alice", "--all")
    assert ask_all["status"] == "confirmation_required" and "ALL 1 memories" in ask_all["message"]
    code, erased, _ = cli(env, "forget", "--user", "alice", "--all")
    assert erased["status"] == "forgotten" and len(erased["forgotten"]) == 1 and erased["erased_at"]
    code, listed, _ = cli(env, "list", "--user", "alice", "--after", erased["token"])
    assert listed["notes"] == []
    code, bad, _ = cli(env, "forget", "--user", "alice")
    assert code == 1 and bad["error"]["code"] == "INVALID_PARAMETER"


def test_tools_context_and_the_memory_command(env: dict[str, str]) -> None:
    code, exported, _ = cli(env, "tools", "--profile", "runtime", "--format", "openai")
    assert code == 0 and exported["tools"][0]["function"]["name"] == "memory_search"
    code, anthropic, _ = cli(env, "tools", "--profile", "memento", "--format", "anthropic")
    assert anthropic["tools"][0]["input_schema"]["required"] == ["content"]
    _, alec, _ = cli(env, "save", "--user", "al", "--category", "person", "--subject", "Alec", "Alec is my boss")
    _, friday, _ = cli(env, "save", "--user", "al", "--category", "preference", "User prefers Thursday due dates")
    plain = cli_text(env, "context", "--user", "al", "--after", friday["token"])
    assert plain.returncode == 0 and plain.stdout.startswith("## Your Memory\n")
    assert f"- [id:{alec['note_id']}] [Alec] Alec is my boss\n" in plain.stdout
    listed = cli_text(env, "memory", "list", "--user", "al")
    assert listed.stdout == (
        "📝 Your memories:\n\n"
        "**Person**\n"
        f"• [{alec['note_id']}] Alec is my boss\n\n"
        "**Preference**\n"
        f"• [{friday['note_id']}] User prefers Thursday due dates\n\n"
        "Use /memory delete <id> to remove a memory.\n"
    )
    deleted = cli_text(env, "memory", "delete", "--user", "al", friday["note_id"])
    assert deleted.stdout == "Deleted: 'User prefers Thursday due dates'\n", deleted.stderr
