"""Where messages live in Redis: stream names and key layout.

The event log is partitioned by user: ``partition_of(user_id)`` is a stable hash (CRC32, never
Python's salted ``hash``) modulo P. Every key of a partition carries the ``{p}`` hash tag, so a
Redis Cluster keeps one partition's keys in one slot and a Lua script may touch them all.
"""

from __future__ import annotations

import zlib

PREFIX = "engram"
# How many partitions the log has: set by the first service to start, read by every client.
PARTITIONS_KEY = f"{PREFIX}:partitions"


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


def query_stream(partition: int) -> str:
    """Queries for the users of one partition (consumer group ``engram-queries``)."""
    return f"{tag(partition)}:queries"


def dead_letter_stream(stream: str) -> str:
    """Where a message that failed too many deliveries goes, with its failure record."""
    return f"{stream}:dead"


def event_log(partition: int) -> str:
    """The public event stream of one partition: every event, in commit order. Never trimmed
    past the slowest consumer; other services read it with their own consumer groups."""
    return f"{tag(partition)}:log"


def note_stream(partition: int, user_id: str, note_id: str) -> str:
    return f"{tag(partition)}:note:{user_id}:{note_id}"


def note_version(partition: int, user_id: str, note_id: str) -> str:
    return f"{tag(partition)}:ver:{user_id}:{note_id}"


def data_key(partition: int, user_id: str, note_id: str) -> str:
    """The note's data key, wrapped by the master key; deleted when the note is forgotten."""
    return f"{tag(partition)}:dek:{user_id}:{note_id}"


def command_outcome(partition: int, user_id: str, command_id: str) -> str:
    """First outcome of a command, for idempotent retries; scoped by user so one user's command
    id can never reveal another user's outcome."""
    return f"{tag(partition)}:cmd:{user_id}:{command_id}"


def content_key(partition: int, user_id: str, digest: str) -> str:
    """Which active note of a user holds a content (normalised, hashed): exact-duplicate detection."""
    return f"{tag(partition)}:content:{user_id}:{digest}"


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
