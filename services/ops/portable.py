"""``engram export`` / ``engram import``: the raw event log, portable and replayable into an
empty store. One JSON object per line: a header, every log entry of every partition in order
(the event exactly as stored, content still sealed), then every note's wrapped data key. The keys
are wrapped by the master key, so the target needs the same ``ENGRAM_MASTER_KEY``; a forgotten
note has no key and stays forgotten. Projections rebuild themselves from the imported log;
command outcomes (idempotency) are not carried over."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import IO, Any

from redis.asyncio import Redis

from contracts import channels
from contracts.base import SCHEMA_VERSION
from services.adapters.event_store import RedisEventStore, decode_event
from services.adapters.redis_conn import transaction_client
from services.domain.decider import forgettable, identity_claim

FORMAT = 1


async def export_log(redis: Redis, partitions: int, out: IO[str]) -> dict[str, int]:
    out.write(json.dumps({"engram_export": FORMAT, "partitions": partitions, "schema_version": SCHEMA_VERSION}) + "\n")
    events = keys = 0
    for p in range(partitions):
        after = "-"
        while True:
            batch = await redis.xrange(channels.event_log(p), after, "+", count=1000)
            if not batch:
                break
            for entry_id, fields in batch:
                out.write(json.dumps({"p": p, "id": entry_id.decode(), "e": fields[b"e"].decode()}) + "\n")
                events += 1
            after = "(" + batch[-1][0].decode()
        prefix = f"{channels.tag(p)}:dek:"
        async for key in redis.scan_iter(match=prefix + "*", count=1000):
            user_id, note_id = key.decode()[len(prefix) :].rsplit(":", 1)
            wrapped = await redis.get(key)
            if wrapped is not None:
                out.write(
                    json.dumps(
                        {
                            "p": p,
                            "dek": {"user": user_id, "note": note_id, "wrapped": base64.b64encode(wrapped).decode()},
                        }
                    )
                    + "\n"
                )
                keys += 1
    return {"events": events, "data_keys": keys}


def _lines(source: IO[str]) -> Iterator[dict[str, Any]]:
    for line in source:
        if line.strip():
            yield json.loads(line)


async def import_log(redis: Redis, store: RedisEventStore, source: IO[str]) -> dict[str, int]:
    lines = _lines(source)
    header = next(lines, None)
    if not header or header.get("engram_export") != FORMAT:
        raise ValueError("not an engram export (format 1)")
    partitions = int(header["partitions"])
    if int(await redis.get(channels.PARTITIONS_KEY) or partitions) != partitions:
        raise ValueError(f"this Redis is set up for another partition count than the export's {partitions}")
    for p in range(partitions):
        if await redis.xlen(channels.event_log(p)):
            raise ValueError("the target store is not empty: import only into an empty one")
    await redis.set(channels.PARTITIONS_KEY, partitions)
    events = keys = 0
    notes: set[tuple[str, str]] = set()
    for item in lines:
        p = int(item["p"])
        if "dek" in item:
            dek = item["dek"]
            await redis.set(channels.data_key(p, dek["user"], dek["note"]), base64.b64decode(dek["wrapped"]))
            keys += 1
            continue
        raw = item["e"]
        event = decode_event(raw.encode())
        # Same entry ids as the source: tokens and checkpoints keep their meaning.
        async with (await transaction_client(redis, channels.event_log(p))).pipeline(transaction=True) as pipe:
            pipe.xadd(channels.event_log(p), {"e": raw, "u": event.user_id}, id=item["id"])
            pipe.xadd(channels.note_stream(p, event.user_id, event.note_id), {"e": raw, "l": item["id"]}, id=item["id"])
            pipe.set(channels.note_version(p, event.user_id, event.note_id), event.version)
            await pipe.execute()
        notes.add((event.user_id, event.note_id))
        events += 1
    # The claims of active notes, on their content or their key (derived state the append keeps
    # in Redis).
    claims = 0
    for user_id, note_id in sorted(notes):
        state = (await store.load(user_id, [note_id]))[note_id].state
        if forgettable(state) and state.status is not None and state.status.value == "active":
            p = store.partition_of(user_id)
            await redis.set(channels.content_key(p, user_id, identity_claim(state)), note_id)
            claims += 1
    return {"events": events, "data_keys": keys, "content_claims": claims}
