"""Prometheus metrics on ``ENGRAM_METRICS_PORT``: FastStream's own middleware (messages received,
processed, their duration and size, per stream) plus Engram's gauges, refreshed from the same
report as ``engram health``: projection lag, request-group lag, dead letters, pending and overdue
deletions."""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry, Gauge
from redis.asyncio import Redis

from engram_ledger.services.common.periodic import every
from engram_ledger.services.observability.health import health

log = logging.getLogger("engram.metrics")


class EngramGauges:
    def __init__(self, registry: CollectorRegistry, redis: Redis, partitions: int) -> None:
        self._redis = redis
        self._partitions = partitions
        labels = ["projection", "partition"]
        self.lag_entries = Gauge(
            "engram_projection_lag_entries", "log entries not yet applied", labels, registry=registry
        )
        self.lag_ms = Gauge("engram_projection_lag_ms", "age of the oldest unapplied entry", labels, registry=registry)
        self.group_lag = Gauge(
            "engram_request_group_lag", "requests not yet delivered", ["stream", "partition"], registry=registry
        )
        self.pending = Gauge(
            "engram_request_pending", "requests delivered, not acknowledged", ["stream", "partition"], registry=registry
        )
        self.dead = Gauge(
            "engram_dead_letters", "requests in the dead-letter stream", ["stream", "partition"], registry=registry
        )
        self.deletions = Gauge(
            "engram_forget_pending_deletions", "deletions awaiting confirmation", ["partition"], registry=registry
        )
        self.overdue = Gauge(
            "engram_forget_overdue_deletions", "pending deletions past their deadline", ["partition"], registry=registry
        )
        self.up = Gauge("engram_bus_up", "1 when Redis answers", registry=registry)

    async def refresh(self) -> None:
        report = await health(self._redis, self._partitions)
        self.up.set(0 if report["status"] == "down" else 1)
        for part in report.get("partitions", []):
            p = str(part["partition"])
            for name in ("history", "index", "forget_saga"):
                if name in part:
                    self.lag_entries.labels(name, p).set(part[name]["lag_entries"])
                    self.lag_ms.labels(name, p).set(part[name]["lag_ms"])
            for stream in ("commands", "queries"):
                self.group_lag.labels(stream, p).set(part[stream]["lag"])
                self.pending.labels(stream, p).set(part[stream]["pending"])
                self.dead.labels(stream, p).set(part[stream]["dead_letters"])
            self.deletions.labels(p).set(part["forget_saga"]["pending_deletions"])
            self.overdue.labels(p).set(part["forget_saga"]["overdue"])

    async def run(self, stop: asyncio.Event, interval: float = 5.0) -> None:
        await every(interval, stop, self.refresh, "metrics refresh", log)
