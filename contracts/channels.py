"""Where messages live in Redis: stream names and key layout.

The event log is partitioned by user: ``partition_of(user_id)`` is a stable hash (CRC32, never
Python's salted ``hash``) modulo P. Every key of a partition carries the ``{p}`` hash tag, so a
Redis Cluster keeps one partition's keys in one slot and a Lua script may touch them all.

A key name joins its parts with ``:``. A part a caller chose (a user id, a command id, a
conversation's name inside a control stream's id) may hold ``:`` itself, so every such part goes
through ``part()``, which encodes ``%`` and ``:``: user ``bob`` with command ``x:1`` and user
``bob:x`` with command ``1`` are then two keys, not one (they were one before layout 2).
"""

from __future__ import annotations

import hashlib
import re
import zlib

PREFIX = "engram"
# How many partitions the log has: set by the first service to start, read by every client.
PARTITIONS_KEY = f"{PREFIX}:partitions"
# A counter of forgets whose scrub has not yet been made in a quiet moment (see the Scrubber).
SCRUB_OWED_KEY = f"{PREFIX}:scrub:owed"
# Every running worker's report of its readiness (consumer name -> JSON, refreshed every few
# seconds; services/observability/health.py): what `engram health` reads, since the model lives in-process.
WORKERS_KEY = f"{PREFIX}:workers"
# The MCP front door's bearer tokens: SHA-256 of the token -> its record (services/agents/tokens.py).
TOKENS_KEY = f"{PREFIX}:tokens"


# Which key layout this Redis holds (see ``part``); a store without it predates layout 2.
LAYOUT_KEY = f"{PREFIX}:layout"
LAYOUT = 2


def part(text: str) -> str:
    """A caller-chosen string as one part of a key name: ``%`` and ``:`` percent-encoded, so
    parts joined with ``:`` never run into each other. Ids without either are unchanged."""
    return text.replace("%", "%25").replace(":", "%3A")


def unpart(text: str) -> str:
    return text.replace("%3A", ":").replace("%25", "%")


# A client's name, when its replies are bound to it: letters, digits, '.', '_', '-' (never ':'
# nor a glob character, so one name's channel pattern can never take in another name's channels).
CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def valid_client_name(name: str) -> bool:
    return CLIENT_NAME.fullmatch(name) is not None


def reply_channel(requester: str, client: str | None = None) -> str:
    """The pub/sub channel a requester's replies come back on. With ``client`` (a valid client
    name) it falls under ``client_reply_channels(client)``, which a Redis ACL can grant to that
    client's user alone."""
    return f"{PREFIX}:replies:{client}:{requester}" if client else f"{PREFIX}:replies:{requester}"


def client_reply_channels(client: str) -> str:
    """The channel pattern (an ACL's ``&...``) holding every reply channel of ``client``."""
    return f"{PREFIX}:replies:{client}:*"


def applied_channel(database: int) -> str:
    """Pub/sub: where the live history and index projections announce every checkpoint they
    commit (``"<partition> <position>"``), so a reader waiting on a token blocks instead of
    polling. Named by the database: channels are shared by every database of a server, keys
    are not, and another store's notices would wake this one's readers for nothing."""
    return f"{PREFIX}:applied:{database}"


