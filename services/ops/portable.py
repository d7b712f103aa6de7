"""``engram export`` / ``engram import``: the raw event log, portable and replayable into an
empty store. One JSON object per line: a header, every log entry of every partition in order
(the event exactly as stored, content still sealed), then every note's wrapped data key. The keys
are wrapped by the master key, so the target needs the same ``ENGRAM_MASTER_KEY`` (for a
rotated store, the generation in use: its header carries that generation and the derivation
root, services/ops/keys.py); a forgotten note has no key and stays forgotten. Projections
rebuild themselves from the imported log; command outcomes (idempotency) are not carried over."""

from __future__ import annotations

import base64
import itertools
import json
import re
from collections.abc import Callable, Iterator
from typing import IO, Any

from redis.asyncio import Redis
from tqdm import tqdm

from engram_ledger.contracts import channels
from engram_ledger.contracts.base import SCHEMA_VERSION
from engram_ledger.contracts.events import ACCOUNT, RECALL_PREFIX, session_stream
from engram_ledger.contracts.limits import ID_PATTERN, MAX_ID_CHARS, NOTE_ID_PATTERN
from engram_ledger.services.adapters.crypto import MAX_GENERATION
from engram_ledger.services.adapters.event_store import RedisEventStore, decode_event
from engram_ledger.services.adapters.keyring import KEYRING_KEY, read_state, root_field
from engram_ledger.services.adapters.redis_conn import transaction_client
from engram_ledger.services.domain.appends import identity_claim
from engram_ledger.services.domain.forgetting import forgettable

FORMAT = 1


# A progress bar for a step: made from its name and its total, updated with a count, then closed
# (tqdm's interface; the CLI passes one, shown on a terminal).
Progress = Callable[[str, "int | None"], Any]


def _no_progress(what: str, total: int | None) -> Any:
    return tqdm(total=total, desc=what, disable=True)


async def export_log(redis: Redis, partitions: int, out: IO[str], progress: Progress = _no_progress) -> dict[str, int]:
    header: dict[str, Any] = {"engram_export": FORMAT, "partitions": partitions, "schema_version": SCHEMA_VERSION}
    keyring = await read_state(redis)
    if keyring.roots or keyring.active != 1:
        # A rotated store: the data keys' generation, and the derivation root wrapped by it, so a
        # target given only the current master key derives the same keyed hashes.
        header["keyring"] = {
            "generation": keyring.active,
            "roots": {str(g): base64.b64encode(w).decode() for g, w in keyring.roots.items()},
        }
    out.write(json.dumps(header) + "\n")
    events = keys = 0
    total = sum([int(await redis.xlen(channels.event_log(p))) for p in range(partitions)])
    with progress("export", total) as bar:
        for p in range(partitions):
            after = "-"
            while True:
                batch = await redis.xrange(channels.event_log(p), after, "+", count=1000)
                if not batch:
                    break
                for entry_id, fields in batch:
                    out.write(json.dumps({"p": p, "id": entry_id.decode(), "e": fields[b"e"].decode()}) + "\n")
                    events += 1
                bar.update(len(batch))
                after = "(" + batch[-1][0].decode()
    for p in range(partitions):
        prefix = channels.data_key(p, "", "")[: -len("::")] + ":"
        async for key in redis.scan_iter(match=channels.matching(prefix), count=1000):
            # Parts are encoded (channels.part): the one ':' left between them splits them.
            user_id, note_id = map(channels.unpart, key.decode()[len(prefix) :].split(":"))
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


# More partitions than a Redis Cluster has hash slots: no export of a real store has them.
MAX_PARTITIONS = 16_384
_ENTRY_ID = re.compile(r"([0-9]+)-([0-9]+)")
_USER_ID = re.compile(ID_PATTERN)
_NOTE_ID = re.compile(NOTE_ID_PATTERN)
# A recall's stream (MemoryRecalled): "recall-" and 32 hex digits.
_RECALL_ID = re.compile(RECALL_PREFIX + r"[0-9a-f]{32}")


def _lines(source: IO[str]) -> Iterator[dict[str, Any]]:
    """The header, then every item, each checked as any input is (a file can be edited, or come
    from someone else): partitions, ids, order and versions as the service writes them, every
    event a contract. A bad line is a ValueError naming it."""
    source.seek(0)
    check: _Checker | None = None
    for number in itertools.count(1):
        try:
            line = source.readline()  # here: text that is not UTF-8 fails on this line
            if not line:
                break
            if not line.strip():
                continue
            item = json.loads(line)
            if not isinstance(item, dict):
                raise ValueError("not a JSON object")
            if check is None:
                check = _Checker(item)
            else:
                check.item(item)
        except ValueError as e:  # json's, msgspec's and base64's errors are ValueErrors too
            raise ValueError(f"line {number}: {e}") from None
        yield item
    if check is None:
        raise ValueError("not an engram export: the file is empty")


