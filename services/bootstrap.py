"""The composition root: builds every part from ``Settings`` and runs them. Nothing connects at
import time; ``build()`` only constructs, ``Engram.run()`` connects.

Subscriptions of the service, all here:

- command handler: stream ``engram:{p}:commands``, group ``engram-commands``, REJECT_ON_ERROR (ack
  and delete after the reply, ``services/bus/handled.py``: a body holds what the caller said; an
  infrastructure failure leaves the entry pending for the reclaimer).
- query responder: stream ``engram:{p}:queries``, group ``engram-queries``, REJECT_ON_ERROR, the
  same.
- history projection: ``engram:{p}:log``, no group: a catch-up subscription from its own
  checkpoint, stored with its state.
- index projection: ``engram:{p}:log``, catch-up subscription like the history one; the
  timeline projection (every version, for searches of the past) beside it, with its own
  checkpoint and lease, in the same role.
- forget saga: ``engram:{p}:log``, catch-up subscription (pending deletions and deadlines), and
  its timer sending ``ExpireForget`` when a deadline passes.
- reclaimers: both request streams; re-queue after ``claim_idle_ms``, dead-letter after
  ``max_deliveries``.

``engram serve --role`` picks which of these one process runs (commands, queries, history, index,
saga; default all). Processes share the request groups (each its own consumer name), projections
take turns through a lease, and a dead worker's pending requests are re-queued by any live
reclaimer, so several processes scale out and fail over without coordination.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from fast_depends.msgspec import MsgSpecSerializer
from faststream import AckPolicy
from faststream.message import StreamMessage
from faststream.redis import RedisBroker, RedisClusterBroker, StreamSub
from faststream.redis.opentelemetry import RedisTelemetryMiddleware
from faststream.redis.prometheus import RedisPrometheusMiddleware
from prometheus_client import CollectorRegistry, start_http_server
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from engram_ledger.contracts import channels
from engram_ledger.projections.access import AccessLog
from engram_ledger.projections.forget_saga import SagaPendingDeletions, live_saga
from engram_ledger.projections.history import live_history
from engram_ledger.projections.history_reader import HistoryReader
from engram_ledger.projections.index import IndexProjection, PointsProjection
from engram_ledger.projections.index_runtime import IndexRuntime, live_projection
from engram_ledger.projections.runner import ProjectionRunner, projection_runner
from engram_ledger.projections.timeline import TimelineProjection
from engram_ledger.services.adapters.crypto import MasterKey, MasterKeyError, SubjectMatcher, load_master_key
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.adapters.keyring import KeyringWatcher, attach_keyring
from engram_ledger.services.adapters.layout import OldLayout, check_layout
from engram_ledger.services.adapters.minilm import count_tokens_many
from engram_ledger.services.adapters.redis_conn import (
    close_redis,
    open_redis,
    redact_url,
    serving_options,
    stream_reads_routed_locally,
)
from engram_ledger.services.adapters.scrub import Scrubber
from engram_ledger.services.application.advice import SaveAdvisor
from engram_ledger.services.application.commands import CommandService, command_handlers, utc_now
from engram_ledger.services.application.context import ContextService
from engram_ledger.services.application.fair_share import FairShare
from engram_ledger.services.application.forget import ForgetService
from engram_ledger.services.application.forget_timer import ForgetExpiryTimer
from engram_ledger.services.application.queries import QueryService, query_handlers
from engram_ledger.services.application.recalls import RecallAudit, audited_users
from engram_ledger.services.application.search import BlendPolicy, SearchService
from engram_ledger.services.application.when import warm_time_phrases
from engram_ledger.services.bus.deadline import CallerDeadline
from engram_ledger.services.bus.envelope import EnvelopeFormat, ReplyInKind
from engram_ledger.services.bus.gate import Lane, RequestGate
from engram_ledger.services.bus.handled import DeleteHandled
from engram_ledger.services.bus.reclaimer import PendingReclaimer
from engram_ledger.services.config import Settings
from engram_ledger.services.observability.health import WorkerReport
from engram_ledger.services.observability.metrics import EngramGauges

log = logging.getLogger("engram")

# The request streams, by the role that consumes them, with their consumer group. Operators'
# commands (``channels.operator_stream``) are served by the commands role.
REQUEST_STREAMS = (
    ("commands", channels.command_stream, channels.COMMAND_GROUP),
    ("commands", channels.operator_stream, channels.COMMAND_GROUP),
    ("queries", channels.query_stream, channels.QUERY_GROUP),
)


class ConfigurationError(RuntimeError):
    """The configuration contradicts the data already in Redis; the service does not start."""


# How long a stopping worker waits for its goodbyes to Redis (its leases released, then its
# readiness report withdrawn), each.
GOODBYE_SECONDS = 5.0


def make_broker(
    url: str,
    registry: CollectorRegistry | None = None,
    tracing: bool = False,
    cluster: bool = False,
    socket_timeout: float | None = None,
) -> RedisBroker:
    # logger=None: FastStream's per-message INFO lines cost more than the handler itself.
    # First, so it leaves last: a request is deleted once the others are done with it.
    middlewares: list[Any] = [DeleteHandled]
    if registry is not None:
        middlewares.append(RedisPrometheusMiddleware(registry=registry, app_name="engram"))
    if tracing:
        # Spans go to the process's tracer provider (set up by the deployment: OTEL_* variables,
        # opentelemetry-instrument, or code); trace context arrives in the request's headers.
        middlewares.append(RedisTelemetryMiddleware())
    # How long the caller waits, for the handler (services/bus/deadline.py).
    middlewares.append(CallerDeadline)
    # Last, nearest the handler: it answers a malformed envelope itself, and every reply in the
    # request's own format (services/bus/envelope.py).
    middlewares.append(ReplyInKind)
    kind = RedisClusterBroker if cluster else RedisBroker
    # apply_types=False and raw_body: every handler takes the body as sent and decodes it itself,
    # once, with msgspec. FastStream's default would json-decode it first (for nothing), and
    # dependency injection resolves a `msg: RedisStreamMessage` parameter through a worker
    # thread, one hop per request.
    return kind(
        url,
        serializer=MsgSpecSerializer(),
        logger=None,  # type: ignore[arg-type]
        middlewares=middlewares,
        apply_types=False,
        decoder=raw_body,
        # No per-call socket timeout (see serving_options). FastStream's cluster broker drops
        # options that are None, so through a cluster its client keeps redis-py's 5 s.
        **serving_options(url, socket_timeout),
    )


async def raw_body(msg: StreamMessage[Any]) -> bytes:
    """The decoder of every subscriber: the body as it came (async: FastStream would run a plain
    function in a worker thread)."""
    return bytes(msg.body)


@dataclass
class Engram:
    settings: Settings
    redis: Redis
    broker: RedisBroker
    store: RedisEventStore
    commands: CommandService
    queries: QueryService
    history: HistoryReader
    runners: list[ProjectionRunner]
    reclaimers: list[PendingReclaimer]
    gates: list[RequestGate]
    index: IndexRuntime | None
    forget_timer: ForgetExpiryTimer | None
    # Settles the scrub owed after forgets (services/application/forget.py); runs where commands are handled.
    scrubber: Scrubber | None
    registry: CollectorRegistry | None = None
    gauges: EngramGauges | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # The master key's generations: followed in Redis while running (services/adapters/keyring.py).
    master: MasterKey | None = None

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Run every worker until ``stopping`` is set."""
        tasks: list[asyncio.Task[None]] = []
        metrics: list[Any] = []  # the metrics server, once started
        report = WorkerReport(self.redis, self.settings.consumer_name, self.settings.roles, self.index, self.master)
        try:
            await self._check_partitions()
            await self._ensure_groups()
            if self.master is not None:
                try:
                    await attach_keyring(self.redis, self.master)
                except MasterKeyError as e:
                    raise ConfigurationError(str(e)) from None
                watcher = KeyringWatcher(self.redis, self.master, report.publish)
                tasks.append(asyncio.create_task(watcher.run(self.stopping), name="key-generations"))
            # `engram health` reads this worker's readiness (model, index) from Redis: published
            # before the first request is taken, again whenever the model is loaded.
            await report.publish()
            # Before any worker that may load the model (the index projection embeds its backlog
            # at once): FastStream gives each subscriber 3 s to start its consumer task
            # (anyio.fail_after), torch's import holds the GIL for seconds at a time, and on a busy
            # machine the subscribers missed that window and the service stopped.
            # FastStream's own cluster client reads the request streams: its reads routed as ours.
            stream_reads_routed_locally(await self.broker.connect())
            await self.broker.start()
            tasks += self._start_workers(report, metrics)
            if self.index is None:
                self._log_serving()
            else:
                # Ready means ready: "serving" once searches can be answered. Meanwhile requests
                # are taken, and a search waits for the model within its caller's wait.
                log.info(
                    "engram starting on %s: loading the embedding model (searches wait for it)",
                    redact_url(self.settings.redis_url),
                )
            if ready is not None:
                ready.set()
            await self.stopping.wait()
        finally:
            await self._goodbye(tasks, report, metrics)

    def _start_workers(self, report: WorkerReport, metrics: list[Any]) -> list[asyncio.Task[None]]:
        """Every worker of this process's roles, each a task until ``stopping``."""
        stop = self.stopping
        tasks = [asyncio.create_task(r.run(stop), name=f"{r.name}-{r.partition}") for r in self.runners]
        tasks += [asyncio.create_task(r.run(stop), name=f"reclaim-{r.stream}") for r in self.reclaimers]
        tasks += [asyncio.create_task(g.run(stop), name=f"gate-{g.lane.inbox}") for g in self.gates]
        if self.scrubber is not None:
            tasks.append(asyncio.create_task(self.scrubber.run(stop), name="scrub-after-forget"))
        if self.forget_timer is not None:
            tasks.append(asyncio.create_task(self.forget_timer.run(stop), name="forget-expiry"))
        if self.registry is not None and self.gauges is not None:
            server, _ = start_http_server(
                self.settings.metrics_port, self.settings.metrics_host, registry=self.registry
            )
            metrics.append(server)
            tasks.append(asyncio.create_task(self.gauges.run(stop), name="metrics"))
        tasks.append(asyncio.create_task(report.run(stop), name="readiness-report"))
        if self.index is not None:
            # The model loads in the background (6-9 s, more from a cold disk); commands and
            # reads are served meanwhile, and the first embedding waits for it.
            tasks.append(asyncio.create_task(self._load_model(self.index, report), name="load-model"))
            tasks.append(asyncio.create_task(self.index.watch(stop), name="index-generations"))
            if "index" in self.settings.roles:
                purge = self.index.purge(stop, on_change=report.publish)
                tasks.append(asyncio.create_task(purge, name="index-purge"))
        return tasks

    async def _goodbye(self, tasks: list[asyncio.Task[None]], report: WorkerReport, metrics: list[Any]) -> None:
        self.stopping.set()
        await self.broker.stop()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        # Best effort, and bounded: the serving connections have no per-call timeout, and a
        # stalled Redis may be why this worker stops.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(GOODBYE_SECONDS):
                await asyncio.gather(*(runner.release() for runner in self.runners), return_exceptions=True)
        if self.index is not None:
            await self.index.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(GOODBYE_SECONDS):
                await report.withdraw()
        for server in metrics:
            server.shutdown()
            server.server_close()
        await close_redis(self.redis)
        log.info("engram stopped")

    async def _load_model(self, index: IndexRuntime, report: WorkerReport) -> None:
        await index.load_model(self.stopping)
        await report.publish()
        if index.model_state == "loaded":
            self._log_serving(f", the embedding model loaded in {index.model_load_seconds:g} s")
            # The reader of time phrases loads its language data on first use (half a second):
            # loaded now, off the loop, rather than by the first search that names a time.
            await asyncio.to_thread(warm_time_phrases)

    def _log_serving(self, model: str = "") -> None:
        log.info(
            "engram serving on %s: %d partition(s), consumer %s, roles %s%s",
            redact_url(self.settings.redis_url),
            self.settings.partitions,
            self.settings.consumer_name,
            ",".join(sorted(self.settings.roles)),
            model,
        )

    async def _ensure_groups(self) -> None:
        """Create the request groups at position 0 ourselves: FastStream creates a new group at
        ``$``, which would silently skip requests published before the first worker started."""
        for p in range(self.settings.partitions):
            for _, stream, group in REQUEST_STREAMS:
                try:
                    await self.redis.xgroup_create(stream(p), group, id="0", mkstream=True)
                except ResponseError as e:
                    if "BUSYGROUP" not in str(e):
                        raise

    async def _check_partitions(self) -> None:
        """The partition count routes every user; changing it under existing data would split a
        user's history across partitions, so a mismatch refuses to start. So does a key layout
        this release cannot read (``services/adapters/layout.py``)."""
        try:
            await check_layout(self.redis, self.settings.partitions)
        except OldLayout as e:
            raise ConfigurationError(str(e)) from None
        await self.redis.set(channels.PARTITIONS_KEY, self.settings.partitions, nx=True)
        stored = int(await self.redis.get(channels.PARTITIONS_KEY))
        if stored != self.settings.partitions:
            raise ConfigurationError(
                f"this Redis holds data for ENGRAM_PARTITIONS={stored}, not {self.settings.partitions}; "
                "set it back (re-partitioning is an export/import)"
            )


