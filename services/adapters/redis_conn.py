"""Opening Redis: one server, or a Redis Cluster when ``ENGRAM_REDIS_CLUSTER`` is on.

Every key one script or transaction touches carries its partition's ``{p}`` hash tag, so the
same code runs on both: a cluster client routes each call to the node owning the slot. Keys
outside a partition (``engram:partitions``, the index generations) are single-key reads and writes.
"""

from __future__ import annotations

import asyncio
import re
import socket
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from engram_ledger.contracts import channels

# A password may also come as a query argument (``?password=``, ``?ssl_password=``).
_QUERY_SECRET = re.compile(r"(password=)[^&#]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` as a message or a log line may show it: the password becomes ``***`` (the user
    name stays, to tell which ACL user was refused), and so does a user part without a colon,
    which may be a password missing its colon. Scheme, host, port, path and database stay."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    # The last '@' ends the credentials: a password may hold '@', '/' or '?' unencoded (an '@'
    # in the query hides more than needed, which is the safe side).
    at = rest.rfind("@")
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        rest = (f"{user}:***" if colon else "***") + rest[at:]
    return scheme + sep + _QUERY_SECRET.sub(r"\1***", rest)


# How long Redis may leave what was sent unacknowledged (a peer gone without a word: a host
# down, a network cut) before the kernel drops the connection, and how soon an idle one (a
# blocking read) is probed. Redis's own slowness (a fork, an fsync) does not count: its kernel
# acknowledges while the process is busy (as long as its receive buffer has room).
UNACKNOWLEDGED_LIMIT_MS = 10_000
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 5, 2, 3
CONNECT_TIMEOUT_S = 5.0
# A client's connections at most, and how long a command waits for one of them. Made as needed;
# a serving process's gates and projection runners each hold one in a blocking read (about seven
# a partition), so the cap leaves room for many partitions beside the requests.
POOL_CONNECTIONS, POOL_WAIT_S = 1_000, 30.0


def serving_options(url: str, socket_timeout: float | None = None) -> dict[str, Any]:
    """Connection options of a serving process (its own client and its broker's).

    No per-call socket timeout. redis-py 8 sets one by default (5 s, where 7 had none), and it
    costs: every send runs through ``asyncio.wait_for`` (on Python 3.11 a task of its own) and
    every reply read through ``asyncio.timeout``, about 15 us of CPU a call, 12% of a process's
    commands per second (README, Performance). A Redis that is gone is found by TCP instead:
    keepalive probes an idle connection, and ``TCP_USER_TIMEOUT`` ends one whose data goes
    unacknowledged (``tests/faults/test_lost_peer.py`` cuts the network under both). A Redis that
    is alive but slow is waited for: a handler's request stays pending meanwhile and the
    caller's own timeout answers the caller. Connecting keeps its timeout.

    TCP only sees the first hop: a Redis behind something that answers TCP for it (a TLS
    terminator, a proxy, a sidecar) needs ``socket_timeout`` (``ENGRAM_REDIS_SOCKET_TIMEOUT``)."""
    options: dict[str, Any] = {"socket_timeout": socket_timeout, "socket_connect_timeout": CONNECT_TIMEOUT_S}
    if urlsplit(url).scheme.lower() == "unix":
        return options  # no TCP: a local socket's peer does not vanish unannounced
    keepalive = {
        getattr(socket, name): value
        for name, value in (
            # macOS names the idle time TCP_KEEPALIVE.
            ("TCP_KEEPIDLE" if hasattr(socket, "TCP_KEEPIDLE") else "TCP_KEEPALIVE", KEEPALIVE_IDLE_S),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
            ("TCP_KEEPCNT", KEEPALIVE_PROBES),
            ("TCP_USER_TIMEOUT", UNACKNOWLEDGED_LIMIT_MS),
        )
        if hasattr(socket, name)
    }
    if not hasattr(socket, "TCP_USER_TIMEOUT") and socket_timeout is None:
        # Without it, data to a vanished peer is retried for many minutes: keep a timeout.
        options["socket_timeout"] = 5.0
    return options | {"socket_keepalive": True, "socket_keepalive_options": keepalive}


# Errors a live Redis answers a PING with while it cannot serve commands yet (loading its data
# after a restart, a busy script, a replica that lost its master): the connection is fine.
_ALIVE_BUT_NOT_READY = ("LOADING", "BUSY", "MASTERDOWN")