def matching(prefix: str) -> str:
    """A SCAN pattern for every key that starts with ``prefix`` (its glob characters escaped:
    user ids may hold them)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix) + "*"


def partition_of(user_id: str, partitions: int) -> int:
    return zlib.crc32(user_id.encode()) % partitions


def tag(partition: int) -> str:
    return f"{PREFIX}:{{{partition}}}"


def command_stream(partition: int) -> str:
    """Commands for the users of one partition (consumer group ``engram-commands``)."""
    return f"{tag(partition)}:commands"


def in_flight(partition: int, user_id: str) -> str:
    """A user's requests in the request streams and not yet answered (a sorted set: place ->
    when it lapses), which bounds how many of them the streams hold; written by the service only."""
    return f"{tag(partition)}:inflight:{part(user_id)}"


def inbox(stream: str) -> str:
    """Where a client appends a request for ``stream`` (a list, ``RPUSH`` only): the service's
    gate admits it into the stream (services/bus/gate.py)."""
    return f"{stream}:inbox"


def operator_stream(partition: int) -> str:
    """Commands only an operator may send (a confirmed forget, deleting without the second
    call): the service takes ``confirmed`` from this stream only, and an agent's Redis role
    need not be able to write it."""
    return f"{tag(partition)}:operator"


def query_stream(partition: int) -> str:
    """Queries for the users of one partition (consumer group ``engram-queries``)."""
    return f"{tag(partition)}:queries"


def dead_letter_stream(stream: str) -> str:
    """Where a message that failed too many deliveries goes, with its failure record."""
    return f"{stream}:dead"


def relay_dead_letters(group: str) -> str:
    """Where ``engram relay`` of consumer group ``group`` moves an event every post of which failed."""
    return f"{PREFIX}:relay:{part(group)}:dead"


def event_log(partition: int) -> str:
    """The public event stream of one partition: every event, in commit order. Never trimmed
    past the slowest consumer; other services read it with their own consumer groups."""
    return f"{tag(partition)}:log"


def note_stream(partition: int, user_id: str, note_id: str) -> str:
    return f"{tag(partition)}:note:{part(user_id)}:{part(note_id)}"


def note_version(partition: int, user_id: str, note_id: str) -> str:
    return f"{tag(partition)}:ver:{part(user_id)}:{part(note_id)}"


def data_key(partition: int, user_id: str, note_id: str) -> str:
    """The note's data key, wrapped by the master key; deleted when the note is forgotten."""
    return f"{tag(partition)}:dek:{part(user_id)}:{part(note_id)}"


def command_outcome(partition: int, user_id: str, command_id: str) -> str:
    """First outcome of a command, for idempotent retries; scoped by user so one user's command
    id can never reveal another user's outcome."""
    return f"{tag(partition)}:cmd:{part(user_id)}:{part(command_id)}"


def content_key(partition: int, user_id: str, digest: str) -> str:
    """Which active note of a user holds a content (normalised, hashed): exact-duplicate detection."""
    return f"{tag(partition)}:content:{part(user_id)}:{digest}"


COMMAND_GROUP = "engram-commands"
QUERY_GROUP = "engram-queries"


def format_token(partition: int, log_id: str) -> str:
    return f"{partition}:{log_id}"


def parse_token(token: str) -> tuple[int, tuple[int, int]]:
    partition, entry = token.split(":", 1)
    ms, seq = entry.split("-", 1)
    return int(partition), (int(ms), int(seq))


def parse_entry_id(entry_id: str | bytes) -> tuple[int, int]:
    if isinstance(entry_id, bytes):
        entry_id = entry_id.decode()
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


# Projections' keys. Their strings are the stored layout: changing one orphans existing data.


class GenerationKeys:
    """A projection rebuilt into fresh generations keeps each one's state under one prefix (so
    an old one is dropped by prefix) and names the live one in a pointer readers follow."""

    def __init__(self, partition: int, generation: int, name: str) -> None:
        base = f"{tag(partition)}:{name}"
        self.live = f"{base}:live"
        # Who applies the log (projections/runner.py); one lease for every generation.
        self.lease = f"{base}:lease"
        self.prefix = f"{base}:{generation}:"
        self.checkpoint = f"{self.prefix}checkpoint"


