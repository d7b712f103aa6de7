"""Redis roles with least privilege (docs/operations.md): a redis-server started from the ACL file `engram
acl --write` makes (the password-less default user off), `engram serve` running as the service
role from its URL file, and each role doing its work through the real code and refused, by Redis
itself (NOPERM), what it must not do."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoPermissionError

from engram_ledger.contracts import channels
from engram_ledger.contracts.channels import HistoryKeys
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.projections.history import live_generation
from engram_ledger.services.adapters.redis_server import find_redis_server, free_port
from engram_ledger.services.agents.tokens import EngramTokenVerifier, TokenRegistry
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.ops import acl
from tests.cluster import LocalCluster
from tests.conftest import RunningService, service_settings
from tests.support import ServeProcess, cli, engram_env, eventually, until_none, wait_until

PARTITIONS = 2
ADMIN_PASSWORD = "admin-for-the-tests-own-inspection"
OTHER_AGENT = "agent-b"
OTHER_AGENT_PASSWORD = "agent-b-password"


@dataclass
class Roles:
    port: int
    directory: Path
    serve: ServeProcess

    def url(self, role: str) -> str:
        return (self.directory / acl.url_file(role)).read_text().strip()

    @property
    def admin_url(self) -> str:
        return f"redis://admin:{ADMIN_PASSWORD}@127.0.0.1:{self.port}/0"

    @property
    def other_agent_url(self) -> str:
        return f"redis://{OTHER_AGENT}:{OTHER_AGENT_PASSWORD}@127.0.0.1:{self.port}/0"

    def env(self, role: str) -> dict[str, str]:
        return engram_env(ENGRAM_REDIS_URL=self.url(role), HF_HUB_OFFLINE="1")


@pytest.fixture(scope="module")
def roles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Roles]:
    directory = tmp_path_factory.mktemp("redis-roles")
    port = free_port()
    acl.write_deployment(directory / "secrets", f"127.0.0.1:{port}", partitions=PARTITIONS)
    # The deployment's ACL file as it is, and an admin user for the test's own inspection.
    users = directory / "users.acl"
    users.write_text(
        (directory / "secrets" / acl.ACL_FILE).read_text() + f"user admin on >{ADMIN_PASSWORD} ~* &* +@all\n"
    )
    server = subprocess.Popen(
        [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--aclfile", str(users),
         "--dir", str(directory), "--appendonly", "yes", "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    admin = redis.Redis.from_url(f"redis://admin:{ADMIN_PASSWORD}@127.0.0.1:{port}/0")
    serve: ServeProcess | None = None
    try:
        wait_until(lambda: _pings(admin))
        # A second agent, made the way an operator adds one: `engram acl agent --name agent-b`.
        admin.execute_command(*acl.setuser("agent", OTHER_AGENT, partitions=PARTITIONS))
        admin.execute_command("ACL", "SETUSER", OTHER_AGENT, f">{OTHER_AGENT_PASSWORD}")
        env = engram_env(
            ENGRAM_REDIS_URL_FILE=str(directory / "secrets" / acl.url_file("service")),
            ENGRAM_DATA_DIR=str(directory / "data"),
            ENGRAM_PARTITIONS=str(PARTITIONS),
            HF_HUB_OFFLINE="1",
        )
        serve = ServeProcess(env).start(timeout=60)
        yield Roles(port, directory / "secrets", serve)
    finally:
        if serve is not None:
            serve.stop()
        admin.close()
        server.terminate()
        server.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def _user() -> str:
    return f"u-{uuid.uuid4().hex[:10]}"


async def _refused(*calls: tuple[str, Callable[[], Awaitable[Any]]]) -> None:
    """Every call must be refused by Redis's ACL."""
    allowed = []
    for what, call in calls:
        try:
            await call()
        except NoPermissionError:
            continue
        allowed.append(what)
    assert not allowed, f"allowed, but must be refused: {allowed}"


