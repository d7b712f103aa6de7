"""``EngramClient``: the thin async Python client of the bus. One method per command and query;
returns reply Structs and raises ``EngramError`` for error replies, time-outs and an unreachable bus."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, TypeVar

import msgspec
from redis.exceptions import ClusterDownError, NoPermissionError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import (
    AnyCommand,
)
from engram_ledger.contracts.errors import EngramError, ErrorCode, ErrorReply
from engram_ledger.contracts.queries import (
    AnyQuery,
    AnyReply,
)
from engram_ledger.services.adapters.crypto import MasterKey
from engram_ledger.services.adapters.redis_conn import open_redis, redact_url
from engram_ledger.services.bus.admission import DEFAULT_USER_IN_FLIGHT
from engram_ledger.services.bus.genai import memory_operation
from engram_ledger.services.bus.read_your_writes import ReadYourWrites
from engram_ledger.services.bus.reads import Reads
from engram_ledger.services.bus.requester import BusRequester, client_name_for
from engram_ledger.services.bus.subscription import CLAIM_IDLE_MS, DEFAULT_CONSUMER, Subscription
from engram_ledger.services.bus.writes import Writes, new_command_id

__all__ = ["EngramClient", "ReadYourWrites", "new_command_id"]

R = TypeVar("R")
_reply_decoder = msgspec.json.Decoder(AnyReply)
_encoder = msgspec.json.Encoder()


# Redis down, restarting, or a cluster failing over: the request may be retried as it is.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError, OSError)


class EngramClient(Writes, Reads):
    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        cluster: bool = False,
        operator: bool = False,
        client_name: str | None = None,
        user_in_flight: int = DEFAULT_USER_IN_FLIGHT,
    ) -> None:
        """``user_in_flight``: how many requests of one user this client sends at once; more wait
        their turn. The service bounds each user's requests in flight across every client
        (``ENGRAM_USER_IN_FLIGHT``): while other clients hold them, a request is sent again until
        the timeout, then refused ``RATE_LIMITED`` (0: no bound here).
        ``cluster``: ``url`` names a node of a Redis Cluster (as ENGRAM_REDIS_CLUSTER=on).
        ``operator``: commands go to the operators' stream, where a confirmed forget (deleting
        without the second call) is accepted; an agent's client is never one.
        ``client_name``: replies come on channels ``engram:replies:<client_name>:*``, which a
        Redis ACL grants to this client's user alone (services/ops/acl.py); by default the URL's
        user name when it is a valid name (letters, digits, '.', '_', '-'), else none."""
        self.url = url
        self.operator = operator
        self.timeout = timeout
        self.client_name = client_name_for(url, client_name)
        self._redis = open_redis(url, cluster)
        self._bus = BusRequester(self._redis, client_name=self.client_name, user_in_flight=user_in_flight)
        self.partitions = 1

    async def __aenter__(self) -> EngramClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType] | Any) -> None:
        await self.close()

    async def connect(self) -> None:
        try:
            try:
                stored = await self._redis.get(channels.PARTITIONS_KEY)
            except NoPermissionError as e:
                raise self._refused(f"read {channels.PARTITIONS_KEY}", e) from None
            try:
                await self._bus.start()
            except NoPermissionError as e:
                raise self._refused(
                    f"subscribe to its reply channel {self._bus.reply_channel} (a role's user may subscribe to "
                    f"{channels.client_reply_channels('<its name>')} alone: name the client after its ACL user)",
                    e,
                ) from None
        except EngramError:
            await self.close()
            raise
        except UNREACHABLE as e:
            await self.close()
            raise EngramError(
                ErrorCode.UNAVAILABLE, f"cannot reach the Engram bus at {redact_url(self.url)}: {e}"
            ) from None
        if stored is None:
            await self._bus.stop()  # a later connect starts it afresh
            raise EngramError(
                ErrorCode.UNAVAILABLE, f"no Engram service has ever run on {redact_url(self.url)}; start `engram serve`"
            )
        self.partitions = int(stored)

    @property
    def connected(self) -> bool:
        """Whether ``connect`` has succeeded (and ``close`` not been called since)."""
        return self._bus.running

    async def close(self) -> None:
        await self._bus.stop()
        await self._redis.aclose()

    def events(
        self,
        group: str,
        *,
        from_start: bool = False,
        users: Sequence[str] | None = None,
        kinds: Sequence[str | type] | None = None,
        key: MasterKey | None = None,
        consumer: str = DEFAULT_CONSUMER,
        partitions: Sequence[int] | None = None,
        claim_idle_ms: int = CLAIM_IDLE_MS,
    ) -> Subscription:
        """The memory events, typed, through consumer group ``group`` (created on first use, at
        the log's start with ``from_start``): ``async with client.events(...) as events: async for
        delivery in events: ...; await delivery.ack()``. Content only with ``key`` (the master
        key). See ``services/bus/subscription.py``."""
        return Subscription(
            self._redis,
            group,
            from_start=from_start,
            users=users,
            kinds=kinds,
            key=key,
            consumer=consumer,
            partitions=partitions,
            partition_count=self.partitions if self.connected else None,
            claim_idle_ms=claim_idle_ms,
            url=self.url,
        )

    # Plumbing -------------------------------------------------------------------------------

    # Each memory operation is a span and a measurement, as OpenTelemetry's GenAI conventions
    # name them (services/bus/genai.py).
    @memory_operation
    async def execute(self, command: AnyCommand, expect: type[R]) -> R:
        """Send a command. A ``TIMEOUT`` or ``UNAVAILABLE`` error carries its ``command_id``:
        the command may have been applied, and sent again under that id it is applied once."""
        partition = channels.partition_of(command.user_id, self.partitions)
        stream = channels.operator_stream(partition) if self.operator else channels.command_stream(partition)
        try:
            # An operator's commands take no place of the user's: erasing a user who holds all
            # of its places must not wait for them.
            user = None if self.operator else command.user_id
            raw = await self.request_raw(stream, _encoder.encode(command), user=user)
        except EngramError as e:
            if e.code is ErrorCode.TIMEOUT:
                raise EngramError(
                    e.code,
                    f"no reply within {self.timeout:g} s; the command may still be applied: send it again with "
                    f"command_id {command.command_id} (it is applied once, whatever happened)",
                    command_id=command.command_id,
                ) from None
            if e.code is ErrorCode.UNAVAILABLE:
                raise EngramError(e.code, e.message, command_id=command.command_id) from None
            raise
        return _expect(raw, expect)

    @memory_operation
    async def ask(self, query: AnyQuery, expect: type[R]) -> R:
        partition = channels.partition_of(query.user_id, self.partitions)
        stream = channels.query_stream(partition)
        return _expect(await self.request_raw(stream, _encoder.encode(query), user=query.user_id), expect)

    async def request_raw(self, stream: str, body: bytes, user: str | None = None) -> bytes:
        """Send any bytes to a request stream (through its inbox) and return the raw reply
        (tests send bad input here). ``user``: the user the request is of, whose turn it takes."""
        try:
            return await self._bus.request(stream, body, self.timeout, user)
        except TimeoutError:
            raise EngramError(
                ErrorCode.TIMEOUT,
                f"no reply within {self.timeout:g} s; nothing was changed (is `engram serve` running?)",
            ) from None
        except UNREACHABLE as e:
            raise EngramError(
                ErrorCode.UNAVAILABLE, f"cannot reach the Engram bus at {redact_url(self.url)}: {e}"
            ) from None
        except NoPermissionError as e:
            raise self._refused(f"send to {channels.inbox(stream)}", e) from None

    def _refused(self, what: str, e: NoPermissionError) -> EngramError:
        return EngramError(
            ErrorCode.PERMISSION_DENIED,
            f"the Redis user of {redact_url(self.url)} may not {what}: {e}. See `engram acl` for what each role may do",
        )


def _expect(raw: bytes, expect: type[R]) -> R:
    reply = _reply_decoder.decode(raw)
    if isinstance(reply, ErrorReply):
        raise EngramError.from_reply(reply)
    if not isinstance(reply, expect):
        raise EngramError(ErrorCode.STORAGE_ERROR, f"unexpected reply {type(reply).__name__}")
    return reply
