"""Security through the command line: no Redis password in any message or log line; the embedded
default's private Redis asks for a password and its files (and an export) are the user's alone;
`engram import` refuses a tampered file before writing anything."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import msgspec
import pytest
import redis

from engram_ledger.contracts import channels
from engram_ledger.contracts.base import SCHEMA_VERSION
from engram_ledger.services.adapters.redis_server import free_port
from tests.builders import saved
from tests.support import ServeProcess, cli, cli_text, engram_env, redis_with_password

PASSWORD = "S3CRETPW-for-tests"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_no_message_or_log_line_shows_the_redis_password(tmp_path: Path) -> None:
    with redis_with_password(tmp_path, PASSWORD) as port:
        wrong = engram_env(ENGRAM_REDIS_URL=f"redis://engram:typo-{PASSWORD}@127.0.0.1:{port}/0")
        for args in (("list", "--user", "alice"), ("tail", "--count", "1")):
            plain = cli_text(wrong, *args)
            assert plain.returncode == 1 and "engram:***@127.0.0.1" in plain.stderr, plain.stderr
            assert PASSWORD not in plain.stderr + plain.stdout

        env = engram_env(
            ENGRAM_REDIS_URL=f"redis://:{PASSWORD}@127.0.0.1:{port}/0",
            ENGRAM_DATA_DIR=str(tmp_path / "data"),
            ENGRAM_INDEX="off",
        )
        code, out, _ = cli(env, "save", "--user", "alice", "no service yet")
        assert code == 1 and "redis://:***@127.0.0.1" in out["error"]["message"]
        assert PASSWORD not in json.dumps(out)

        serve = ServeProcess(env).start()
        try:
            assert any(f"using the configured Redis at redis://:***@127.0.0.1:{port}/0" in line for line in serve.lines)
        finally:
            assert serve.stop() == 0
        assert PASSWORD not in "".join(serve.lines)


def test_the_private_redis_asks_for_a_password_and_its_files_are_the_users_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = engram_env(
        ENGRAM_DEFAULT_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", ENGRAM_DATA_DIR=str(data), ENGRAM_INDEX="off"
    )
    serve = ServeProcess(env).start()
    try:
        assert any("started a private redis-server" in line for line in serve.lines)
        url = (data / "redis.url").read_text()
        password = (data / "redis.password").read_text().strip()
        assert f":{password}@" in url and len(password) >= 32
        assert password not in "".join(serve.lines), "the log shows the URL without its password"
        private = redis.Redis.from_url(url)
        port = private.connection_pool.connection_kwargs["port"]
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()  # a local user without the password
        # Not on the command line either, which every local user can read.
        cmdline = Path(f"/proc/{private.info('server')['process_id']}/cmdline").read_bytes()
        assert password.encode() not in cmdline
        private.close()

        code, note, _ = cli(env, "save", "--user", "alice", "kept in the private Redis")
        assert code == 0, note
        export = tmp_path / "export.jsonl"
        export.write_text("")
        export.chmod(0o644)  # one that was there already is narrowed too
        code, out, _ = cli(env, "export", "--out", str(export))
        assert code == 0 and out["events"] == 1
    finally:
        assert serve.stop() == 0
    assert mode(export) == 0o600, "an export holds every wrapped data key"
    assert mode(data) == 0o700 and mode(data / "redis") == 0o700
    files = [p for p in data.rglob("*") if p.is_file()]
    assert {"master.key", "redis.password", "redis.conf"} <= {p.name for p in files}
    assert list((data / "redis").rglob("*.aof")), "the AOF is among them"
    assert {p.relative_to(data): oct(mode(p)) for p in files if mode(p) != 0o600} == {}
    assert [p for p in data.rglob("*") if p.is_dir() and mode(p) != 0o700] == []

    # The next start keeps the password (and the data).
    serve = ServeProcess(env).start()
    try:
        assert f":{password}@" in (data / "redis.url").read_text()
        code, listing, _ = cli(env, "list", "--user", "alice")
        assert code == 0 and [n["content"] for n in listing["notes"]] == ["kept in the private Redis"]
    finally:
        assert serve.stop() == 0


def test_import_refuses_a_tampered_file_naming_its_line_and_writes_nothing(tmp_path: Path, redis_url: str) -> None:
    lines = [
        json.dumps({"engram_export": 1, "partitions": 1, "schema_version": SCHEMA_VERSION}),
        json.dumps({"p": 0, "id": "1-0", "e": msgspec.json.encode(saved("AAAAAAAA")).decode()}),
        # Edited: a user id that no request could carry, aimed at another user's keys.
        json.dumps({"p": 0, "id": "2-0", "e": msgspec.json.encode(saved("BBBBBBBB", user_id="bob}:x")).decode()}),
    ]
    source = tmp_path / "tampered.jsonl"
    source.write_text("\n".join(lines) + "\n")
    env = engram_env(ENGRAM_REDIS_URL=redis_url, ENGRAM_DATA_DIR=str(tmp_path / "data"))
    code, out, _ = cli(env, "import", str(source))
    assert code == 1 and out["error"]["code"] == "INVALID_PARAMETER"
    assert out["error"]["message"].startswith("line 3: user id 'bob}:x' is not"), out
    plain = cli_text(env, "import", str(source))
    assert plain.returncode == 1 and len(plain.stderr.splitlines()) == 1, plain.stderr
    with redis.Redis.from_url(redis_url) as target:
        assert target.dbsize() == 0 and target.get(channels.PARTITIONS_KEY) is None