async def _refused_subscriptions(client: aioredis.Redis, *, channels_: list[str], patterns: list[str]) -> None:
    allowed = []
    for kind, names in (("subscribe", channels_), ("psubscribe", patterns)):
        for name in names:
            pubsub = client.pubsub()
            try:
                await getattr(pubsub, kind)(name)
                # Redis answers a subscription on the connection: the refusal is read, not returned.
                await pubsub.get_message(timeout=2)
                allowed.append(f"{kind} {name}")
            except NoPermissionError:
                pass
            finally:
                await pubsub.aclose()
    assert not allowed, f"allowed, but must be refused: {allowed}"


@dataclass
class Stored:
    """Real keys the service wrote for one saved note, found as the admin."""

    user: str
    note_id: str
    partition: int
    log: str
    note_stream: str
    data_key: str
    read_model: str


async def _stored(roles: Roles, user: str, note_id: str) -> Stored:
    p = channels.partition_of(user, PARTITIONS)
    admin = aioredis.Redis.from_url(roles.admin_url)
    try:
        stored = Stored(
            user=user,
            note_id=note_id,
            partition=p,
            log=channels.event_log(p),
            note_stream=channels.note_stream(p, user, note_id),
            data_key=channels.data_key(p, user, note_id),
            read_model=HistoryKeys(p, await live_generation(admin, p)).note(user, note_id),
        )
        for key in (stored.log, stored.note_stream, stored.data_key, stored.read_model):
            assert await admin.exists(key), f"{key} was expected to exist: the refusal must be of a real key"
        return stored
    finally:
        await admin.aclose()


def _reads_of_stored_data(r: aioredis.Redis, s: Stored) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
    return [
        ("XRANGE the log", lambda: r.xrange(s.log)),
        ("XREAD the log", lambda: r.xread({s.log: "0"})),
        ("XRANGE a note's stream", lambda: r.xrange(s.note_stream)),
        ("GET a note's data key", lambda: r.get(s.data_key)),
        ("GET the read model", lambda: r.get(s.read_model)),
        ("HGETALL the read model", lambda: r.hgetall(s.read_model)),
        ("XRANGE the command stream (others' requests)", lambda: r.xrange(channels.command_stream(s.partition))),
        ("XRANGE the query stream", lambda: r.xrange(channels.query_stream(s.partition))),
        ("HGETALL the workers", lambda: r.hgetall(channels.WORKERS_KEY)),
        ("SCAN", lambda: r.scan(0)),
        ("KEYS", lambda: r.keys("*")),
    ]


def _writes(r: aioredis.Redis, s: Stored) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
    return [
        ("XADD a forged event to the log", lambda: r.xadd(s.log, {"e": "{}"})),
        ("XDEL from the log", lambda: r.xdel(s.log, "0-1")),
        ("XTRIM the log", lambda: r.xtrim(s.log, maxlen=0)),
        ("XADD to a note's stream", lambda: r.xadd(s.note_stream, {"e": "{}"})),
        ("DEL a data key", lambda: r.delete(s.data_key)),
        ("SET the partitions", lambda: r.set(channels.PARTITIONS_KEY, "1")),
        ("PUBLISH to a reply channel", lambda: r.publish(channels.reply_channel("x", "engram-agent"), "forged")),
        ("PUBLISH an applied notice", lambda: r.publish(channels.applied_channel(0), "0 9999999999999-0")),
        ("FLUSHDB", lambda: r.flushdb()),
        ("CONFIG SET", lambda: r.config_set("appendonly", "no")),
    ]


async def test_an_agent_saves_searches_reads_and_asks_to_forget_through_the_client(roles: Roles) -> None:
    user = _user()
    async with EngramClient(roles.url("agent"), timeout=60) as agent:
        # Bound to its ACL user by the URL alone: its replies come where only it may listen.
        assert agent.client_name == acl.DEFAULT_USERS["agent"]
        assert agent.partitions == PARTITIONS
        saved = await agent.save(user, "My dentist is Dr. Okafor on Elm Street", subject="dentist")
        found = await agent.search(user, "who is my dentist?", after=saved.token)
        assert [hit.note_id for hit in found.results] == [saved.note_id]
        assert (await agent.get_note(user, saved.note_id, after=saved.token)).content.startswith("My dentist")
        assert [n.id for n in (await agent.list_notes(user, after=saved.token)).notes] == [saved.note_id]
        assert len((await agent.history(user, saved.note_id, after=saved.token)).versions) == 1
        # Forgetting, an agent's way: two calls.
        assert (await agent.forget(user, note_ids=[saved.note_id])).status == "confirmation_required"
        second = await agent.forget(user, note_ids=[saved.note_id])
        assert second.status == "forgotten"
        view = await agent.get_note(user, saved.note_id, after=second.token)
        assert view.status == "forgotten" and view.content == ""