def check_roles(settings: Settings) -> None:
    """Qdrant Edge is a shard on this machine's disk that one process owns: the workers that read
    it (commands for save advice and forget-by-query, queries for search) must live in the
    process that writes it. A Qdrant server lifts that: any role can run anywhere."""
    roles = settings.roles
    readers = roles & {"commands", "queries"}
    if settings.index_enabled and not settings.qdrant_url and readers and "index" not in roles:
        raise ConfigurationError(
            f"role(s) {', '.join(sorted(readers))} search the vector index, and the embedded Qdrant Edge shard is "
            "owned by the process with the index role: run them together (--role commands,queries,index), "
            "or set ENGRAM_QDRANT_URL to a Qdrant server to scale them apart"
        )


def build(settings: Settings) -> Engram:
    """Builds the workers of ``settings.roles``; `engram serve` with every role is the embedded default."""
    check_roles(settings)
    roles = settings.roles
    connection = serving_options(settings.redis_url, settings.redis_socket_timeout)
    redis = open_redis(settings.redis_url, settings.redis_cluster, **connection)
    registry = CollectorRegistry() if settings.metrics_port else None
    broker = make_broker(
        settings.redis_url, registry, settings.tracing, settings.redis_cluster, settings.redis_socket_timeout
    )
    master = load_master_key(settings.data_dir)
    store = RedisEventStore(redis, settings.partitions, settings.idempotency_ttl_seconds, master)
    history = HistoryReader(redis, settings.partitions, master)
    access = AccessLog(redis, settings.partitions)
    audit = RecallAudit(store, audited_users(settings.recall_audit), utc_now)
    uses_index = settings.index_enabled and bool(roles & {"commands", "queries", "index"})
    index = build_index_runtime(redis, settings, SubjectMatcher.from_master(master)) if uses_index else None
    search = _search_service(settings, index, history, access, audit) if index is not None else None
    advisor = SaveAdvisor(index, history, settings.similar_threshold) if index is not None else None
    scrubber = Scrubber(redis, settings.partitions, history, store)
    pending = SagaPendingDeletions(redis, settings.partitions)
    forget = ForgetService(
        store,
        history,
        pending,
        search,
        scrubber,
        utc_now,
        timedelta(seconds=settings.forget_ttl_seconds),
        confirmation=settings.forget_confirmation,
        access=access,
    )
    commands = CommandService(command_handlers(store, advisor=advisor, forget=forget))
    timer = ForgetExpiryTimer(pending, settings.partitions, commands.execute, utc_now) if "saga" in roles else None
    context = ContextService(history, search, count_tokens_many, audit=audit, past=history)
    handlers = query_handlers(
        history,
        settings.read_wait_seconds,
        search,
        context,
        access=access,
        recall_queries=store.recall_queries,
        past=history,
    )
    queries = QueryService(handlers)
    _subscribe(broker, settings, commands, queries)
    reclaimers, gates = _request_keepers(settings, redis)
    return Engram(
        settings,
        redis,
        broker,
        store,
        commands,
        queries,
        history,
        _runners(settings, redis, store, master, index),
        reclaimers,
        gates,
        index,
        timer,
        scrubber if "commands" in roles else None,
        registry,
        EngramGauges(registry, redis, settings.partitions) if registry is not None else None,
        master=master,
    )


