"""Keeping a copy in step with Engram's memory with FastStream alone (and Engram's contracts).

    faststream run examples.subscriber:app      # or: .venv/bin/python -m examples.subscriber

It finds Engram's Redis as the ``engram`` command does (``ENGRAM_REDIS_URL``, else the private
redis-server ``engram serve`` started, else the local one).

Engram's event log is one Redis stream per partition, ``engram:{p}:log``. Each entry has two
fields: ``e``, one event of ``contracts/events.py`` as JSON (its content sealed: ``enc1:...``),
and ``u``, its user. This app reads every partition with FastStream's own ``StreamSub`` and a
consumer group of its own, keeps a copy of each note's metadata (a dict here; yours is a CRM, a
search index, an audit trail) and erases what Engram forgets, acking each entry once applied.

- The groups are created at the log's start (``0``) before FastStream starts: FastStream would
  create them at ``$`` (new entries only), and a ``StreamSub`` with another ``last_id`` reads
  only the consumer's own pending entries once its group exists.
- ``AckPolicy.REJECT_ON_ERROR``: acked when the handler returns; an exception leaves the entry
  pending. FastStream then reads it again only through XAUTOCLAIM, so each partition has a
  second subscriber with ``min_idle_time``: it takes over what any consumer of the group (this
  one before a crash, or a dead one) left pending that long.
- Every entry may come more than once: ``apply`` is idempotent by the note's version.
"""

from __future__ import annotations

import os

import msgspec
from fast_depends.msgspec import MsgSpecSerializer
from faststream import AckPolicy, FastStream
from faststream.redis import RedisBroker, RedisRouter, StreamSub
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from engram_ledger.contracts import channels
from engram_ledger.contracts.events import (
    AnyEvent,
    MessageRecorded,
    NoteForgotten,
    NoteSaved,
    SessionForgotten,
    UserForgotten,
)
from engram_ledger.services import engram_url

URL = engram_url()
# As the service was started with (engram:partitions holds it, if this role may read it).
PARTITIONS = int(os.environ.get("ENGRAM_PARTITIONS", "1"))
GROUP = os.environ.get("SUBSCRIBER_GROUP", "crm-sync")
# A stable name: after a restart this consumer's own pending entries are its to claim.
CONSUMER = os.environ.get("SUBSCRIBER_CONSUMER", f"{GROUP}-1")
CLAIM_IDLE_MS = int(os.environ.get("SUBSCRIBER_CLAIM_IDLE_MS", "30000"))


class LogEntry(msgspec.Struct):
    """A log entry's fields."""

    e: str  # the event, JSON
    u: str  # its user


class Copy(msgspec.Struct):
    """What this subscriber keeps of a note: metadata only (its content is sealed)."""

    kind: str
    category: str | None
    version: int


copies: dict[tuple[str, str], Copy] = {}
# Notes and messages erased: (user, id). Kept (ids only) so that nothing erased comes back.
erased: set[tuple[str, str]] = set()
decode_event = msgspec.json.Decoder(AnyEvent).decode


def apply(event: AnyEvent) -> None:
    """One event on the copy. Erasures first: a copy must forget what Engram forgets."""
    note = (event.user_id, event.note_id)
    if note in erased:
        # A save claimed late from a crashed consumer can come after its note's erasure: an
        # erased note is never copied again.
        return
    if isinstance(event, NoteForgotten):
        erased.add(note)
        copies.pop(note, None)
        print(f"erased {event.user_id}/{event.note_id}", flush=True)
    elif isinstance(event, UserForgotten):
        erased.update((event.user_id, erased_id) for erased_id in event.erased)
        for held in [n for n in copies if n[0] == event.user_id]:
            del copies[held]
        print(f"erased user {event.user_id} ({len(event.erased)} notes and messages)", flush=True)
    elif isinstance(event, SessionForgotten):
        for message_id in event.erased:
            erased.add((event.user_id, message_id))
            copies.pop((event.user_id, message_id), None)
        print(f"erased conversation {event.session_id} of {event.user_id}", flush=True)
    elif isinstance(event, NoteSaved | MessageRecorded):
        if note not in copies:
            kind = event.kind if isinstance(event, NoteSaved) else "message"
            category = event.category if isinstance(event, NoteSaved) else None
            copies[note] = Copy(kind=kind, category=category, version=event.version)
            print(f"copied {event.user_id}/{event.note_id} v{event.version} ({kind})", flush=True)
    elif note in copies and event.version > copies[note].version:
        copies[note].version = event.version
        category = getattr(event, "category", None)
        if category is not None:
            copies[note].category = category
        print(f"updated {event.user_id}/{event.note_id} v{event.version} ({event.__struct_config__.tag})", flush=True)


async def on_entry(entry: LogEntry) -> None:
    """One entry of Engram's event log: applied to the copy, then acked (by the ack policy)."""
    apply(decode_event(entry.e))


broker = RedisBroker(URL, serializer=MsgSpecSerializer())
router = RedisRouter()
for p in range(PARTITIONS):
    log = channels.event_log(p)
    router.subscriber(
        stream=StreamSub(log, group=GROUP, consumer=CONSUMER, polling_interval=1000),
        ack_policy=AckPolicy.REJECT_ON_ERROR,
        title=f"engram-log-{p}",
        description="Every event of the partition, in log order, through this subscriber's group.",
    )(on_entry)
    router.subscriber(
        stream=StreamSub(log, group=GROUP, consumer=CONSUMER, min_idle_time=CLAIM_IDLE_MS, polling_interval=1000),
        ack_policy=AckPolicy.REJECT_ON_ERROR,
        title=f"engram-log-{p}-claim",
        description="Entries the group left pending longer than the claim time (a crash), taken over.",
    )(on_entry)
broker.include_router(router)
app = FastStream(broker)


@app.on_startup
async def create_groups() -> None:
    redis = Redis.from_url(URL)
    try:
        for p in range(PARTITIONS):
            try:
                await redis.xgroup_create(channels.event_log(p), GROUP, id="0", mkstream=True)
            except ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise
    finally:
        await redis.aclose()


if __name__ == "__main__":
    import asyncio

    asyncio.run(app.run())