async def test_an_agent_reads_no_log_note_key_read_model_or_request_and_writes_nothing(roles: Roles) -> None:
    user = _user()
    async with EngramClient(roles.url("agent"), timeout=30) as agent:
        saved = await agent.save(user, "The alarm code is 4417", advise=False)
        await agent.get_note(user, saved.note_id, after=saved.token)
    stored = await _stored(roles, user, saved.note_id)
    r = aioredis.Redis.from_url(roles.url("agent"))
    try:
        await _refused(
            *_reads_of_stored_data(r, stored),
            *_writes(r, stored),
            ("XREADGROUP the log", lambda: r.xreadgroup("g", "c", {stored.log: ">"})),
            ("XGROUP CREATE on the log", lambda: r.xgroup_create(stored.log, "g", "0")),
            ("XGROUP CREATE on a request stream", lambda: r.xgroup_create(channels.command_stream(0), "g", "0")),
            ("GET the token registry", lambda: r.hgetall(channels.TOKENS_KEY)),
        )
        # What it may do, for contrast: the refusals above are not a user that can do nothing.
        assert int(await r.get(channels.PARTITIONS_KEY)) == PARTITIONS
    finally:
        await r.aclose()


async def test_no_role_reaches_a_partition_the_deployment_does_not_have(roles: Roles) -> None:
    """Every role's rules name the deployment's partitions one by one: a stream under another
    hash tag (one past the last partition, or made up) takes no request, and no log is there to
    read. A pattern over the tag let an agent fill streams that no worker reads."""
    beyond, made_up = f"{{{PARTITIONS}}}", "{zzz}"
    for role in ("agent", "operator", "front-door"):
        r = aioredis.Redis.from_url(roles.url(role))
        try:
            await _refused(
                *(
                    (f"{role}: {verb} {key}", call)
                    for tag in (beyond, made_up)
                    for stream in (f"engram:{tag}:commands", f"engram:{tag}:queries")
                    for verb, key, call in (
                        ("XADD", stream, lambda s=stream, c=r: c.xadd(s, {"__data__": "junk"})),
                        ("RPUSH", f"{stream}:inbox", lambda s=stream, c=r: c.rpush(f"{s}:inbox", "junk")),
                    )
                )
            )
        finally:
            await r.aclose()
    r = aioredis.Redis.from_url(roles.url("subscriber"))
    try:
        await _refused(
            *(
                (f"subscriber: XREAD {log}", lambda g=log: r.xread({g: "0"}, count=1))
                for log in (f"engram:{beyond}:log", f"engram:{made_up}:log")
            )
        )
    finally:
        await r.aclose()