def _search_service(
    settings: Settings, index: IndexRuntime, history: HistoryReader, access: AccessLog, audit: RecallAudit
) -> SearchService:
    relevance, recency, importance = settings.ranking_weights
    return SearchService(
        index,
        history,
        settings.read_wait_seconds,
        settings.search_policy,
        access=access,
        blend=BlendPolicy(relevance, recency, importance, settings.recency_half_life_days),
        floor=settings.min_relevance,
        audit=audit,
        past=history,
    )


def _runners(
    settings: Settings, redis: Redis, store: RedisEventStore, master: MasterKey, index: IndexRuntime | None
) -> list[ProjectionRunner]:
    """A runner per projection of this process's roles and partition, each under its lease."""
    roles, partitions = settings.roles, range(settings.partitions)
    owner, lease_ms = settings.consumer_name, settings.lease_ms
    opens: list[tuple[str, Callable[[int], Callable[[], Awaitable[Any]]]]] = []
    if "history" in roles:
        opens.append(("history", lambda p: live_history(redis, p, master)))
    if index is not None and "index" in roles:
        # The timeline (every version, for searches of the past) is a projection of its own.
        kinds: list[type[PointsProjection]] = [IndexProjection]
        if index.open_timeline is not None:
            kinds.append(TimelineProjection)
        for kind in kinds:
            opens.append((kind.name, _points_opener(kind, redis, store, index)))
    if "saga" in roles:
        opens.append(("forget-saga", lambda p: live_saga(redis, p)))
    return [
        projection_runner(name, open_live(p), redis, store, p, owner, lease_ms)
        for name, open_live in opens
        for p in partitions
    ]


