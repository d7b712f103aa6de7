"""``engram health``: is the bus reachable, are the workers ready, and how far behind the log is
each projection and each request group. One JSON object; ``status`` is ``ok``, ``starting`` (a
worker is still loading the embedding model, or the index is catching up with the log),
``degraded`` (something lags, a deletion deadline is overdue, the model failed to load or the
index was built with another model) or ``down`` (Redis cannot be reached, or no worker runs).

The model lives in each worker's process, so every worker publishes its own readiness in Redis
(``WorkerReport``, under ``engram:workers``) and ``health`` reads it from there: ``model`` is
``loaded``, ``loading``, ``failed`` or ``off`` (no worker embeds), ``index`` is ``ready``,
``catching up`` (not open yet, or more than ``CATCHING_UP_ENTRIES`` behind the log), ``refused``
or ``off``. ``keys`` is the master-key generation new data keys are wrapped under and a
rotation in progress (services/ops/keys.py); a worker that does not hold that generation makes
the service ``degraded``. A deployment waits for ``engram health`` to exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from engram_ledger.contracts import channels
from engram_ledger.contracts.channels import HistoryKeys, IndexKeys, SagaKeys, TimelineKeys, model_key
from engram_ledger.projections.history import live_generation
from engram_ledger.projections.index import live_index_generation
from engram_ledger.projections.tracking import position_key
from engram_ledger.services.adapters.keyring import read_state
from engram_ledger.services.adapters.redis_conn import group_info
from engram_ledger.services.common.periodic import every

if TYPE_CHECKING:
    from engram_ledger.projections.index_runtime import IndexRuntime
    from engram_ledger.services.adapters.crypto import MasterKey

log = logging.getLogger("engram.health")

LAG_ENTRIES_LIMIT = 1000  # more than this behind the log: degraded
OVERDUE_SECONDS = 30  # a deletion deadline passed this long ago and still pending: degraded
# The index is "catching up" (and health not ok) while more than this many log entries wait to be
# embedded: a fresh start over an imported log, or a rebuild. A few entries in flight are not.
CATCHING_UP_ENTRIES = 100
REPORT_SECONDS = 2.0  # how often a worker refreshes its report
SILENT_SECONDS = 10.0  # a worker whose report is older than this is gone (killed, or cut off)
FORGOTTEN_SECONDS = 300.0  # reports this old are deleted (worker names carry the pid: each start is new)


async def _now_ms(redis: Redis) -> int:
    # Redis's clock, not this host's: workers on several hosts are compared with one clock.
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


class WorkerReport:
    """One worker's readiness, kept in Redis for ``engram health``: its roles, whether its
    embedding model is loaded, whether it has the live index generation open."""

    def __init__(
        self,
        redis: Redis,
        consumer: str,
        roles: Iterable[str],
        index: IndexRuntime | None,
        keys: MasterKey | None = None,
    ) -> None:
        self._redis = redis
        self._consumer = consumer
        self._roles = sorted(roles)
        self._index = index
        self._keys = keys

    def state(self) -> dict[str, Any]:
        index = self._index
        state: dict[str, Any] = {
            "roles": self._roles,
            "model": index.model_state if index is not None else "off",
            "index": index.index_state if index is not None else "off",
        }
        if index is not None and index.model_load_seconds is not None:
            state["model_load_seconds"] = index.model_load_seconds
        elif index is not None and index.embedder.loading_seconds:
            # Starting: searches wait for the model (and answer STARTING past their caller's wait).
            state["model_loading_seconds"] = round(index.embedder.loading_seconds, 1)
        if index is not None and (files := index.files_state()) is not None:
            state["index_files"] = files
        if self._keys is not None:
            # What a key rotation waits on (services/ops/keys.py): the generations this worker can
            # open, and the one it wraps new data keys under.
            state["key_generation"] = self._keys.active_generation
            state["key_generations"] = self._keys.generations
        return state

    async def publish(self) -> None:
        """Write this worker's report now (also when its state changes, not to wait a round)."""
        now = await _now_ms(self._redis)
        await self._redis.hset(channels.WORKERS_KEY, self._consumer, json.dumps({**self.state(), "at": now}))
        stale = [
            name
            for name, raw in (await self._redis.hgetall(channels.WORKERS_KEY)).items()
            if now - int(json.loads(raw).get("at", 0)) > FORGOTTEN_SECONDS * 1000
        ]
        if stale:
            await self._redis.hdel(channels.WORKERS_KEY, *stale)

    async def run(self, stop: asyncio.Event) -> None:
        await every(REPORT_SECONDS, stop, self.publish, "readiness report", log)

    async def withdraw(self) -> None:
        """A worker that stops says so at once (one that dies falls silent instead)."""
        # Best effort on the way out: Redis may be the reason this worker stops.
        with contextlib.suppress(Exception):
            await self._redis.hdel(channels.WORKERS_KEY, self._consumer)