async def test_an_agent_appends_requests_and_can_do_nothing_else_to_the_bus(roles: Roles) -> None:
    """The agent's one write is RPUSH onto its partitions' inboxes: it cannot take or hold a
    user's places, trim or delete a request stream or an inbox, or read what waits there."""
    p = 0
    bob_places = channels.in_flight(p, "bob")
    commands, queries = channels.command_stream(p), channels.query_stream(p)
    r = aioredis.Redis.from_url(roles.url("agent"))
    try:
        await _refused(
            ("ZADD a user's places", lambda: r.zadd(bob_places, {"p1": 99999999999999, "p2": 99999999999998})),
            ("ZREM a user's places", lambda: r.zrem(bob_places, "p1")),
            ("DEL a user's places", lambda: r.delete(bob_places)),
            ("XADD MAXLEN 0 to the queries", lambda: r.xadd(queries, {"junk": "x"}, maxlen=0)),
            ("XADD to the commands", lambda: r.xadd(commands, {"__data__": "junk"})),
            ("XTRIM the queries", lambda: r.xtrim(queries, maxlen=0)),
            ("XDEL from the commands", lambda: r.xdel(commands, "0-1")),
            ("DEL the queries", lambda: r.delete(queries)),
            ("DEL an inbox", lambda: r.delete(channels.inbox(queries))),
            ("LTRIM an inbox", lambda: r.ltrim(channels.inbox(queries), 0, 0)),
            ("LPOP an inbox", lambda: r.lpop(channels.inbox(queries))),
            ("LRANGE an inbox", lambda: r.lrange(channels.inbox(queries), 0, -1)),
            ("LPUSH an inbox (to the front)", lambda: r.lpush(channels.inbox(queries), "first")),
            ("RPUSH to a key of its own making", lambda: r.rpush("engram:{0}:mine", "x")),
            ("EVAL a script", lambda: r.eval("return 1", 0)),
            ("FCALL a function", lambda: r.execute_command("FCALL", "engram_admit", "0")),
        )
    finally:
        await r.aclose()


async def test_a_flood_through_the_inbox_cannot_make_another_users_requests_time_out(roles: Roles) -> None:
    """As the agent role, one user's requests appended without pause (and, for good measure, the
    old ways to jam the bus tried on the way): another agent's saves and searches for another
    user of the same partition are all answered within their timeout."""
    flooder = aioredis.Redis.from_url(roles.url("agent"))
    p = channels.partition_of("mallory", PARTITIONS)
    user = next(u for u in (_user() for _ in range(1000)) if channels.partition_of(u, PARTITIONS) == p)
    body = json.dumps({"data": json.dumps({"type": "list_notes", "user_id": "mallory"}), "headers": {}})
    done = asyncio.Event()
    appended = 0

    async def flood() -> None:
        nonlocal appended
        while not done.is_set() and appended < 200_000:
            async with flooder.pipeline(transaction=False) as pipe:
                for _ in range(2_000):
                    pipe.rpush(channels.inbox(channels.query_stream(p)), body)
                await pipe.execute()
            appended += 2_000
        with pytest.raises(NoPermissionError):
            await flooder.xadd(channels.query_stream(p), {"junk": "x"}, maxlen=0)
        with pytest.raises(NoPermissionError):
            await flooder.zadd(channels.in_flight(p, user), {"held": 99999999999999})

    try:
        async with EngramClient(roles.other_agent_url, timeout=10) as other:
            flooding = asyncio.create_task(flood())
            saved = await other.save(user, "My bike is the green one by the door", advise=False)
            found = [await other.search(user, "which bike is mine?", after=saved.token) for _ in range(6)]
            again = await other.save(user, "and my helmet is red", advise=False)
            done.set()
            await flooding
        assert appended >= 2_000, "the flood was on while they were answered"
        assert all(f.results and f.results[0].note_id == saved.note_id for f in found)
        assert again.version == 1
    finally:
        await flooder.aclose()


async def test_an_agent_cannot_delete_at_once_through_the_operators_stream(roles: Roles) -> None:
    user = _user()
    p = channels.partition_of(user, PARTITIONS)
    async with EngramClient(roles.url("agent"), timeout=30) as agent:
        saved = await agent.save(user, "Keep the spare key under the blue pot", advise=False)
    r = aioredis.Redis.from_url(roles.url("agent"))
    try:
        await _refused(("XADD to the operators' stream", lambda: r.xadd(channels.operator_stream(p), {"x": "1"})))
    finally:
        await r.aclose()
    # The client's own way there, as an agent misconfigured as an operator: a typed refusal
    # naming the stream, and nothing deleted.
    async with EngramClient(roles.url("agent"), timeout=30, operator=True) as posing:
        with pytest.raises(EngramError) as refused:
            await posing.forget(user, note_ids=[saved.note_id], confirmed=True)
        assert refused.value.code is ErrorCode.PERMISSION_DENIED
        assert refused.value.message.startswith("the Redis user of redis://engram-agent:***@")
        assert f"may not send to {channels.operator_stream(p)}" in refused.value.message
        assert (await posing.get_note(user, saved.note_id, after=saved.token)).status == "active"