def _points_opener(
    kind: type[PointsProjection], redis: Redis, store: RedisEventStore, index: IndexRuntime
) -> Callable[[int], Callable[[], Awaitable[Any]]]:
    return lambda p: live_projection(kind, redis, store, index, p)


def _request_keepers(settings: Settings, redis: Redis) -> tuple[list[PendingReclaimer], list[RequestGate]]:
    """What keeps the request streams of this process's roles: a reclaimer per stream (stuck
    requests, dead letters) and a gate per inbox (admission)."""
    roles, partitions = settings.roles, range(settings.partitions)
    reclaimers = [
        PendingReclaimer(
            redis,
            stream(p),
            group,
            settings.claim_idle_ms,
            settings.max_deliveries,
            settings.consumer_name,
            max_entries=settings.request_stream_maxlen,
        )
        for role, stream, group in REQUEST_STREAMS
        if role in roles
        for p in partitions
    ]
    gates = [
        RequestGate(redis, p, lane, settings.user_in_flight, settings.request_stream_maxlen)
        for p in partitions
        for lane in _lanes(p, roles)
    ]
    return reclaimers, gates


def build_index_runtime(redis: Redis, settings: Settings, subjects: SubjectMatcher) -> IndexRuntime:
    """Qdrant Edge under the data dir by default; a Qdrant server when ENGRAM_QDRANT_URL is set.
    ``subjects`` hashes subjects for the index's payloads and for the filters that match them."""
    from engram_ledger.projections.index_runtime import drop_edge_generations, edge_directory, timeline_directory
    from engram_ledger.services.adapters.embedder import MiniLMEmbedder

    embedder = MiniLMEmbedder(
        encoder=settings.encoder, model_cache=settings.model_cache_dir, threads=settings.encoder_threads
    )
    if settings.qdrant_url:
        from engram_ledger.projections.qdrant_server import QdrantServerIndex

        url, key = settings.qdrant_url, settings.qdrant_api_key
        return IndexRuntime(
            redis,
            embedder,
            lambda g: QdrantServerIndex.from_url(url, f"engram_g{g}", key),
            subjects=subjects,
            open_timeline=lambda g: QdrantServerIndex.from_url(url, f"engram_g{g}_timeline", key),
            purge_seconds=settings.index_purge_seconds,
        )
    from engram_ledger.projections.qdrant_edge import QdrantEdgeIndex

    data_dir = settings.data_dir
    return IndexRuntime(
        redis,
        embedder,
        lambda g: QdrantEdgeIndex(edge_directory(data_dir, g)),
        drop_edge_generations(data_dir),
        subjects=subjects,
        open_timeline=lambda g: QdrantEdgeIndex(timeline_directory(data_dir, g)),
        purge_seconds=settings.index_purge_seconds,
    )