async def subscription_messages(
    pubsub: PubSub, quiet_seconds: float = 5.0, answer_within: float = UNACKNOWLEDGED_LIMIT_MS / 1000
) -> AsyncIterator[dict[str, Any]]:
    """What a subscription receives (subscribe confirmations and pongs among them), until its
    connection is lost: then a ``RedisError``. Use this, not ``PubSub.listen()``.

    redis-py 8.1's ``listen()`` reads with a caller's timeout (``math.inf``) and takes any
    ``asyncio.TimeoutError`` for that timeout running out: it returns nothing and keeps the
    connection. On Python 3.11 the kernel's ETIMEDOUT (a dead peer found by keepalive or
    ``TCP_USER_TIMEOUT``) is that same class, so after one every read fails at once, and
    ``listen()`` loops on it without ever yielding: the event loop freezes
    (``tests/faults/test_lost_peer.py``). Here a read that comes back empty before its time is
    such an error. And a subscription quiet for ``quiet_seconds`` sends a PING: no answer at all
    within ``answer_within`` means a Redis gone silent behind something that still answers TCP
    for it (a proxy), which neither TCP nor a socket timeout would tell (reads here carry their
    own timeout)."""
    loop = asyncio.get_running_loop()
    pinged_at: float | None = None
    while True:
        asked = loop.time()
        try:
            message = await pubsub.get_message(timeout=quiet_seconds)
        except ResponseError as e:
            if not str(e).startswith(_ALIVE_BUT_NOT_READY):
                raise
            message = {"type": "not ready", "data": str(e)}  # an answer all the same
        if message is not None:
            pinged_at = None
            yield message
            continue
        now = loop.time()
        if now - asked < quiet_seconds / 2:
            raise RedisConnectionError("the subscription's connection was lost (an empty read before its time)")
        if pinged_at is None:
            pinged_at = now
            await pubsub.ping()
        elif now - pinged_at > answer_within:
            raise RedisConnectionError(f"no answer to a PING on the subscription's connection in {answer_within:g} s")


def open_redis(url: str, cluster: bool = False, **options: Any) -> Redis:
    """Constructs the client; nothing connects until the first command."""
    if cluster:
        # Any node's URL is a way in: the client discovers the others and follows slot moves.
        client = RedisCluster.from_url(url, **options)
        stream_reads_routed_locally(client)
        return client
    # A caller past the pool's connections waits for one to come back (redis-py's own pool
    # refuses it at once: "Too many connections", past 100 by default).
    return Redis.from_pool(
        BlockingConnectionPool.from_url(url, **{"max_connections": POOL_CONNECTIONS, "timeout": POOL_WAIT_S, **options})
    )


_STREAM_READS = frozenset({"XREAD", "XREADGROUP"})


def stream_reads_routed_locally(client: Any) -> None:
    """redis-py's cluster client finds the keys of a command whose keys move (XREAD and
    XREADGROUP among them) by asking a node, ``COMMAND GETKEYS``: one more round trip before
    every read of a stream, about two per save measured through a 3-master cluster
    (bench/bench_scale.py). Their keys are the first half of what follows STREAMS: read here."""
    if isinstance(client, RedisCluster):
        route_stream_reads(client.commands_parser)