async def test_an_agent_cannot_hear_another_clients_replies(roles: Roles) -> None:
    other = aioredis.Redis.from_url(roles.other_agent_url)
    try:
        await _refused_subscriptions(
            other,
            channels_=[
                channels.reply_channel(uuid.uuid4().hex, acl.DEFAULT_USERS["agent"]),
                channels.reply_channel(uuid.uuid4().hex, acl.DEFAULT_USERS["operator"]),
                channels.reply_channel(uuid.uuid4().hex),  # an unnamed client's
                channels.applied_channel(0),
            ],
            patterns=["*", "engram:*", "engram:replies:*", channels.client_reply_channels(acl.DEFAULT_USERS["agent"])],
        )
    finally:
        await other.aclose()
    # Posing as the other agent by name is refused when connecting, in words.
    with pytest.raises(EngramError) as refused:
        await EngramClient(roles.other_agent_url, client_name=acl.DEFAULT_USERS["agent"]).connect()
    assert refused.value.code is ErrorCode.PERMISSION_DENIED and "reply channel" in refused.value.message
    assert OTHER_AGENT_PASSWORD not in refused.value.message
    # Under its own name (the user `engram acl agent --name agent-b` made), it works.
    user = _user()
    async with EngramClient(roles.other_agent_url, timeout=30) as mine:
        assert mine.client_name == OTHER_AGENT
        saved = await mine.save(user, "Ferry leaves at 7:40", advise=False)
        assert (await mine.get_note(user, saved.note_id, after=saved.token)).content == "Ferry leaves at 7:40"


async def test_the_front_door_checks_a_token_and_can_neither_list_nor_forge_them(roles: Roles) -> None:
    """`engram mcp --http` as the front-door role: it looks a presented token up (the tenant
    boundary: it picks the user), and otherwise has an agent's rights."""
    service = aioredis.Redis.from_url(roles.url("service"))
    door = aioredis.Redis.from_url(roles.url("front-door"))
    agent = aioredis.Redis.from_url(roles.url("agent"))
    try:
        token, record = await TokenRegistry(service).create(user_id="alice-at-the-door")  # `engram tokens create`
        access = await EngramTokenVerifier(TokenRegistry(door)).verify_token(token)
        assert access is not None and access.subject == "alice-at-the-door"
        assert await EngramTokenVerifier(TokenRegistry(door)).verify_token(token + "x") is None
        await _refused(
            ("the agent looks a token up", lambda: TokenRegistry(agent).find(token)),
            ("the front door lists the tokens", lambda: door.hgetall(channels.TOKENS_KEY)),
            ("the front door forges a token", lambda: door.hset(channels.TOKENS_KEY, "forged", "{}")),
            ("the front door revokes a token", lambda: door.hdel(channels.TOKENS_KEY, record.id)),
            ("the front door deletes at once", lambda: door.xadd(channels.operator_stream(0), {"x": "1"})),
            ("the front door writes the log", lambda: door.xadd(channels.event_log(0), {"x": "1"})),
            ("the front door trims the log", lambda: door.xtrim(channels.event_log(0), maxlen=0)),
            ("the front door keeps a group", lambda: door.xgroup_create(channels.event_log(0), "door", id="0")),
            ("the front door reads a data key", lambda: door.get(channels.data_key(0, "alice-at-the-door", "n1"))),
        )
        # It follows the log without a group: a caller's event stream (`GET /v1/events`).
        await door.xrevrange(channels.event_log(0), count=1)
    finally:
        for client in (service, door, agent):
            await client.aclose()
    async with EngramClient(roles.url("front-door"), timeout=30) as client:
        saved = await client.save("alice-at-the-door", "Prefers aisle seats", advise=False)
        assert (await client.get_note("alice-at-the-door", saved.note_id, after=saved.token)).status == "active"


