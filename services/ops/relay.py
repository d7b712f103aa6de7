"""``engram relay``: memory events as signed webhooks.

The relay is a subscriber like any other (``services/bus/subscription.py``: a consumer group of
its own on every partition's log). It posts each event as JSON to one URL and acknowledges the
entry only after a 2xx, so a relay that dies comes back to what it had not delivered. A post
has a deadline as a whole (``post_seconds``: connecting, sending, reading the answer), past
which it has failed. A delivery that keeps failing is retried with exponential backoff and
jitter for up to ``give_up_after`` (an hour), then recorded in a dead-letter stream
(``engram:relay:<group>:dead``: where it is in the log and why it failed, never its content) and
acknowledged, so one poisoned event does not hold its lane forever; an erasure is retried until
it is delivered. Events of one note are posted in log order: deliveries go to lanes by note, one
post at a time per lane, several lanes at once.

Each post is signed as Stripe and GitHub sign theirs, so a receiver can tell it comes from this
relay and is not a replay:

    Engram-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>

``verify`` checks one (the signature, and that ``t`` is within the replay window). A receiver
drops a copy it has already taken by the body's ``id`` (signed; ``Engram-Event-Id`` says the same
but is not): a retry after a lost 2xx or a redelivery after a crash is the only way a duplicate
arrives, and a replayed capture is one too.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import math
import random
import secrets
import time
import zlib
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx
import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.asyncio import Redis

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import AnyEvent
from engram_ledger.services.adapters.private_files import write_private
from engram_ledger.services.adapters.redis_conn import group_info
from engram_ledger.services.bus.deliveries import ERASURES
from engram_ledger.services.common.periodic import every

log = logging.getLogger("engram.relay")

SIGNATURE_HEADER = "Engram-Signature"
EVENT_ID_HEADER = "Engram-Event-Id"
EVENT_TYPE_HEADER = "Engram-Event-Type"
ATTEMPT_HEADER = "Engram-Delivery-Attempt"
# "true" when the relay's group had handed this entry out before (a relay restarted after a crash
# posts again what it had not acknowledged): a receiver may have it already.
REDELIVERED_HEADER = "Engram-Redelivered"
# How old a signed timestamp a receiver should accept (seconds), against replays.
REPLAY_WINDOW_SECONDS = 300
# Dead letters kept per relay group; the oldest go first.
DEAD_LETTERS_KEPT = 10_000
# At most one line about failed posts this often (each post is counted in the metrics).
FAILURE_LOG_SECONDS = 10.0
# What the relay reads of a receiver's answer: only its status matters, and a receiver that
# answers with a huge body must not grow the relay (the rest is left unread and the connection
# closed).
RESPONSE_READ_BYTES = 64 * 1024
# How long one post may take in all (connecting, sending, reading the answer): httpx's timeout
# bounds each read alone, so a receiver that trickles a byte at a time would hold its lane.
POST_SECONDS = 30.0


class Delivery(Protocol):
    """What the relay needs of a subscription's delivery."""

    partition: int
    position: str
    event: AnyEvent
    redelivered: bool

    async def ack(self) -> None: ...


class Payload(msgspec.Struct, frozen=True, kw_only=True):
    """The JSON body of a webhook post."""

    id: str  # the event id: the same on every retry and redelivery
    type: str
    partition: int
    position: str
    event: AnyEvent


def payload_of(delivery: Delivery) -> bytes:
    event = delivery.event
    return msgspec.json.encode(
        Payload(
            id=event.event_id,
            type=str(event.__struct_config__.tag),
            partition=delivery.partition,
            position=delivery.position,
            event=event,
        )
    )


def signing_key(secret: bytes | str) -> bytes:
    """The key a secret signs with: its text without the white space around it. So the secret
    file can be given to a receiver as it is, a trailing newline or none, on both sides."""
    return (secret.encode() if isinstance(secret, str) else secret).strip()