async def live_workers(redis: Redis) -> list[dict[str, Any]]:
    """The reports of the workers heard from in the last ``SILENT_SECONDS``."""
    now = await _now_ms(redis)
    workers = []
    for name, raw in sorted((await redis.hgetall(channels.WORKERS_KEY)).items()):
        report = json.loads(raw)
        age = now - int(report.pop("at", 0))
        if age <= SILENT_SECONDS * 1000:
            workers.append({"worker": name.decode(), **report, "seen_seconds_ago": round(max(age, 0) / 1000, 1)})
    return workers


def _worst(states: Iterable[str], order: tuple[str, ...]) -> str:
    """The state furthest from ready (``order`` runs from worst to best); ``off`` when none."""
    found = set(states) - {"off"}
    return next((state for state in order if state in found), "off")


async def _lag(redis: Redis, partition: int, checkpoint: bytes | None, head: tuple[int, int]) -> dict[str, Any]:
    done = position_key(checkpoint) if checkpoint else (0, 0)
    behind = await redis.xrange(
        channels.event_log(partition), f"({done[0]}-{done[1]}", "+", count=LAG_ENTRIES_LIMIT + 1
    )
    return {
        "checkpoint": checkpoint.decode() if checkpoint else None,
        "lag_entries": len(behind),
        "lag_ms": max(0, head[0] - done[0]) if behind else 0,
    }


async def _index_lags(redis: Redis, partition: int, head: tuple[int, int], index_state: str) -> dict[str, Any]:
    """The live index's generation, model and lag, and its timeline's (every version, for
    searches of the past: a projection of its own) beside it in the same shape; none where no
    index is kept."""
    generation = await live_index_generation(redis, partition)
    checkpoint = await redis.get(IndexKeys(partition, generation).checkpoint)
    model = await redis.get(model_key(generation))
    if checkpoint is None and model is None and index_state == "off":
        return {}
    shown = {"generation": generation, "model": json.loads(model) if model else None}
    timeline = await redis.get(TimelineKeys(partition, generation).checkpoint)
    return {
        "index": {**shown, **await _lag(redis, partition, checkpoint, head)},
        "timeline": {**shown, **await _lag(redis, partition, timeline, head)},
    }


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _index_files(workers: list[dict[str, Any]], now: float, unapplied: int) -> dict[str, Any] | None:
    """Whether deleted points (forgotten notes' vectors, ids and payloads) are still in the
    index's files: ``removal`` is ``complete``, ``pending`` (with when it is due; also while the
    index has ``unapplied`` log entries to apply, which may hold forgets) or ``overdue`` (past its
    bound by ``OVERDUE_SECONDS``: degraded)."""
    reports = [w["index_files"] for w in workers if w.get("index_files")]
    if not reports:
        return None
    owed = [_seconds(r["owed_since"]) for r in reports if r.get("owed_since")]
    rewritten = [_seconds(r["rewritten_at"]) for r in reports if r.get("rewritten_at")]
    found: dict[str, Any] = {"bound_seconds": max(r["bound_seconds"] for r in reports)}
    if rewritten:
        found["last_rewritten_at"] = _when(max(rewritten))
    if not owed:
        if unapplied:
            return {"removal": "pending", "waiting_for": f"the index to apply {unapplied} log entries", **found}
        return {"removal": "complete", **found}
    since = min(owed)
    due = since + found["bound_seconds"]
    late = now > due + OVERDUE_SECONDS
    return {"removal": "overdue" if late else "pending", "owed_since": _when(since), "due_by": _when(due), **found}