async def test_the_operator_deletes_at_once_and_reads_nothing_else(roles: Roles) -> None:
    user = _user()
    async with EngramClient(roles.url("operator"), timeout=30, operator=True) as operator:
        assert operator.client_name == acl.DEFAULT_USERS["operator"]
        first = await operator.save(user, "Locker 12, combination 3-14-15", advise=False)
        second = await operator.save(user, "The wifi password is on the fridge", advise=False)
        done = await operator.forget(user, note_ids=[first.note_id], confirmed=True)
        assert done.status == "forgotten" and done.forgotten == [first.note_id]
        view = await operator.get_note(user, first.note_id, after=done.token)
        assert view.status == "forgotten" and view.content == ""
        await operator.get_note(user, second.note_id, after=second.token)
    # The CLI's bus commands run as the operator: `forget --yes` deletes at once.
    code, out, err = cli(roles.env("operator"), "forget", "--user", user, "--yes", second.note_id)
    assert code == 0 and out["status"] == "forgotten", (out, err)
    # An admin command is the service role's: refused in one line, no traceback.
    for admin_command in (("health",), ("export", "--out", str(roles.directory / "export.jsonl"))):
        code, out, err = cli(roles.env("operator"), *admin_command)
        assert code == 1 and out["error"]["code"] == "PERMISSION_DENIED" and "Traceback" not in err, (out, err)

    async with EngramClient(roles.url("agent"), timeout=30) as agent:
        kept = await agent.save(user, "Parking level 3, row F", advise=False)
        await agent.get_note(user, kept.note_id, after=kept.token)
    stored = await _stored(roles, user, kept.note_id)
    r = aioredis.Redis.from_url(roles.url("operator"))
    try:
        await _refused(*_reads_of_stored_data(r, stored), *_writes(r, stored))
    finally:
        await r.aclose()


async def test_a_subscriber_reads_the_log_with_its_group_and_writes_nothing(roles: Roles) -> None:
    # A note in each partition, so the subscriber must read every partition's log.
    users: dict[int, str] = {}
    while len(users) < PARTITIONS:
        user = _user()
        users.setdefault(channels.partition_of(user, PARTITIONS), user)
    saved = {}
    async with EngramClient(roles.url("agent"), timeout=30) as agent:
        for p, user in users.items():
            saved[p] = await agent.save(user, f"note in partition {p}", advise=False)
        await agent.get_note(users[0], saved[0].note_id, after=saved[0].token)
    stored = await _stored(roles, users[0], saved[0].note_id)

    r = aioredis.Redis.from_url(roles.url("subscriber"))
    group = f"audit-{uuid.uuid4().hex[:6]}"
    try:
        partitions = int(await r.get(channels.PARTITIONS_KEY))
        for p in range(partitions):
            log = channels.event_log(p)
            await r.xgroup_create(log, group, "0")
            assert group in {g["name"].decode() for g in await r.xinfo_groups(log)}
            read = await r.xreadgroup(group, "worker-1", {log: ">"}, count=10_000)
            entries = read[0][1]
            events = [json.loads(fields[b"e"]) for _, fields in entries]
            assert saved[p].note_id in {e.get("note_id") for e in events}
            # Crash-recovery of its own group: a second consumer claims what the first left.
            claimed = await r.xautoclaim(log, group, "worker-2", min_idle_time=0, start_id="0-0", count=10_000)
            assert len(claimed[1]) == len(entries)
            await r.xack(log, group, *[entry_id for entry_id, _ in entries])
            assert (await r.xpending(log, group))["pending"] == 0
        # `engram relay` dead-letters what it could not post; XADD is granted there alone.
        assert await r.xadd(f"engram:relay:{group}:dead", {"body": "{}", "error": "HTTP 500"})
        await _refused(
            *(c for c in _reads_of_stored_data(r, stored) if "log" not in c[0]),
            *_writes(r, stored),
            ("XGROUP DESTROY", lambda: r.xgroup_destroy(stored.log, group)),
            ("XGROUP SETID", lambda: r.xgroup_setid(stored.log, group, "0")),
            ("XGROUP DELCONSUMER", lambda: r.xgroup_delconsumer(stored.log, group, "worker-1")),
            ("XADD a request", lambda: r.xadd(channels.command_stream(0), {"x": "1"})),
            ("XADD to the operators' stream", lambda: r.xadd(channels.operator_stream(0), {"x": "1"})),
        )
        await _refused_subscriptions(
            r,
            channels_=[
                channels.reply_channel(uuid.uuid4().hex, acl.DEFAULT_USERS["agent"]),
                channels.applied_channel(0),
            ],
            patterns=["engram:replies:*"],
        )
    finally:
        await r.aclose()
    # `engram tail` is a subscriber's command: one event printed (its line's shape is tail's own
    # business), no refusal.
    code, out, err = cli(roles.env("subscriber"), "tail", "--from-start", "--count", "1")
    assert code == 0 and err == "" and isinstance(out, dict) and "error" not in out, (out, err)
    assert '"note_saved"' in json.dumps(out)