def _lanes(partition: int, roles: frozenset[str]) -> list[Lane]:
    """The inboxes a worker with ``roles`` admits requests from, into its streams. The operators'
    take no places: an operator's erasure of a flooding user must get through."""
    return [
        Lane(channels.inbox(stream(partition)), stream(partition), places=stream is not channels.operator_stream)
        for role, stream, _ in REQUEST_STREAMS
        if role in roles
    ]


def _with_share(
    handler: Callable[[bytes, FairShare | None], Awaitable[bytes]], share: FairShare | None
) -> Callable[[bytes], Awaitable[bytes]]:
    async def handle(body: bytes) -> bytes:
        return await handler(body, share)

    handle.__doc__ = handler.__doc__
    handle.__name__ = handler.__name__
    return handle


# How many of a user's share each request subscriber reads ahead of its handlers (see _subscribe).
READ_AHEAD = 16


def _subscribe(broker: RedisBroker, settings: Settings, commands: CommandService, queries: QueryService) -> None:
    # Each takes the request's body as sent (make_broker: no injection, no decoding).
    async def handle_command(body: bytes, share: FairShare | None = None) -> bytes:
        """Executes a command (SaveNote, SaveNotes, UpdateNote, SupersedeNote) and replies with
        NoteWritten, NotesWritten or ErrorReply."""
        return await commands.handle(body, share=share)

    async def handle_operator_command(body: bytes, share: FairShare | None = None) -> bytes:
        """Executes a command sent by an operator: a confirmed forget is taken from here only."""
        return await commands.handle(body, operator=True)

    async def handle_query(body: bytes, share: FairShare | None = None) -> bytes:
        """Answers a query (GetNote, GetHistory, ListNotes, ListRecent) from the history read
        model, after waiting for the caller's consistency token."""
        return await queries.handle(body, share=share)

    handlers = {
        channels.command_stream: handle_command,
        channels.operator_stream: handle_operator_command,
        channels.query_stream: handle_query,
    }
    per_user = settings.share_per_user
    for role, stream, group in REQUEST_STREAMS:
        handler = handlers[stream]
        if role not in settings.roles:
            continue
        for p in range(settings.partitions):
            # Each stream's handlers are taken in turns by the users waiting (FairShare); the
            # subscriber reads ahead of them, far enough that one user holding its whole share
            # leaves room to read (and serve) everyone else's requests behind it.
            share = None if stream is channels.operator_stream else FairShare(settings.handler_concurrency, per_user)
            broker.subscriber(
                # Read in batches, not the whole backlog at once (FastStream's default).
                stream=StreamSub(
                    stream(p),
                    group=group,
                    consumer=settings.consumer_name,
                    polling_interval=1000,
                    max_records=settings.handler_concurrency,
                ),
                ack_policy=AckPolicy.REJECT_ON_ERROR,
                max_workers=settings.handler_concurrency + READ_AHEAD * per_user,
                title=f"{role}-{p}",
                message_format=EnvelopeFormat,
            )(_with_share(handler, share))