async def health(redis: Redis, partitions: int | None = None) -> dict[str, Any]:
    try:
        await redis.ping()
        partitions = partitions or int(await redis.get(channels.PARTITIONS_KEY) or 1)
    except (RedisError, OSError) as e:
        return {"status": "down", "error": str(e)}
    workers = await live_workers(redis)
    model_state = _worst((w["model"] for w in workers), ("failed", "loading", "loaded"))
    index_state = _worst((w["index"] for w in workers), ("refused", "opening", "open"))
    report: dict[str, Any] = {
        "status": "ok",
        "model": model_state,
        "index": index_state,
        "workers": workers,
        "partitions": [],
    }
    keys = (await read_state(redis)).summary()
    report["keys"] = keys
    # A worker without the generation in use cannot open the data keys wrapped under it.
    blind = [w["worker"] for w in workers if keys["generation"] not in w.get("key_generations", [keys["generation"]])]
    if blind:
        keys["workers_without_generation"] = blind
    degraded = model_state == "failed" or index_state == "refused" or bool(blind)
    index_behind = False
    now_ms = time.time() * 1000
    for p in range(partitions):
        last = await redis.xrevrange(channels.event_log(p), count=1)
        head = channels.parse_entry_id(last[0][0]) if last else (0, 0)
        part: dict[str, Any] = {"partition": p, "log_length": int(await redis.xlen(channels.event_log(p)))}
        hist = HistoryKeys(p, await live_generation(redis, p))
        part["history"] = await _lag(redis, p, await redis.get(hist.checkpoint), head)
        part |= await _index_lags(redis, p, head, index_state)
        # Searches of the present wait for the index, searches of the past for the timeline.
        index_behind |= any(part[n]["lag_entries"] > CATCHING_UP_ENTRIES for n in ("index", "timeline") if n in part)
        saga = SagaKeys(p)
        part["forget_saga"] = {
            **await _lag(redis, p, await redis.get(saga.checkpoint), head),
            "pending_deletions": int(await redis.zcard(saga.deadlines)),
            "overdue": int(await redis.zcount(saga.deadlines, "-inf", now_ms - OVERDUE_SECONDS * 1000)),
        }
        for name, stream, group in (
            ("commands", channels.command_stream(p), channels.COMMAND_GROUP),
            ("operator", channels.operator_stream(p), channels.COMMAND_GROUP),
            ("queries", channels.query_stream(p), channels.QUERY_GROUP),
        ):
            info = await group_info(redis, stream, group)
            dead = await redis.xlen(channels.dead_letter_stream(stream))
            part[name] = {
                "group": info is not None,
                "pending": int(info["pending"]) if info else 0,
                "lag": int(info.get("lag") or 0) if info else 0,
                "dead_letters": int(dead),
            }
            degraded |= info is None or int(info.get("lag") or 0) > LAG_ENTRIES_LIMIT
        # The index's lag is "catching up" (starting), however long: it embeds a backlog at its own pace.
        lags = [part["history"], part["forget_saga"]]
        degraded |= any(x["lag_entries"] > LAG_ENTRIES_LIMIT for x in lags) or part["forget_saga"]["overdue"] > 0
        report["partitions"].append(part)
    # A log entry the index or the timeline has yet to apply may be a forget: its points are not
    # deleted yet, so no rewrite can have removed them.
    unapplied = sum(p[name]["lag_entries"] for p in report["partitions"] for name in ("index", "timeline") if name in p)
    files = _index_files(workers, now_ms / 1000, unapplied)
    if files is not None:
        report["index_files"] = files
        degraded |= files["removal"] == "overdue"
    if index_state == "open":
        report["index"] = "catching up" if index_behind else "ready"
    elif index_state == "opening":
        report["index"] = "catching up"
    if not workers:
        report["status"] = "down"
        report["error"] = f"no engram worker has reported in the last {SILENT_SECONDS:g} s: is `engram serve` running?"
    elif degraded:
        report["status"] = "degraded"
    elif model_state == "loading" or report["index"] == "catching up":
        report["status"] = "starting"
    return report