async def test_a_subscriber_follows_the_typed_events_through_the_client(roles: Roles) -> None:
    """`EngramClient.events` under the subscriber role: the client connects (its own reply
    channel), the subscription makes its group on every partition and reads and acks there."""
    users: dict[int, str] = {}
    while len(users) < PARTITIONS:
        user = _user()
        users.setdefault(channels.partition_of(user, PARTITIONS), user)
    async with EngramClient(roles.url("agent"), timeout=30) as agent:
        wanted = {(await agent.save(user, f"event for {user}", advise=False)).note_id for user in users.values()}

    async def follow() -> set[str]:
        seen: set[str] = set()
        group = f"audit-{uuid.uuid4().hex[:6]}"
        async with (
            EngramClient(roles.url("subscriber"), timeout=30) as client,
            client.events(group, from_start=True, users=list(users.values())) as events,
        ):
            async for delivery in events:
                seen.add(delivery.event.note_id)
                await delivery.ack()
                if wanted <= seen:
                    break
        return seen

    assert wanted <= await asyncio.wait_for(follow(), 30)


async def test_the_service_role_scrubs_after_a_forget_and_reaches_nothing_outside_engram(roles: Roles) -> None:
    admin = aioredis.Redis.from_url(roles.admin_url)
    await admin.set("another-app:secret", "not Engram's")
    rewrites = int((await admin.info("persistence"))["aof_rewrites"])
    user = _user()
    async with EngramClient(roles.url("operator"), timeout=30, operator=True) as operator:
        saved = await operator.save(user, "Grandma's recipe uses cardamom", advise=False)
        await operator.forget(user, note_ids=[saved.note_id], confirmed=True)

    async def scrubbed() -> bool:
        return (
            not await admin.exists(channels.SCRUB_OWED_KEY)
            and int((await admin.info("persistence"))["aof_rewrites"]) > rewrites
        )

    # The scrub (trim the request streams, CONFIG GET, BGREWRITEAOF) ran as the service's user.
    try:
        await eventually(scrubbed, interval=0.2)
    except AssertionError:
        pytest.fail("the scrub after a forget did not complete:\n" + "".join(roles.serve.lines))
    assert not [line for line in roles.serve.lines if "NOPERM" in line or "incomplete" in line]

    r = aioredis.Redis.from_url(roles.url("service"))
    try:
        await _refused(
            ("GET another app's key", lambda: r.get("another-app:secret")),
            ("SET another app's key", lambda: r.set("another-app:secret", "x")),
            ("DEL another app's key", lambda: r.delete("another-app:secret")),
            ("PUBLISH outside engram:*", lambda: r.publish("another-app:events", "x")),
            ("CONFIG SET", lambda: r.config_set("appendonly", "no")),
            ("FLUSHALL", lambda: r.flushall()),
            ("FLUSHDB", lambda: r.flushdb()),
            ("KEYS", lambda: r.keys("*")),
            ("ACL SETUSER", lambda: r.execute_command("ACL", "SETUSER", "engram-agent", "+@all")),
            ("ACL LIST", lambda: r.execute_command("ACL", "LIST")),
            ("CLIENT LIST", lambda: r.execute_command("CLIENT", "LIST")),
            ("SLOWLOG GET", lambda: r.execute_command("SLOWLOG", "GET")),
            ("BGSAVE", lambda: r.bgsave()),
            ("FUNCTION FLUSH", lambda: r.execute_command("FUNCTION", "FLUSH")),
            ("SCRIPT FLUSH", lambda: r.execute_command("SCRIPT", "FLUSH")),
            ("MODULE LIST", lambda: r.execute_command("MODULE", "LIST")),
            ("REPLICAOF", lambda: r.execute_command("REPLICAOF", "127.0.0.1", "1")),
        )
        await _refused_subscriptions(r, channels_=["another-app:events"], patterns=["*"])
        assert await admin.get("another-app:secret") == b"not Engram's"
    finally:
        await r.aclose()
        await admin.aclose()


