"""The AsyncAPI 3.0 document of every channel and message (``engram docs``), generated from the
contracts themselves: their docstrings are the descriptions, msgspec gives the schemas."""

from __future__ import annotations

from typing import Any, get_args

import msgspec

from contracts.base import SCHEMA_VERSION
from contracts.commands import AnyCommand
from contracts.events import AnyEvent
from contracts.queries import AnyQuery, AnyReply


def _tag(cls: type) -> str:
    return str(cls.__struct_config__.tag)  # type: ignore[attr-defined]


def asyncapi() -> dict[str, Any]:
    groups = {"command": AnyCommand, "event": AnyEvent, "query": AnyQuery, "reply": AnyReply}
    classes = [cls for union in groups.values() for cls in get_args(union)]
    _, schemas = msgspec.json.schema_components(classes, ref_template="#/components/schemas/{name}")
    messages: dict[str, Any] = {}
    kinds: dict[str, list[str]] = {}
    for kind, union in groups.items():
        for cls in get_args(union):
            name = cls.__name__
            kinds.setdefault(kind, []).append(name)
            messages[name] = {
                "name": _tag(cls),
                "title": name,
                "summary": (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " "),
                "contentType": "application/json",
                "payload": {"$ref": f"#/components/schemas/{name}"},
            }

    def refs(kind: str) -> dict[str, Any]:
        return {name: {"$ref": f"#/components/messages/{name}"} for name in kinds[kind]}

    partition = {"p": {"description": "the partition: crc32(user_id) mod ENGRAM_PARTITIONS"}}
    channels = {
        "commands": {
            "address": "engram:{p}:commands",
            "description": "Redis stream, consumer group engram-commands. Entries carry one field, __data__, in "
            "FastStream's message format; the reply goes to the Pub/Sub channel named by reply_to.",
            "parameters": partition,
            "messages": refs("command"),
        },
        "queries": {
            "address": "engram:{p}:queries",
            "description": "Redis stream, consumer group engram-queries; request/reply like commands.",
            "parameters": partition,
            "messages": refs("query"),
        },
        "replies": {
            "address": "{reply_to}",
            "description": "Redis Pub/Sub channel chosen by the requester; one reply per request, matched by "
            "correlation_id.",
            "parameters": {"reply_to": {"description": "the requester's reply channel"}},
            "messages": refs("reply"),
        },
        "log": {
            "address": "engram:{p}:log",
            "description": "Redis stream: the partition's event log, field e (the event JSON, content sealed "
            "as enc1:...) and u (user id). Never trimmed past the slowest projection's checkpoint.",
            "parameters": partition,
            "messages": refs("event"),
        },
        "deadLetters": {
            "address": "engram:{p}:commands:dead",
            "description": "Requests that failed ENGRAM_MAX_DELIVERIES times, kept for an operator.",
            "parameters": partition,
            "messages": refs("command"),
        },
    }
    operations = {
        "sendCommand": {
            "action": "send",
            "channel": {"$ref": "#/channels/commands"},
            "reply": {"channel": {"$ref": "#/channels/replies"}},
        },
        "sendQuery": {
            "action": "send",
            "channel": {"$ref": "#/channels/queries"},
            "reply": {"channel": {"$ref": "#/channels/replies"}},
        },
        "followLog": {"action": "receive", "channel": {"$ref": "#/channels/log"}},
    }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Engram",
            "version": f"schema {SCHEMA_VERSION}",
            "description": "Long-term memory for LLM agents, event-sourced on Redis Streams.",
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }
