"""The Redis roles' recipe as data (services/ops/acl.py), the client's reply channels bound to its
ACL user, and the URL read from a secret file. What each role may do on a real Redis is
integration/test_redis_roles.py's."""

from __future__ import annotations

import hashlib
import json
import stat
import uuid
from fnmatch import fnmatchcase
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services import cli
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.config import SettingError, Settings
from engram_ledger.services.ops import acl


def test_every_role_starts_from_nothing_so_a_setuser_replaces_what_was_there() -> None:
    for role in acl.ROLES:
        rules = acl.rules(role, "someone")
        assert rules[:3] == ["resetkeys", "resetchannels", "-@all"], role
        assert acl.setuser(role, "someone")[:5] == ["ACL", "SETUSER", "someone", "reset", "on"]
        # Nothing grants every key, channel or command.
        assert not {"~*", "&*", "allkeys", "allchannels", "allcommands", "+@all", "nopass"} & set(rules), role
    assert "+@dangerous" not in acl.rules("service", "s") and "-@dangerous" in acl.rules("service", "s")


def test_a_clients_reply_channels_fall_under_its_own_pattern_alone() -> None:
    # Redis matches ACL channel patterns as globs, as fnmatchcase does for these names.
    mine = channels.reply_channel(uuid.uuid4().hex, "agent-a")
    assert fnmatchcase(mine, channels.client_reply_channels("agent-a"))
    for other in ("agent-b", "agent", "agent-a-2", "agent-"):
        assert not fnmatchcase(mine, channels.client_reply_channels(other)), other
    unnamed = channels.reply_channel(uuid.uuid4().hex)
    assert unnamed.startswith("engram:replies:") and not fnmatchcase(unnamed, channels.client_reply_channels("a"))
    assert f"&{channels.client_reply_channels('agent-a')}" in acl.rules("agent", "agent-a")


@pytest.mark.parametrize("name", ["", "a:b", "agent*", "a?", "a[1]", "a b", "-a", "é", "x" * 65, "a\\b"])
def test_a_name_that_could_reach_another_clients_channels_is_refused(name: str) -> None:
    with pytest.raises(EngramError) as refused:
        acl.rules("agent", name)
    assert refused.value.code is ErrorCode.INVALID_PARAMETER and "user name" in refused.value.message
    with pytest.raises(EngramError) as refused:
        EngramClient("redis://127.0.0.1:1/0", client_name=name)
    assert refused.value.code is ErrorCode.INVALID_PARAMETER and "client_name" in refused.value.message


def test_an_unknown_role_is_refused_naming_the_roles() -> None:
    with pytest.raises(EngramError) as refused:
        acl.rules("admin", "x")
    assert refused.value.code is ErrorCode.INVALID_PARAMETER
    assert refused.value.message == "unknown role 'admin'; one of service, operator, agent, front-door, subscriber"


async def test_the_client_takes_its_name_from_the_urls_acl_user() -> None:
    for url, name in (
        ("redis://engram-agent:pw@127.0.0.1:1/0", "engram-agent"),
        ("rediss://agent.7:pw@127.0.0.1:1/0?ssl_ca_certs=/x", "agent.7"),
        ("redis://:pw@127.0.0.1:1/0", None),  # requirepass: no user name
        ("redis://127.0.0.1:1/0", None),
        ("redis://we%3Aird:pw@127.0.0.1:1/0", None),  # `we:ird` cannot name channels: unnamed, as before
    ):
        client = EngramClient(url)
        try:
            assert client.client_name == name, url
            assert client._bus.reply_channel.startswith(f"engram:replies:{name}:" if name else "engram:replies:")
        finally:
            await client.close()
    given = EngramClient("redis://engram-agent:pw@127.0.0.1:1/0", client_name="other")
    assert given.client_name == "other"
    await given.close()