async def test_the_roles_with_their_cluster_rules_work_on_a_redis_cluster(tmp_path: Path) -> None:
    """`engram acl --cluster`: the same roles on a three-master Redis Cluster (each node holds the
    users: ACLs are per node), with what redis-py's cluster client asks of a node to route."""
    cluster = LocalCluster(tmp_path).start()
    try:
        for node in cluster.nodes:
            with redis.Redis(port=node.port) as setup:  # the test cluster's default user is on
                for role, user in acl.DEFAULT_USERS.items():
                    setup.execute_command(*acl.setuser(role, user, cluster=True, partitions=6))
                    setup.execute_command("ACL", "SETUSER", user, ">pw")
                setup.execute_command("ACL", "LOG", "RESET")

        def url(role: str) -> str:
            return f"redis://{acl.DEFAULT_USERS[role]}:pw@127.0.0.1:{cluster.nodes[0].port}/0"

        settings = service_settings(url("service"), redis_cluster=True, partitions=6, index_enabled=False)
        service = await RunningService(settings).start()
        try:
            users = [f"c-{i}" for i in range(6)]
            async with EngramClient(url("agent"), cluster=True, timeout=30) as agent:
                saved = {user: await agent.save(user, f"cluster note of {user}", advise=False) for user in users}
                for user, note in saved.items():
                    assert (await agent.get_note(user, note.note_id, after=note.token)).content.endswith(user)
                first = await agent.forget(users[0], note_ids=[saved[users[0]].note_id])
                assert first.status == "confirmation_required"
            async with EngramClient(url("operator"), cluster=True, timeout=30, operator=True) as operator:
                done = await operator.forget(users[1], note_ids=[saved[users[1]].note_id], confirmed=True)
                assert done.status == "forgotten"
            subscriber = RedisCluster.from_url(url("subscriber"))
            agent_redis = RedisCluster.from_url(url("agent"))
            inspect = RedisCluster.from_url(cluster.url)
            try:
                read = 0
                for p in range(int(await subscriber.get(channels.PARTITIONS_KEY))):
                    await subscriber.xgroup_create(channels.event_log(p), "audit", "0", mkstream=True)
                    for _, entries in await subscriber.xreadgroup("audit", "c", {channels.event_log(p): ">"}):
                        read += len(entries)
                assert read >= len(users)
                await _refused(("the agent XRANGEs a log", lambda: agent_redis.xrange(channels.event_log(0))))
                # The scrub the forget owes (CONFIG GET, BGREWRITEAOF on every master) is settled.
                owed = channels.SCRUB_OWED_KEY
                await until_none(lambda: inspect.exists(owed), interval=0.2, what="the scrub the forget owes")
            finally:
                await subscriber.aclose()
                await agent_redis.aclose()
                await inspect.aclose()
        finally:
            await service.stop()
        for node in cluster.nodes:
            with redis.Redis(port=node.port) as check:
                refusals = [(e["username"], e["object"]) for e in check.acl_log() if e["username"] != "engram-agent"]
                assert refusals == [], f"node {node.port} refused the roles what they need: {refusals}"
                # The scrub after the forget rewrote every master's AOF, as the service's user.
                assert int(check.info("persistence")["aof_rewrites"]) >= 1
    finally:
        cluster.stop()