class _Checker:
    """What one line of an export may be, given the lines before it."""

    def __init__(self, header: dict[str, Any]) -> None:
        if header.get("engram_export") != FORMAT:
            raise ValueError(f"not an engram export (format {FORMAT})")
        partitions = header.get("partitions")
        if type(partitions) is not int or not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"partitions {partitions!r} is not a count from 1 to {MAX_PARTITIONS}")
        self.partitions = partitions
        keyring = header.get("keyring", {"generation": 1, "roots": {}})
        roots = keyring.get("roots") if isinstance(keyring, dict) else None
        generation = keyring.get("generation") if isinstance(keyring, dict) else None
        if (
            type(generation) is not int
            or not 1 <= generation <= MAX_GENERATION
            or not isinstance(roots, dict)
            or not all(g.isdigit() and 1 <= int(g) <= MAX_GENERATION and _is_base64(w) for g, w in roots.items())
        ):
            raise ValueError("keyring is not a generation and roots by generation (base64)")
        self.positions: dict[int, tuple[int, int]] = {}  # each partition's last entry id
        self.versions: dict[tuple[str, str], int] = {}  # each note's last version

    def item(self, item: dict[str, Any]) -> None:
        p = item.get("p")
        if type(p) is not int or not 0 <= p < self.partitions:
            raise ValueError(f"partition {p!r} is not one of the export's 0 to {self.partitions - 1}")
        if item.keys() == {"p", "dek"}:
            self.data_key(p, item["dek"])
        elif item.keys() == {"p", "id", "e"}:
            self.entry(p, item["id"], item["e"])
        else:
            raise ValueError("neither a log entry (p, id, e) nor a data key (p, dek)")

    def entry(self, p: int, entry_id: Any, raw: Any) -> None:
        entry = _ENTRY_ID.fullmatch(entry_id) if isinstance(entry_id, str) else None
        position = (int(entry[1]), int(entry[2])) if entry else (0, 0)
        # XADD takes only ids after the last one (and a part above 2^64 - 1 nowhere).
        if position <= self.positions.get(p, (0, 0)) or max(position) >= 2**64:
            raise ValueError(f"entry id {entry_id!r} is not a log entry id after the previous one of partition {p}")
        self.positions[p] = position
        try:
            event = decode_event(raw.encode())
        except (AttributeError, ValueError) as e:  # not text; not JSON; not an event of the contract
            raise ValueError(f"the event is not one of the contract's: {e}") from None
        self.ids(p, event.user_id, event.note_id)
        # Versions are gapless per note: the store appends version n + 1 to version n.
        before = self.versions.get((event.user_id, event.note_id), 0)
        if event.version != before + 1:
            raise ValueError(f"note {event.note_id} of {event.user_id} has version {event.version} after {before}")
        self.versions[(event.user_id, event.note_id)] = event.version

    def data_key(self, p: int, dek: Any) -> None:
        if not isinstance(dek, dict) or dek.keys() != {"user", "note", "wrapped"}:
            raise ValueError("a data key is an object of user, note and wrapped")
        self.ids(p, dek["user"], dek["note"])
        if not (_NOTE_ID.fullmatch(dek["note"]) or _RECALL_ID.fullmatch(dek["note"])):
            raise ValueError(f"note id {dek['note']!r} has no data key: it is not 8 characters of A-Za-z0-9")
        try:
            base64.b64decode(dek["wrapped"], validate=True)
        except (TypeError, ValueError):
            raise ValueError("the wrapped data key is not base64 text") from None

    def ids(self, p: int, user_id: Any, note_id: Any) -> None:
        if not isinstance(user_id, str) or not 0 < len(user_id) <= MAX_ID_CHARS or not _USER_ID.fullmatch(user_id):
            raise ValueError(f"user id {user_id!r} is not 1 to {MAX_ID_CHARS} characters of A-Za-z0-9._:@+/=|-")
        if not _is_stream_id(note_id):
            raise ValueError(f"note id {note_id!r} is not a note's, an account's or a session's")
        owner = channels.partition_of(user_id, self.partitions)
        if owner != p:
            raise ValueError(f"user {user_id!r} belongs to partition {owner}, not {p}")


def _is_base64(text: Any) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except (TypeError, ValueError):
        return False
    return True


def _is_stream_id(note_id: Any) -> bool:
    """A note's (or a message's) id, or a control stream's (a user's account, a session)."""
    if not isinstance(note_id, str):
        return False
    session = note_id.removeprefix(session_stream(""))
    return (
        bool(_NOTE_ID.fullmatch(note_id))
        or bool(_RECALL_ID.fullmatch(note_id))
        or note_id == ACCOUNT
        or (session != note_id and 0 < len(session) <= MAX_ID_CHARS)
    )


def read_partitions(source: IO[str]) -> int:
    """The partition count an export's header gives (checked); ``source`` is left at its start."""
    partitions = int(next(_lines(source))["partitions"])
    source.seek(0)
    return partitions


async def import_log(
    redis: Redis, store: RedisEventStore, source: IO[str], progress: Progress = _no_progress
) -> dict[str, int]:
    # The whole file is checked before anything is written; then read again, checked as it goes
    # (it is the same file, unless it changed meanwhile).
    total = sum(1 for _ in _lines(source)) - 1  # the header
    lines = _lines(source)
    header = next(lines)
    partitions = int(header["partitions"])
    if int(await redis.get(channels.PARTITIONS_KEY) or partitions) != partitions:
        raise ValueError(f"this Redis is set up for another partition count than the export's {partitions}")
    for p in range(partitions):
        if await redis.xlen(channels.event_log(p)):
            raise ValueError("the target store is not empty: import only into an empty one")
    await redis.set(channels.PARTITIONS_KEY, partitions)
    await redis.set(channels.LAYOUT_KEY, channels.LAYOUT)  # written below with this release's key names
    if "keyring" in header:
        keyring = header["keyring"]
        roots = {root_field(int(g)): base64.b64decode(w) for g, w in keyring["roots"].items()}
        await redis.hset(KEYRING_KEY, mapping={"active": keyring["generation"], **roots})
    events = keys = 0
    notes: set[tuple[str, str]] = set()
    with progress("import", total) as bar:
        for item in lines:
            bar.update(1)
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
                pipe.xadd(
                    channels.note_stream(p, event.user_id, event.note_id), {"e": raw, "l": item["id"]}, id=item["id"]
                )
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
