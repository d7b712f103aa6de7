"""Deterministic ids, so that deciding twice on the same command gives the same result."""

from __future__ import annotations

import hashlib
import uuid

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_EVENT_NAMESPACE = uuid.UUID("5b0c4a9e-3f7e-4c55-9a57-2f4a1d3e8e10")


def new_note_id(user_id: str, command_id: str, index: int, attempt: int) -> str:
    """8 chars of A-Za-z0-9 (62^8 ~ 2.2e14 ids) derived from the command, so a retried or
    concurrently duplicated command names the same note. ``attempt`` salts a rare collision with
    an existing note of the same user."""
    digest = hashlib.blake2b(f"{user_id}\x1f{command_id}\x1f{index}\x1f{attempt}".encode(), digest_size=16).digest()
    number = int.from_bytes(digest, "big")
    chars = []
    for _ in range(8):
        number, rest = divmod(number, 62)
        chars.append(ALPHABET[rest])
    return "".join(chars)


def event_id(user_id: str, note_id: str, version: int) -> str:
    """A (user, note, version) triple occurs once in the log, so it names the event."""
    return str(uuid.uuid5(_EVENT_NAMESPACE, f"{user_id}/{note_id}/{version}"))
