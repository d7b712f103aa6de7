"""Shared base for every message on the bus."""

from __future__ import annotations

import msgspec

SCHEMA_VERSION = 1


class Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=False):
    """Base of every wire message.

    Subclasses set ``tag=...`` explicitly so a renamed class never changes the wire format.
    ``schema_version`` lets a consumer refuse or upgrade messages written by a newer producer.
    """

    schema_version: int = SCHEMA_VERSION
