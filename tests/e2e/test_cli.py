"""The `engram` CLI against a running `engram serve`, both real processes, on real Redis."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_ledger.contracts import channels
from engram_ledger.services.adapters.redis_server import free_port
from tests.support import ENGRAM_CLI, ROOT, ServeProcess, cli, cli_text, engram_env, wait_until


def serving(bus: dict[str, str], data: Path, **extra: str) -> Iterator[dict[str, str]]:
    values = engram_env(**bus, ENGRAM_DATA_DIR=str(data), **extra)
    serve = ServeProcess(values).start()
    stopped = False
    try:
        if values.get("ENGRAM_INDEX") != "off":
            # The model loads in the background at start (6-9 s warm, more from a cold disk cache);
            # the tests begin once the index answers, as in tests/e2e/test_mcp.py.
            wait_until(lambda: cli(values, "search", "--user", "warm-up", "anything")[0] == 0, timeout=90, interval=0.5)
        yield values
        stopped = True
        assert serve.stop() == 0
    finally:
        # A service left running after a failed start would answer the next tests' requests.
        if not stopped:
            serve.stop()


@pytest.fixture(scope="module")
def env(shared_bus: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One `engram serve` for the module (on each bus); each test works on a user of its own.
    These tests are about the CLI and the core; the index (and its model load) is off."""
    yield from serving(shared_bus, tmp_path_factory.mktemp("engram") / "data", ENGRAM_INDEX="off")