def sign(secret: bytes | str, body: bytes, timestamp: int) -> str:
    digest = hmac.new(signing_key(secret), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(
    secret: bytes | str, body: bytes, header: str, *, now: float | None = None, window: int = REPLAY_WINDOW_SECONDS
) -> bool:
    """A receiver's check: the header signs this body with this secret, and its time is within
    ``window`` seconds of now. ``secret``: the secret file's bytes or text as they are (white
    space around it is not part of it)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((now if now is not None else time.time()) - timestamp) > window:
        return False
    presented = f"t={timestamp},v1={parts.get('v1', '')}".encode("utf-8", "replace")
    return hmac.compare_digest(sign(secret, body, timestamp).encode(), presented)


@dataclass(frozen=True)
class RetryPolicy:
    """How long one event is retried. Bounded by time, not by a count of attempts: a receiver
    being redeployed refuses connections at once, and a count would be spent in seconds."""

    give_up_after: float = 3600.0  # seconds from the first attempt; erasures are never given up
    first_delay: float = 0.2
    max_delay: float = 60.0

    def delay(self, attempt: int) -> float:
        """Before attempt ``attempt + 1``: exponential, with full jitter so that many failed
        posts do not come back at the same instant."""
        return random.uniform(0, min(self.max_delay, self.first_delay * 2 ** min(attempt - 1, 30)))


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.delivered = Counter("engram_relay_delivered", "events posted and answered 2xx", registry=registry)
        self.failures = Counter(
            "engram_relay_failed_attempts", "posts that failed (non-2xx, or no answer)", ["reason"], registry=registry
        )
        self.dead_lettered = Counter(
            "engram_relay_dead_lettered",
            "events moved to the dead letters after every attempt failed",
            registry=registry,
        )
        self.lag = Gauge(
            "engram_relay_lag_entries",
            "log entries the relay's group has not yet delivered",
            ["partition"],
            registry=registry,
        )
        self.pending = Gauge(
            "engram_relay_pending_entries", "entries read but not yet acknowledged", ["partition"], registry=registry
        )


class WebhookRelay:
    def __init__(
        self,
        url: str,
        secret: bytes,
        group: str,
        redis: Redis,
        http: httpx.AsyncClient,
        *,
        retry: RetryPolicy = RetryPolicy(),
        lanes: int = 8,
        metrics: RelayMetrics | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        post_seconds: float = POST_SECONDS,
    ) -> None:
        """``post_seconds``: the deadline of one post, connection to answer; past it the post
        has failed, and is retried as any other failure is."""
        self._url = url
        self._post_seconds = post_seconds
        self._secret = secret
        self._group = group
        self._redis = redis
        self._http = http
        self._retry = retry
        self._lanes = lanes
        self._metrics = metrics
        self._logged_at = -math.inf
        self._unlogged = 0
        self._sleep = sleep

    async def run(self, deliveries: AsyncIterable[Delivery]) -> None:
        """Relay until ``deliveries`` ends (or the task is cancelled)."""
        queues: list[asyncio.Queue[Delivery | None]] = [asyncio.Queue(maxsize=256) for _ in range(self._lanes)]
        workers = [asyncio.create_task(self._lane(q), name=f"relay-lane-{i}") for i, q in enumerate(queues)]
        try:
            async for delivery in deliveries:
                lane = zlib.crc32(f"{delivery.event.user_id}/{delivery.event.note_id}".encode()) % self._lanes
                await self._put(queues[lane], delivery, workers)
            for q in queues:
                await self._put(q, None, workers)
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            for worker in workers:
                with contextlib.suppress(asyncio.CancelledError):
                    await worker

    @staticmethod
    async def _put(
        queue: asyncio.Queue[Delivery | None], item: Delivery | None, workers: list[asyncio.Task[None]]
    ) -> None:
        """Queue ``item`` for its lane, or raise what ended a lane: a lane that died (its ack or
        dead letter failed on Redis) would otherwise leave a full queue and the relay waiting
        on it forever. What it held was not acked, and comes back to the next run."""
        putting = asyncio.ensure_future(queue.put(item))
        await asyncio.wait({putting, *workers}, return_when=asyncio.FIRST_COMPLETED)
        for worker in workers:
            if worker.done():
                putting.cancel()
                worker.result()
                raise RuntimeError("a relay lane ended before the subscription did")
        await putting

    async def _lane(self, queue: asyncio.Queue[Delivery | None]) -> None:
        while (delivery := await queue.get()) is not None:
            await self.deliver(delivery)

    async def deliver(self, delivery: Delivery) -> None:
        """Post until a 2xx, then ack. An event still refused ``give_up_after`` seconds after its
        first post goes to the dead letters and is acked, so that it stops holding its lane;
        an erasure never does (a copy that missed it would keep what the user had erased)."""
        body = payload_of(delivery)
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            error = await self._post(delivery, body, attempt)
            if not error:
                if self._metrics is not None:
                    self._metrics.delivered.inc()
                await delivery.ack()
                return
            erasure = delivery.event.__struct_config__.tag in ERASURES
            if not erasure and time.monotonic() - started >= self._retry.give_up_after:
                break
            await self._sleep(self._retry.delay(attempt))
        log.warning(
            "event %s refused for %.0f s (%d attempts; last: %s): moved to %s",
            delivery.event.event_id,
            time.monotonic() - started,
            attempt,
            error,
            channels.relay_dead_letters(self._group),
        )
        # Where the event is and why it failed, never its body: with --content the body holds
        # a note's text, which a later forget could not reach here. The log has the event.
        await self._redis.xadd(
            channels.relay_dead_letters(self._group),
            {
                "id": delivery.event.event_id,
                "type": str(delivery.event.__struct_config__.tag),
                "partition": delivery.partition,
                "position": delivery.position,
                "error": error,
                "attempts": attempt,
            },
            maxlen=DEAD_LETTERS_KEPT,
            approximate=True,
        )
        if self._metrics is not None:
            self._metrics.dead_lettered.inc()
        await delivery.ack()

    async def _post(self, delivery: Delivery, body: bytes, attempt: int) -> str:
        """The failure ("" for a 2xx)."""
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(self._secret, body, int(time.time())),
            EVENT_ID_HEADER: delivery.event.event_id,
            EVENT_TYPE_HEADER: str(delivery.event.__struct_config__.tag),
            ATTEMPT_HEADER: str(attempt),
            REDELIVERED_HEADER: "true" if delivery.redelivered else "false",
        }
        try:
            async with asyncio.timeout(self._post_seconds):
                status = await self._exchange(body, headers)
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self._count_failure("no answer", error, delivery)
            return error
        except TimeoutError:
            # Cut short mid-exchange: httpcore closes that connection, so no later post reuses it.
            error = f"no whole answer within {self._post_seconds:g} s"
            self._count_failure("deadline", error, delivery)
            return error
        if 200 <= status < 300:
            return ""
        error = f"HTTP {status}"
        self._count_failure(str(status), error, delivery)
        return error

    async def _exchange(self, body: bytes, headers: dict[str, str]) -> int:
        """One post and its answer's status."""
        async with self._http.stream("POST", self._url, content=body, headers=headers) as answer:
            # A small body is read whole, so the connection can serve the next post.
            with contextlib.suppress(httpx.HTTPError, httpx.StreamError):
                read = 0
                async for chunk in answer.aiter_raw():
                    read += len(chunk)
                    if read >= RESPONSE_READ_BYTES:
                        break
            return answer.status_code

    def _count_failure(self, reason: str, detail: str, delivery: Delivery) -> None:
        if self._metrics is not None:
            self._metrics.failures.labels(reason=reason).inc()
        # One line per FAILURE_LOG_SECONDS at most, with how many went unsaid: a receiver that is
        # down must be seen in the log without filling it.
        now = time.monotonic()
        self._unlogged += 1
        if now - self._logged_at >= FAILURE_LOG_SECONDS:
            more = f" ({self._unlogged - 1} more failed posts since the last line)" if self._unlogged > 1 else ""
            log.warning(
                "post of event %s (%s) to %s failed: %s%s",
                delivery.event.event_id,
                delivery.event.__struct_config__.tag,
                redact_webhook(self._url),
                detail,
                more,
            )
            self._logged_at, self._unlogged = now, 0


async def watch_lag(
    redis: Redis, group: str, partitions: list[int], metrics: RelayMetrics, stop: asyncio.Event
) -> None:
    """The lag and pending gauges, from XINFO GROUPS every few seconds."""

    async def measure() -> None:
        for p in partitions:
            info = await group_info(redis, channels.event_log(p), group)
            if info is not None:
                metrics.lag.labels(partition=str(p)).set(info.get("lag") or 0)
                metrics.pending.labels(partition=str(p)).set(info.get("pending") or 0)

    await every(5, stop, measure, "measuring the relay's lag", log)


def redact_webhook(url: str) -> str:
    """A webhook URL as a log line may show it: its query and credentials often hold a secret."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


# A relay's own deliveries are claimed back only after this long: a post retried with backoff
# (or queued behind one in its lane) must not be handed out a second time meanwhile. A relay that
# restarts takes its own pending entries back at once, whatever this is.
RELAY_CLAIM_IDLE_MS = 2 * 3600 * 1000  # beyond a retry's give_up_after (an hour by default)


@dataclass(frozen=True)
class RelayOptions:
    url: str
    group: str
    secret: bytes
    kinds: list[str] | None = None
    users: list[str] | None = None
    from_start: bool = False
    key: Any = None  # the master key, to post the content of notes not forgotten
    metrics_port: int | None = None
    lanes: int = 8
    retry: RetryPolicy = RetryPolicy()
    timeout: float = 10.0  # each step of a post: connecting, sending, each read of the answer
    post_seconds: float = POST_SECONDS  # a whole post


async def run_relay(redis_url: str, cluster: bool, options: RelayOptions, stop: asyncio.Event) -> None:
    """Relay until ``stop`` is set. What was read and not yet delivered is left unacknowledged
    and comes back to the next run."""
    from prometheus_client import start_http_server

    from engram_ledger.services.adapters.redis_conn import close_redis, open_redis
    from engram_ledger.services.bus.subscription import Subscription

    redis = open_redis(redis_url, cluster)
    registry = CollectorRegistry()
    metrics = RelayMetrics(registry)
    metrics_server = None
    if options.metrics_port is not None:
        metrics_server, _ = start_http_server(options.metrics_port, "127.0.0.1", registry=registry)
    subscription = Subscription.connect(
        redis_url,
        options.group,
        cluster=cluster,
        from_start=options.from_start,
        users=options.users,
        kinds=options.kinds,
        key=options.key,
        claim_idle_ms=RELAY_CLAIM_IDLE_MS,
    )
    watcher: asyncio.Task[None] | None = None
    try:
        async with httpx.AsyncClient(timeout=options.timeout) as http, subscription:
            watcher = asyncio.create_task(watch_lag(redis, options.group, subscription.partitions, metrics, stop))
            relay = WebhookRelay(
                options.url,
                options.secret,
                options.group,
                redis,
                http,
                retry=options.retry,
                lanes=options.lanes,
                metrics=metrics,
                post_seconds=options.post_seconds,
            )
            log.info("relaying the log to %s as group %s", redact_webhook(options.url), options.group)
            relaying = asyncio.create_task(relay.run(subscription))
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({relaying, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if relaying.done():
                relaying.result()
            relaying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await relaying
    finally:
        stop.set()
        if watcher is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if metrics_server is not None:
            metrics_server.shutdown()
        await close_redis(redis)


def relay_secret(data_dir: Path, secret_file: str | None) -> tuple[bytes, Path]:
    """The signing secret and the file it is in: ``secret_file``, or DATA_DIR/relay.secret,
    generated once beside the master key for the receiver to be given as it is (no newline: a
    receiver that signs with the file's bytes agrees too)."""
    path = Path(secret_file) if secret_file else data_dir / "relay.secret"
    if not secret_file:
        data_dir.mkdir(parents=True, exist_ok=True)
        write_private(path, secrets.token_urlsafe(32), replace=False)
    try:
        secret = signing_key(path.read_bytes())
    except OSError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"--secret-file {path}: {e.strerror}") from None
    if len(secret) < 16:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"the secret in {path} is shorter than 16 characters")
    return secret, path