class HistoryKeys(GenerationKeys):
    """The history read model (projections/history.py) of one partition and generation."""

    def __init__(self, partition: int, generation: int) -> None:
        super().__init__(partition, generation, "hist")
        # A counter: each rebuild's fresh generation number.
        self.generations = f"{tag(partition)}:hist:generations"

    def note(self, user_id: str, note_id: str) -> str:
        return f"{self.prefix}note:{part(user_id)}:{part(note_id)}"

    def versions(self, user_id: str, note_id: str) -> str:
        return f"{self.prefix}versions:{part(user_id)}:{part(note_id)}"

    def order(self, user_id: str, include_superseded: bool) -> str:
        return f"{self.prefix}{'order-all' if include_superseded else 'order'}:{part(user_id)}"

    def recent(self, user_id: str) -> str:
        return f"{self.prefix}recent:{part(user_id)}"

    def message(self, user_id: str, message_id: str) -> str:
        return f"{self.prefix}msg:{part(user_id)}:{part(message_id)}"

    def keyed(self, user_id: str) -> str:
        """A user's keyed notes: category and key -> the active note holding them."""
        return f"{self.prefix}keyed:{part(user_id)}"

    def said(self, user_id: str, session_id: str) -> str:
        """One conversation's listed turns, by log position. The session is named by a digest,
        as in ``IndexKeys.session``."""
        digest = hashlib.blake2b(session_id.encode(), digest_size=12).hexdigest()
        return f"{self.prefix}said:{part(user_id)}:{digest}"

    def sessions(self, user_id: str) -> str:
        """The sessions a user has spoken in (an erasure of the user drops their listings)."""
        return f"{self.prefix}sessions:{part(user_id)}"

    def recalls(self, user_id: str) -> str:
        """A user's recalls (``MemoryRecalled``) by time: recall id -> milliseconds."""
        return f"{self.prefix}recalls:{part(user_id)}"

    def recall(self, user_id: str, recall_id: str) -> str:
        return f"{self.prefix}recall:{part(user_id)}:{part(recall_id)}"

    def relisted(self, user_id: str) -> str:
        """As ``changed``, for the changes that can move a note in or out of a listing."""
        return f"{self.prefix}relisted:{part(user_id)}"

    def changed(self, user_id: str) -> str:
        """When each of a user's notes last changed (note id -> milliseconds): the notes a
        reading of the past cannot take as they are now."""
        return f"{self.prefix}changed:{part(user_id)}"


class IndexKeys(GenerationKeys):
    """The vector index projection's own state (projections/index.py) of one partition and
    generation; the points themselves live in the vector index."""

    def __init__(self, partition: int, generation: int, name: str = "idx") -> None:
        super().__init__(partition, generation, name)

    def note(self, user_id: str, note_id: str) -> str:
        return f"{self.prefix}note:{part(user_id)}:{part(note_id)}"

    @property
    def recheck(self) -> str:
        """Notes whose points a writer that lost the projection may have written after its
        successor's (a set of ``[user, note]``): the projection writes them again."""
        return f"{self.prefix}recheck"

    def session(self, user_id: str, session_id: str) -> str:
        """The ids of a conversation's last turns (never their text): the next turn's context.
        The session is named by a digest, so no caller-chosen name is left in a key."""
        digest = hashlib.blake2b(session_id.encode(), digest_size=12).hexdigest()
        return f"{self.prefix}session:{part(user_id)}:{digest}"

    def turns(self, user_id: str, session_id: str) -> str:
        """Every turn id of a conversation, in order (a list): which turns came after one that
        is retracted, and so held it in their context."""
        digest = hashlib.blake2b(session_id.encode(), digest_size=12).hexdigest()
        return f"{self.prefix}turns:{part(user_id)}:{digest}"


class TimelineKeys(IndexKeys):
    """The timeline projection's own state (projections/timeline.py): the same kinds of keys as
    the index's, under its own prefix, checkpoint and lease. It is kept in the index's
    generations: the index's pointer names the live one of both."""

    def __init__(self, partition: int, generation: int) -> None:
        super().__init__(partition, generation, "timeline")
        self.live = IndexKeys(partition, generation).live


# One index generation serves every partition (one shard directory or collection), so these
# two keys carry no partition tag.
GENERATIONS_KEY = f"{PREFIX}:index:generations"


def model_key(generation: int) -> str:
    """Which embedding model and dimension an index generation was built with."""
    return f"{PREFIX}:index:model:{generation}"


class SagaKeys:
    """The forget saga's pending deletions and deadlines (projections/forget_saga.py): one
    state per partition, rebuilt in place."""

    def __init__(self, partition: int) -> None:
        base = f"{tag(partition)}:forget"
        self.checkpoint = f"{base}:checkpoint"
        self.deadlines = f"{base}:deadlines"
        # Notes put with a time to live, scored by when they expire.
        self.expiries = f"{base}:expiries"
        self.lease = f"{base}:lease"
        self._base = base

    def pending(self, user_id: str) -> str:
        """The user's notes with a pending deletion."""
        return f"{self._base}:pending:{part(user_id)}"


class AccessKeys:
    """Read counts and last-read times (projections/access.py); not fed from the log."""

    def __init__(self, partition: int) -> None:
        self._base = f"{tag(partition)}:access"

    def counts(self, user_id: str) -> str:
        return f"{self._base}:count:{part(user_id)}"

    def times(self, user_id: str) -> str:
        return f"{self._base}:at:{part(user_id)}"