def route_stream_reads(parser: Any) -> None:
    """Wrap a cluster client's ``commands_parser`` (see ``stream_reads_routed_locally``)."""
    asked = parser.get_keys

    async def get_keys(*args: Any) -> Any:
        name = (args[0].decode() if isinstance(args[0], bytes) else str(args[0])).upper() if args else ""
        if name in _STREAM_READS:
            # Values (a binary request, an id) are read as text only to find the keyword.
            pieces = [a.decode(errors="replace") if isinstance(a, bytes) else str(a) for a in args]
            # XREADGROUP GROUP <group> <consumer> [...] STREAMS: a group or a consumer named
            # "streams" is not the keyword.
            start = 4 if name == "XREADGROUP" else 1
            options = [p.upper() for p in pieces[start:]]
            if "STREAMS" in options:
                rest = args[start + options.index("STREAMS") + 1 :]
                return tuple(rest[: len(rest) // 2])
        return await asked(*args)

    parser.get_keys = get_keys


async def servers(redis: Redis) -> list[Callable[..., Awaitable[Any]]]:
    """A way to run a command on each server (each master of a cluster): for what concerns a
    server rather than a key, such as CONFIG GET or BGREWRITEAOF."""
    if isinstance(redis, RedisCluster):
        await redis.initialize()  # discovers the nodes, if no command has yet
        return [partial(redis.execute_command, target_nodes=node) for node in redis.get_primaries()]
    return [redis.execute_command]


_node_clients: weakref.WeakKeyDictionary[RedisCluster, dict[str, Redis]] = weakref.WeakKeyDictionary()


async def transaction_client(redis: Redis, key: str) -> Redis:
    """The client to run a WATCH/MULTI transaction on ``key``'s slot with. redis-py's asyncio
    cluster pipeline runs a transaction's commands on a thread and event loop of their own
    (redis-py 8.1), which breaks under a running loop; so on a cluster the transaction goes
    through a plain client on the node that owns the slot. A slot moved meanwhile fails the
    transaction (MOVED) and the caller's retry finds the new owner."""
    if not isinstance(redis, RedisCluster):
        return redis
    await redis.initialize()
    node = redis.get_node_from_key(key)
    clients = _node_clients.setdefault(redis, {})
    if node.name not in clients:
        # The same connection options (auth, TLS) the cluster client uses for that node.
        pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
        clients[node.name] = Redis(connection_pool=pool)
    return clients[node.name]


_closers: weakref.WeakKeyDictionary[Redis, list[Callable[[], Awaitable[None]]]] = weakref.WeakKeyDictionary()


def close_with(redis: Redis, closer: Callable[[], Awaitable[None]]) -> None:
    """Have ``close_redis`` run ``closer`` first: for what holds a connection of its own from
    ``redis`` (a subscription), which would otherwise outlive the client."""
    _closers.setdefault(redis, []).append(closer)


async def close_redis(redis: Redis) -> None:
    """Closes the client, what ``close_with`` registered on it, and the per-node ones
    ``transaction_client`` opened for it."""
    for closer in _closers.pop(redis, []):
        await closer()
    if isinstance(redis, RedisCluster):
        for client in _node_clients.pop(redis, {}).values():
            await client.aclose()
    await redis.aclose()


async def unlink_prefix(redis: Redis, prefix: str) -> int:
    """Delete every key that starts with ``prefix`` (an old generation of a projection), in
    batches; returns how many were deleted."""
    dropped = 0
    batch: list[bytes] = []
    async for key in redis.scan_iter(match=channels.matching(prefix), count=1000):
        batch.append(key)
        if len(batch) >= 500:
            dropped += await redis.unlink(*batch)
            batch = []
    if batch:
        dropped += await redis.unlink(*batch)
    return dropped


async def group_info(redis: Redis, stream: str, group: str) -> dict[str, Any] | None:
    """XINFO GROUPS' entry for ``group`` on ``stream`` (None if either does not exist)."""
    try:
        groups = await redis.xinfo_groups(stream)
    except ResponseError:
        return None  # no such stream yet
    for info in groups:
        name = info["name"]
        if (name.decode() if isinstance(name, bytes) else name) == group:
            return dict(info)
    return None


async def rewrite_aof(redis: Redis, timeout: float) -> str:
    """Rewrite every server's append-only file and wait for it: what was overwritten or deleted
    is then in no file (the older values stay in the AOF's history until a rewrite). Answers
    what happened, in words: rewritten, no AOF, or why it could not be waited for."""
    said = []
    for server in await servers(redis):
        config = await server("CONFIG GET", "appendonly")
        if config.get("appendonly") not in ("yes", b"yes"):
            said.append("no append-only file")
            continue
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:  # one already running may predate what must go: start one of our own
            try:
                await server("BGREWRITEAOF")
                break
            except ResponseError as e:
                if "already in progress" not in str(e) or loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)
        try:
            while True:
                persistence = await server("INFO", "persistence")
                if not int(persistence["aof_rewrite_in_progress"]) and not int(persistence["aof_rewrite_scheduled"]):
                    break
                if loop.time() > deadline:
                    return f"the append-only file is being rewritten (not done within {timeout:g} s)"
                await asyncio.sleep(0.1)
        except ResponseError as e:  # INFO refused by an ACL: the rewrite runs, unwatched
            return f"the append-only file's rewrite started (its end could not be watched: {e})"
        if persistence.get("aof_last_bgrewrite_status") not in ("ok", b"ok"):
            return f"the append-only file's rewrite failed ({persistence.get('aof_last_bgrewrite_status')})"
        said.append("append-only file rewritten")
    return "; ".join(dict.fromkeys(said))
