"""``engram health``: is the bus reachable, and how far behind the log is each projection and
each request group. One JSON object; ``status`` is ``ok``, ``degraded`` (something lags or a
deletion deadline is overdue) or ``down`` (Redis cannot be reached)."""

from __future__ import annotations

import json
import time
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from contracts import channels
from contracts.channels import HistoryKeys, IndexKeys, SagaKeys, model_key
from projections.history import live_generation
from projections.index import live_index_generation
from projections.tracking import position_key
from services.bus.reclaimer import group_info

LAG_ENTRIES_LIMIT = 1000  # more than this behind the log: degraded
OVERDUE_SECONDS = 30  # a deletion deadline passed this long ago and still pending: degraded


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


async def health(redis: Redis, partitions: int | None = None) -> dict[str, Any]:
    try:
        await redis.ping()
        partitions = partitions or int(await redis.get(channels.PARTITIONS_KEY) or 1)
    except (RedisError, OSError) as e:
        return {"status": "down", "error": str(e)}
    report: dict[str, Any] = {"status": "ok", "partitions": []}
    degraded = False
    now_ms = time.time() * 1000
    for p in range(partitions):
        last = await redis.xrevrange(channels.event_log(p), count=1)
        head = channels.parse_entry_id(last[0][0]) if last else (0, 0)
        part: dict[str, Any] = {"partition": p, "log_length": int(await redis.xlen(channels.event_log(p)))}
        hist = HistoryKeys(p, await live_generation(redis, p))
        part["history"] = await _lag(redis, p, await redis.get(hist.checkpoint), head)
        index_generation = await live_index_generation(redis, p)
        index_checkpoint = await redis.get(IndexKeys(p, index_generation).checkpoint)
        model = await redis.get(model_key(index_generation))
        if index_checkpoint is not None or model is not None:
            part["index"] = {
                "generation": index_generation,
                "model": json.loads(model) if model else None,
                **await _lag(redis, p, index_checkpoint, head),
            }
        saga = SagaKeys(p)
        part["forget_saga"] = {
            **await _lag(redis, p, await redis.get(saga.checkpoint), head),
            "pending_deletions": int(await redis.zcard(saga.deadlines)),
            "overdue": int(await redis.zcount(saga.deadlines, "-inf", now_ms - OVERDUE_SECONDS * 1000)),
        }
        for name, stream, group in (
            ("commands", channels.command_stream(p), channels.COMMAND_GROUP),
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
        lags = [part["history"], part["forget_saga"], *([part["index"]] if "index" in part else [])]
        degraded |= any(x["lag_entries"] > LAG_ENTRIES_LIMIT for x in lags) or part["forget_saga"]["overdue"] > 0
        report["partitions"].append(part)
    report["status"] = "degraded" if degraded else "ok"
    return report
