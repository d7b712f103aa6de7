"""JSON Schema of every contract (``engram schema``)."""

from __future__ import annotations

from typing import Any

import msgspec

from engram_ledger.contracts.commands import AnyCommand
from engram_ledger.contracts.events import AnyEvent
from engram_ledger.contracts.queries import AnyQuery, AnyReply


def json_schema() -> dict[str, Any]:
    """One document: ``commands``, ``events``, ``queries`` and ``replies`` point into ``$defs``."""
    (commands, events, queries, replies), defs = msgspec.json.schema_components(
        [AnyCommand, AnyEvent, AnyQuery, AnyReply], ref_template="#/$defs/{name}"
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Engram bus contracts",
        "commands": commands,
        "events": events,
        "queries": queries,
        "replies": replies,
        "$defs": defs,
    }