def test_write_deployment_makes_private_files_with_hashed_passwords_and_never_replaces_them(tmp_path: Path) -> None:
    paths = acl.write_deployment(tmp_path / "secrets", "redis:6379", database=2)
    assert set(paths) == {"acl", *acl.ROLES}
    for path in paths.values():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    lines = paths["acl"].read_text().splitlines()
    assert lines[: len(acl.PREAMBLE)] == acl.PREAMBLE and lines[0] == "user default off"
    for role in acl.ROLES:
        url = urlsplit(paths[role].read_text().strip())
        assert (url.scheme, url.hostname, url.port, url.path) == ("redis", "redis", 6379, "/2")
        assert url.username == acl.DEFAULT_USERS[role] and url.password
        digest = hashlib.sha256(url.password.encode()).hexdigest()
        line = next(line for line in lines if line.startswith(f"user {url.username} "))
        assert line == acl.acl_file_line(role, url.username, url.password)
        assert f"#{digest}" in line and url.password not in paths["acl"].read_text()
    before = {name: path.read_text() for name, path in paths.items()}
    with pytest.raises(EngramError) as refused:
        acl.write_deployment(tmp_path / "secrets", "redis:6379")
    assert refused.value.code is ErrorCode.INVALID_PARAMETER and "already exist" in refused.value.message
    assert {name: path.read_text() for name, path in paths.items()} == before


def test_engram_acl_prints_a_roles_setuser_and_refuses_a_bad_request(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["acl", "agent", "--name", "agent-7", "--json"]) == 0
    [role] = json.loads(capsys.readouterr().out)["roles"]
    assert role["role"] == "agent" and role["setuser"] == acl.setuser("agent", "agent-7")
    assert cli.main(["acl", "--json"]) == 0
    assert [r["user"] for r in json.loads(capsys.readouterr().out)["roles"]] == list(acl.DEFAULT_USERS.values())
    assert cli.main(["acl", "subscriber", "--cluster"]) == 0
    assert "+cluster|slots" in capsys.readouterr().out
    for bad in (["acl", "--name", "x"], ["acl", "agent", "--name", "a:b"], ["acl", "agent", "--write", "/tmp/x"]):
        assert cli.main([*bad, "--json"]) == 1
        assert json.loads(capsys.readouterr().out)["error"]["code"] == "INVALID_PARAMETER", bad


def test_the_redis_url_can_come_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ENGRAM_REDIS_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    secret = tmp_path / "url"
    secret.write_text("redis://engram-service:pw@redis:6379/0\n")
    monkeypatch.setenv("ENGRAM_REDIS_URL_FILE", str(secret))
    settings = Settings.from_env()
    assert settings.redis_url == "redis://engram-service:pw@redis:6379/0" and settings.redis_url_configured
    monkeypatch.setenv("ENGRAM_REDIS_URL", "redis://other:6379/0")  # the variable itself comes first
    assert Settings.from_env().redis_url == "redis://other:6379/0"
    monkeypatch.delenv("ENGRAM_REDIS_URL")
    for content, problem in ((None, "cannot read it"), ("  \n", "is empty")):
        missing = tmp_path / "missing"
        if content is not None:
            missing.write_text(content)
        monkeypatch.setenv("ENGRAM_REDIS_URL_FILE", str(missing))
        with pytest.raises(SettingError, match=problem) as refused:
            Settings.from_env()
        assert "ENGRAM_REDIS_URL_FILE" in str(refused.value)


def test_every_role_names_the_deployments_partitions_and_no_pattern_over_the_tag() -> None:
    for role in acl.ROLES:
        rules = acl.rules(role, "someone", partitions=3)
        if role != "service":
            assert not [r for r in rules if "{*}" in r], (role, rules)
    agent = acl.rules("agent", "someone", partitions=3)
    assert [r for r in agent if r.startswith("%W~")] == [
        *(f"%W~{channels.inbox(channels.command_stream(p))}" for p in range(3)),
        *(f"%W~{channels.inbox(channels.query_stream(p))}" for p in range(3)),
    ]
    # Appending is all the agent may do: no command of a stream, nor of a user's places.
    assert [r for r in agent if r.startswith("+") and r not in ("+ping", "+select")] == [
        "+get",
        "+rpush",
        "+subscribe",
        "+unsubscribe",
    ]
    assert [r for r in acl.rules("subscriber", "s", partitions=2) if r.startswith("~")] == [
        f"~{channels.event_log(0)}",
        f"~{channels.event_log(1)}",
    ]
    assert cli.main(["acl", "agent", "--partitions", "2", "--json"]) == 0
    assert cli.main(["acl", "agent", "--partitions", "0", "--json"]) == 1