@pytest.fixture
def fresh_env(bus: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """A service of the test's own, on an empty Redis: for a test that reads the whole log."""
    yield from serving(bus, tmp_path / "data", ENGRAM_INDEX="off")


@pytest.fixture
def env_with_index(bus: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    yield from serving(bus, tmp_path / "data")


def test_the_note_lifecycle_through_the_cli(fresh_env: dict[str, str]) -> None:
    env = fresh_env
    save = ["save", "--user", "alice", "--category", "person", "--subject", "Alec", "--command-id", "cli-1"]
    code, saved, _ = cli(env, *save, "Alec is my boss")
    assert code == 0 and saved["version"] == 1 and len(saved["note_id"]) == 8
    # The token names alice's partition: the users are spread over partitions (and cluster slots).
    partitions = int(env.get("ENGRAM_PARTITIONS", "1"))
    assert channels.parse_token(saved["token"])[0] == channels.partition_of("alice", partitions)
    note_id = saved["note_id"]
    code, again, _ = cli(env, *save, "Alec is my boss")
    assert again["note_id"] == note_id and again["replayed"] is True
    # the same command id for another text is a client bug: refused, nothing written
    code, reused, _ = cli(env, "save", "--user", "alice", "--command-id", "cli-1", "Alec is my brother")
    assert code == 1 and reused["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    assert "'cli-1' was already used for a different request" in reused["error"]["message"]
    code, listed, _ = cli(env, "list", "--user", "alice", "--after", again["token"])
    assert [n["content"] for n in listed["notes"]] == ["Alec is my boss"]

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
        [*ENGRAM_CLI, "tail", "--from-start", "--count", "4", "--json"],
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
    # Ids that hold ':' never run into another's key: bob's "x:1" is not bob:x's "1".
    code, bobs, _ = cli(env, "save", "--user", "bob", "--command-id", "x:1", "Bob's note")
    code, other, _ = cli(env, "save", "--user", "bob:x", "--command-id", "1", "Bob X's note")
    assert code == 0 and other["replayed"] is False and other["note_id"] != bobs["note_id"]
    code, listed, _ = cli(env, "list", "--user", "bob:x", "--after", other["token"])
    assert [n["content"] for n in listed["notes"]] == ["Bob X's note"]


def test_human_output_and_schema(env: dict[str, str], user: str, tmp_path: Path) -> None:
    run = subprocess.run(
        [*ENGRAM_CLI, "save", "--user", user, "Likes black coffee"],
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
        [*ENGRAM_CLI, "get", "--user", "a", "AAAAAAAA"],
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
    # The live shard, and the timeline beside it (every version, for searches of the past).
    assert sorted(d.name for d in index_dir.iterdir()) == ["g0", "g0-timeline"]
    code, rebuilt, err = cli(env, "rebuild", "index", timeout=180)
    assert code == 0, err
    assert rebuilt["events"] == 2 and rebuilt["generation"] >= 1 and rebuilt["previous"] == 0
    # The serving process follows the switch and drops the old generation.
    generation = rebuilt["generation"]
    wait_until(
        lambda: sorted(d.name for d in index_dir.iterdir()) == [f"g{generation}", f"g{generation}-timeline"],
        timeout=30,
    )
    code, again, _ = cli(env, "search", "--user", "alice", "who is my manager?")
    assert again["results"][0]["note_id"] == saved["note_id"]
    code, newer, _ = cli(env, "save", "--user", "alice", "My dentist is Dr. Molar")
    code, fresh, _ = cli(env, "search", "--user", "alice", "--after", newer["token"], "dentist")
    assert fresh["results"][0]["note_id"] == newer["note_id"]
    # The rebuilt timeline holds the past: as of the first save, only that note.
    code, past, _ = cli(env, "search", "--user", "alice", "--as-of", saved["token"], "--min-relevance", "0", "dentist")
    assert code == 0 and [r["note_id"] for r in past["results"]] == [saved["note_id"]]


def test_forget_in_two_calls_with_yes_and_for_a_whole_user(env: dict[str, str], user: str) -> None:
    _, first, _ = cli(env, "save", "--user", user, "User lives in San Francisco")
    _, second, _ = cli(env, "save", "--user", user, "User visited Lisbon")
    code, asked, _ = cli(env, "forget", "--user", user, first["note_id"])
    assert code == 0 and asked["status"] == "confirmation_required"
    assert asked["pending"][0]["preview"] == "User lives in San Francisco"
    code, done, _ = cli(env, "forget", "--user", user, first["note_id"])
    assert code == 0 and done["status"] == "forgotten" and done["forgotten"] == [first["note_id"]]
    code, missing, _ = cli(env, "forget", "--user", user, first["note_id"])
    assert code == 1 and missing["error"]["code"] == "MEMORY_NOT_FOUND"
    code, at_once, _ = cli(env, "forget", "--user", user, "--yes", second["note_id"])
    assert at_once["status"] == "forgotten"
    cli(env, "save", "--user", user, "User likes tea")
    code, ask_all, _ = cli(env, "forget", "--user", user, "--all")
    assert ask_all["status"] == "confirmation_required" and "ALL 1 memory (" in ask_all["message"]
    code, erased, _ = cli(env, "forget", "--user", user, "--all")
    assert erased["status"] == "forgotten" and len(erased["forgotten"]) == 1 and erased["erased_at"]
    code, listed, _ = cli(env, "list", "--user", user, "--after", erased["token"])
    assert listed["notes"] == []
    code, bad, _ = cli(env, "forget", "--user", user)
    assert code == 1 and bad["error"]["code"] == "INVALID_PARAMETER"


def test_tools_context_and_the_memory_command(env: dict[str, str], user: str) -> None:
    code, exported, _ = cli(env, "tools", "--profile", "runtime", "--format", "openai")
    assert code == 0 and exported["tools"][0]["function"]["name"] == "memory_search"
    code, anthropic, _ = cli(env, "tools", "--profile", "memento", "--format", "anthropic")
    assert anthropic["tools"][0]["input_schema"]["required"] == ["content"]
    _, alec, _ = cli(env, "save", "--user", user, "--category", "person", "--subject", "Alec", "Alec is my boss")
    _, friday, _ = cli(env, "save", "--user", user, "--category", "preference", "User prefers Thursday due dates")
    plain = cli_text(env, "context", "--user", user, "--after", friday["token"])
    assert plain.returncode == 0 and plain.stdout.startswith("## Your Memory\n")
    assert f"- [id:{alec['note_id']}] [Alec] Alec is my boss\n" in plain.stdout
    listed = cli_text(env, "memory", "list", "--user", user)
    assert listed.stdout == (
        "📝 Your memories:\n\n"
        "**Person**\n"
        f"• [{alec['note_id']}] Alec is my boss\n\n"
        "**Preference**\n"
        f"• [{friday['note_id']}] User prefers Thursday due dates\n\n"
        f"Use `engram memory delete --user {user} <id>` to remove a memory.\n"
    )
    deleted = cli_text(env, "memory", "delete", "--user", user, friday["note_id"])
    assert deleted.stdout == "Deleted: 'User prefers Thursday due dates'\n", deleted.stderr


# Never a traceback ------------------------------------------------------------------------


def engram_raw(env: dict[str, str], *args: str | bytes, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    """Run `engram ARGS` with arguments given as bytes where the test needs bytes a shell would pass."""
    return subprocess.run([*ENGRAM_CLI, *args], env=env, cwd=ROOT, capture_output=True, timeout=timeout)


NOT_UTF8 = b"caf\xe9"  # what `"$(printf 'caf\xe9')"` passes: Latin-1, not UTF-8


def test_text_that_is_not_utf8_is_refused_in_words(env: dict[str, str], user: str) -> None:
    cases: list[tuple[str, tuple[str | bytes, ...]]] = [
        ("text", ("save", "--user", user, NOT_UTF8)),
        ("--user", ("save", "--user", NOT_UTF8, "hello")),
        ("--subject", ("save", "--user", user, "--subject", NOT_UTF8, "hello")),
        ("query", ("search", "--user", user, NOT_UTF8)),
        ("note_id", ("get", "--user", user, b"AAAA\xe9AAA")),
        ("text", ("update", "--user", user, "AAAAAAAA", NOT_UTF8)),
        ("--query", ("forget", "--user", user, "--query", NOT_UTF8)),
        ("old_id", ("supersede", "--user", user, b"\xff", "AAAAAAAA")),
    ]
    for argument, args in cases:
        done = engram_raw(env, *args, "--json")
        assert done.returncode == 1, (args, done.stderr)
        assert b"Traceback" not in done.stderr and done.stderr == b"", (args, done.stderr)
        error = json.loads(done.stdout)["error"]
        assert error["code"] == "INVALID_PARAMETER", (args, error)
        assert error["message"].startswith(f"{argument} is not valid UTF-8"), (args, error)
    plain = engram_raw(env, "save", "--user", user, NOT_UTF8)
    assert plain.returncode == 1 and plain.stdout == b""
    assert plain.stderr.decode().splitlines() == [
        "engram: INVALID_PARAMETER: text is not valid UTF-8 (byte 0xe9 at position 3); give text in UTF-8"
    ]
    code, listed, _ = cli(env, "list", "--user", user)
    assert code == 0 and listed["notes"] == []


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    # `engram docs | head -1`: the document (100 KB) outgrows the pipe, and head closes it.
    env = engram_env(ENGRAM_DATA_DIR=str(tmp_path))
    reader = subprocess.Popen(
        [*ENGRAM_CLI, "docs"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reader.stdout is not None and reader.stderr is not None
    assert reader.stdout.readline() == b"{\n"
    reader.stdout.close()
    err = reader.stderr.read()
    assert reader.wait(timeout=30) == 141  # what a shell reports for a writer its reader left: 128 + SIGPIPE
    assert err == b"", err.decode()


def test_operator_commands_without_redis_or_their_file_are_one_clear_line(tmp_path: Path) -> None:
    env = engram_env(ENGRAM_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", ENGRAM_DATA_DIR=str(tmp_path))
    for args in (("tail", "--count", "1"), ("export", "--out", str(tmp_path / "log.jsonl")), ("rebuild", "history")):
        code, out, err = cli(env, *args)
        assert code == 1 and err == "" and out["error"]["code"] == "UNAVAILABLE", (args, out, err)
        assert "cannot reach the Engram bus" in out["error"]["message"]
        plain = cli_text(env, *args)
        assert plain.returncode == 1 and plain.stderr.startswith("engram: UNAVAILABLE: cannot reach the Engram bus")
        assert len(plain.stderr.splitlines()) == 1, plain.stderr
    missing = tmp_path / "missing.jsonl"
    code, out, err = cli(env, "import", str(missing))
    assert code == 1 and err == "" and out["error"]["code"] == "INVALID_PARAMETER"
    assert out["error"]["message"] == f"cannot open {missing}: No such file or directory"
    plain = cli_text(env, "schema", "--out", str(tmp_path / "no" / "schema.json"))
    assert plain.returncode == 1 and len(plain.stderr.splitlines()) == 1, plain.stderr
    assert plain.stderr.startswith("engram: INVALID_PARAMETER: cannot open ")


def test_argument_errors_under_json_are_one_error_object(tmp_path: Path) -> None:
    env = engram_env(ENGRAM_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", ENGRAM_DATA_DIR=str(tmp_path))
    code, out, err = cli(env, "update", "--user", "u", "--expected-version", "abc", "AAAAAAAA")
    assert code == 1 and err == "", err
    assert out == {
        "error": {
            "code": "INVALID_PARAMETER",
            "message": "engram update: argument --expected-version: invalid int value: 'abc'",
        }
    }
    code, out, err = cli(env, "save", "--user", "u")
    assert code == 1 and err == "" and out["error"]["code"] == "INVALID_PARAMETER"
    assert "the following arguments are required: text" in out["error"]["message"]
    code, out, _ = cli(env, "search", "--user", "u", "--since", "last week", "x")
    assert code == 1 and out["error"]["code"] == "INVALID_PARAMETER" and "--since" in out["error"]["message"]
    code, out, _ = cli(env, "sav", "--user", "u", "x")
    assert (
        code == 1 and out["error"]["code"] == "INVALID_PARAMETER" and "invalid choice: 'sav'" in out["error"]["message"]
    )
    # Without --json argparse keeps its usage line and exit status.
    plain = cli_text(env, "save", "--user", "u")
    assert plain.returncode == 2 and plain.stderr.startswith("usage: engram save")


# Output for a person ----------------------------------------------------------------------

ANSI = "\x1b["


def human(env: dict[str, str], *args: str) -> str:
    done = cli_text(env, *args)
    assert done.returncode == 0 and done.stderr == "", (args, done.stderr)
    assert ANSI not in done.stdout, "colour only on a terminal"
    return done.stdout


def test_human_output_says_what_the_reply_says(env: dict[str, str], user: str) -> None:
    saved = human(env, "save", "--user", user, "Likes black coffee")
    first = saved.split()[1]
    assert saved.startswith(f"saved {first} (version 1)") and "token " in saved
    assert human(env, "save", "--user", user, "likes  BLACK coffee") == (
        f"already saved as {first} (version 1): nothing new written\n"
    )

    _, newer, _ = cli(env, "save", "--user", user, "Drinks green tea now")
    replaced = human(env, "supersede", "--user", user, first, newer["note_id"])
    assert f"{first} is superseded by {newer['note_id']}" in replaced
    token = replaced.split("token ")[1].split()[0]
    assert token and ":" in token
    old = human(env, "get", "--user", user, "--after", token, first)
    assert "Likes black coffee" in old and f"superseded by {newer['note_id']}" in old
    assert f"superseded  by {newer['note_id']}" in human(env, "history", "--user", user, first)
    listing = human(env, "list", "--user", user, "--include-superseded").splitlines()
    assert len(listing) == 2 and f"superseded by {newer['note_id']}" in next(x for x in listing if first in x)

    long_text = ("word " * 4000)[:16_383] + "!"
    _, big, _ = cli(env, "save", "--user", user, long_text)
    shown = human(env, "get", "--user", user, big["note_id"])
    assert "… (16,384 characters; --json for all)" in shown and max(map(len, shown.splitlines())) < 1100
    listed = human(env, "list", "--user", user)
    assert max(map(len, listed.splitlines())) < 300 and "16,384 characters" in listed

    _, gone, _ = cli(env, "forget", "--user", user, "--yes", newer["note_id"])
    forgotten = human(env, "get", "--user", user, "--after", gone["token"], newer["note_id"])
    assert "forgotten on " in forgotten and "its content is gone" in forgotten
    history = human(env, "history", "--user", user, newer["note_id"])
    assert history.strip() and "forgotten on " in history and "its content is gone" in history

    health = human(env, "health")
    assert health.startswith("status: ok\n") and "partition 0" in health and "{" not in health


def test_colour_on_a_terminal(env: dict[str, str], user: str) -> None:
    import os
    import pty

    _, saved, _ = cli(env, "save", "--user", user, "Likes black coffee")
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [*ENGRAM_CLI, "get", "--user", user, saved["note_id"]],
            env={k: v for k, v in env.items() if k not in ("NO_COLOR", "FORCE_COLOR")} | {"TERM": "xterm-256color"},
            cwd=ROOT,
            stdout=follower,
            stderr=subprocess.PIPE,
            timeout=60,
        )
        os.close(follower)
        follower = -1
        out = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    assert done.returncode == 0 and "Likes black coffee" in out.decode() and ANSI in out.decode()


# What the forget tools say to a model (services/application/forget.py's messages).
TOOL_WORDS = ("memory_id", "call forget", "ask the user", "please confirm")


def test_human_output_of_advice_and_search(env_with_index: dict[str, str]) -> None:
    env = env_with_index
    _, boss, _ = cli(env, "save", "--user", "ann", "--subject", "Alec", "Alec is my boss at TechCorp")
    saved = human(env, "save", "--user", "ann", "--subject", "Alec", "Alec is my manager at TechCorp")
    newer = saved.split()[1]
    lines = saved.splitlines()
    assert lines[0].startswith(f"saved {newer} (version 1)")
    at = lines.index("similar notes (the new one may make them outdated):")
    assert lines[at + 1].split()[0] == boss["note_id"] and lines[at + 1].endswith("[Alec] Alec is my boss at TechCorp")
    assert f"same subject: {boss['note_id']}" in lines
    assert f"if it makes one outdated: engram supersede --user ann <outdated id> {newer}" in lines
    assert "supersede_note(" not in saved, "a person is told the command, not the model's tool call"

    done = human(env, "supersede", "--user", "ann", boss["note_id"], newer)
    token = done.split("token ")[1].split()[0]
    found = human(env, "search", "--user", "ann", "--include-superseded", "--after", token, "who is my boss?")
    hit = next(x for x in found.splitlines() if boss["note_id"] in x)
    assert f"superseded by {newer}" in hit and "memory" in hit
    assert f"superseded by {newer}" not in human(env, "search", "--user", "ann", "--after", token, "who is my boss?")

    # Forgetting by query: the command a person runs next, never the tool's call for a model.
    asked = human(env, "forget", "--user", "ann", "--query", "Alec")
    assert asked.startswith("Found ") and f"  {newer}  " in asked
    assert asked.splitlines()[-1] == "Forget which one? Run: engram forget --user ann ID"
    assert not any(word in asked.lower() for word in TOOL_WORDS), asked


def test_forget_speaks_to_a_person(env: dict[str, str], user: str) -> None:
    _, saved, _ = cli(env, "save", "--user", user, "User lives in San Francisco")
    note = saved["note_id"]
    asked = human(env, "forget", "--user", user, note).splitlines()
    assert asked[0] == f"Forget 'User lives in San Francisco' ({note})? Nothing is deleted yet."
    assert asked[1].startswith("Run the same command again before ") and asked[1].endswith(" to forget it.")
    done = human(env, "forget", "--user", user, note)
    assert done.startswith(f"Forgotten: {note}. The content cannot be recovered.")
    assert not any(word in text.lower() for text in (*asked, done) for word in TOOL_WORDS)


def test_get_and_the_listings_agree_on_a_notes_reads(env: dict[str, str], user: str) -> None:
    """`engram get` said "read 6 times" while `engram list --json` gave access_count 0."""
    _, saved, _ = cli(env, "save", "--user", user, "Alec is my boss")
    note = saved["note_id"]
    for count in (1, 2):
        _, got, _ = cli(env, "get", "--user", user, note, "--after", saved["token"])
        _, listed, _ = cli(env, "list", "--user", user)
        _, recent, _ = cli(env, "recent", "--user", user)
        shown = [(n["access_count"], n["last_accessed_at"]) for n in (got, listed["notes"][0], recent["notes"][0])]
        assert shown == [(count, got["last_accessed_at"])] * 3 and got["last_accessed_at"] is not None
    assert "read 3 times, last " in human(env, "get", "--user", user, note)


def test_list_pages_and_says_how_many_more(env: dict[str, str], user: str) -> None:
    """`engram list` printed the whole memory in one go; it now asks for a page (--limit,
    --offset) and says how many more there are."""
    for i in range(5):
        code, saved, _ = cli(env, "save", "--user", user, "--category", "general", f"fact number {i}")
        assert code == 0, saved
    code, page, _ = cli(env, "list", "--user", user, "--limit", "2", "--offset", "1", "--after", saved["token"])
    assert code == 0 and len(page["notes"]) == 2 and page["total"] == 5 and page["more"] == 2, page
    shown = human(env, "list", "--user", user, "--limit", "2").splitlines()
    assert len(shown) == 3 and shown[-1] == "… 3 more (--offset 2)", shown
    assert human(env, "list", "--user", user).count("fact number") == 5, "a page of 100 by default"
    code, refused, _ = cli(env, "list", "--user", user, "--limit", "1001")
    assert code == 1 and refused["error"]["code"] == "INVALID_PARAMETER" and "limit" in refused["error"]["message"]


def test_the_readme_puts_engram_on_path() -> None:
    """README's examples call `engram`; the lines before them put it on PATH."""
    import os

    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Using it", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    setup = []
    for line in block.splitlines():
        if line.startswith("engram "):
            break
        setup.append(line.split("#", 1)[0].strip())
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin and ".venv" not in p)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PATH": path}
    script = "\n".join([*filter(None, setup), "engram --help"])
    done = subprocess.run(["bash", "-ec", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: engram"), done.stderr


def test_engram_model_prepares_the_encoder_in_the_model_cache() -> None:
    """What the Dockerfile runs at install: the export exists afterwards and a second run only loads it."""
    from tests.support import TEST_MODEL_CACHE

    code, ready, _ = cli(engram_env(), "model")  # engram_env names the tests' shared model cache
    assert code == 0 and ready["encoder"] == "onnx" and ready["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert ready["model_cache"] == str(TEST_MODEL_CACHE) and list(TEST_MODEL_CACHE.glob("all-MiniLM-L6-v2-*.onnx"))
    code, refused, _ = cli(engram_env(ENGRAM_ENCODER="tf"), "model")
    assert code == 1 and "ENGRAM_ENCODER='tf' is not one of onnx, onnx-int8, torch" in refused["error"]["message"]


def test_time_travel_through_the_cli(env: dict[str, str], user: str) -> None:
    _, saved, _ = cli(env, "save", "--user", user, "--category", "work", "Tess works at Acme")
    note_id = saved["note_id"]
    _, updated, _ = cli(env, "update", "--user", user, note_id, "Tess works at Initech")
    # As of the save's token: the note and the listing as they were right after it.
    code, then, _ = cli(env, "get", "--user", user, "--as-of", saved["token"], "--after", updated["token"], note_id)
    assert code == 0 and (then["version"], then["content"]) == (1, "Tess works at Acme")
    _, listed, _ = cli(env, "list", "--user", user, "--as-of", saved["token"])
    assert [n["content"] for n in listed["notes"]] == ["Tess works at Acme"]
    # What changed since the save: the update, before and after.
    _, diff, _ = cli(env, "diff", "--user", user, "--since", saved["token"])
    assert [(c["change"], c["before"]["content"], c["after"]["content"]) for c in diff["changes"]] == [
        ("updated", "Tess works at Acme", "Tess works at Initech")
    ]
    shown = human(env, "diff", "--user", user, "--since", saved["token"])
    assert "updated" in shown and "Tess works at Acme → Tess works at Initech" in shown
    # Undo as a new version: version 3 holds what version 1 held.
    reverted = human(env, "revert", "--user", user, note_id, "--to-version", "1")
    assert f"reverted {note_id} to what version 1 held: now version 3" in reverted
    history = human(env, "history", "--user", user, note_id)
    assert "v3" in history and "reverted" in history
    assert "nothing new written" in human(env, "revert", "--user", user, note_id, "--to-version", "1")
    assert human(env, "get", "--user", user, "--as-of", saved["token"], note_id).startswith(
        f"as of {saved['token']}:\n"
    )
    code, refused, _ = cli(env, "revert", "--user", user, note_id, "--to-version", "9")
    assert code == 1 and refused["error"]["code"] == "INVALID_PARAMETER"
    assert "has versions 1 to 3: version 9 is not one" in refused["error"]["message"]
    code, bad, _ = cli(env, "get", "--user", user, "--as-of", "last tuesday", note_id)
    assert code == 1 and bad["error"]["code"] == "INVALID_PARAMETER" and "as_of" in bad["error"]["message"]
    # World time: when a fact held; a supersede ends it where the new one begins.
    _, old, _ = cli(env, "save", "--user", user, "--valid-from", "2019-02-01", "Carol lives in Lyon")
    _, new, _ = cli(env, "save", "--user", user, "--valid-from", "2023-09-01", "Carol lives in Nantes")
    cli(env, "supersede", "--user", user, old["note_id"], new["note_id"])
    _, moved, _ = cli(env, "get", "--user", user, old["note_id"])
    assert (moved["valid_from"], moved["valid_until"]) == ("2019-02-01T00:00:00Z", "2023-09-01T00:00:00Z")
    _, held, _ = cli(env, "list", "--user", user, "--valid-at", "2020")
    assert [n["content"] for n in held["notes"] if "Carol lives" in n["content"]] == ["Carol lives in Lyon"]
    assert "held in the world from 2019-02-01 00:00:00 UTC until 2023-09-01 00:00:00 UTC" in human(
        env, "get", "--user", user, old["note_id"]
    )


def test_recalls_through_the_cli(bus: dict[str, str], tmp_path: Path) -> None:
    # An agent's memory block is recorded as a recall for the audited user only.
    for env in serving(bus, tmp_path / "data", ENGRAM_INDEX="off", ENGRAM_RECALL_AUDIT="dora"):
        _, saved, _ = cli(env, "save", "--user", "dora", "Dora's flight is on Friday")
        code, block, _ = cli(env, "context", "--user", "dora", "--after", saved["token"])
        assert code == 0 and saved["note_id"] in block["note_ids"]
        cli(env, "context", "--user", "erin")
        recalls: list[dict[str, object]] = []
        for _ in range(50):
            _, listed, _ = cli(env, "recalls", "--user", "dora")
            recalls = listed["recalls"]
            if recalls:
                break
        assert [(r["kind"], r["notes"], r["versions"]) for r in recalls] == [("context", [saved["note_id"]], [1])]
        assert cli(env, "recalls", "--user", "erin")[1]["recalls"] == []
        assert "context" in human(env, "recalls", "--user", "dora")
