"""The AsyncAPI 3.0 document of every channel and message (``engram docs``), generated from the
contracts themselves: their docstrings are the descriptions, msgspec gives the schemas."""

from __future__ import annotations

from typing import Any, get_args

import msgspec

from engram_ledger.contracts.base import SCHEMA_VERSION
from engram_ledger.contracts.commands import AnyCommand
from engram_ledger.contracts.events import AnyEvent
from engram_ledger.contracts.queries import AnyQuery, AnyReply

# What a subscriber that keeps copies owes the users whose memory it copies (README, Subscribing).
ERASURE_CONTRACT = (
    "Forgetting reaches subscribers: on note_forgotten erase every copy of that note (all its versions, "
    "and whatever was derived from its content: embeddings, summaries, index entries, caches); on "
    "user_forgotten erase everything held about the user (every id in erased); on session_forgotten the "
    "conversation's messages (erased). Ack only once erased. Engram destroys the note's data key, so its "
    "content can never be read from the log again; copies made before are the subscriber's to erase."
)


def _tag(cls: type) -> str:
    return str(cls.__struct_config__.tag)  # type: ignore[attr-defined]


GROUPS = {"command": AnyCommand, "event": AnyEvent, "query": AnyQuery, "reply": AnyReply}
_PARTITION = {"p": {"description": "the partition: crc32(user_id) mod ENGRAM_PARTITIONS"}}
_ENVELOPE = (
    'in FastStream\'s binary format or its JSON envelope {"data": "<body as JSON text>", "headers": '
    '{"reply_to": ..., "correlation_id": ..., "engram-wait-ms": ...}}'
)


def asyncapi() -> dict[str, Any]:
    classes = [cls for union in GROUPS.values() for cls in get_args(union)]
    _, schemas = msgspec.json.schema_components(classes, ref_template="#/components/schemas/{name}")
    messages, kinds = _messages()
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Engram",
            "version": f"schema {SCHEMA_VERSION}",
            "description": "Long-term memory for LLM agents, event-sourced on Redis Streams.",
        },
        "defaultContentType": "application/json",
        "channels": _channels(kinds),
        "operations": _operations(),
        "components": {"messages": messages, "schemas": schemas},
    }


def _messages() -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Every message, described by its contract's docstring; and their names by kind."""
    messages: dict[str, Any] = {}
    kinds: dict[str, list[str]] = {}
    for kind, union in GROUPS.items():
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
    return messages, kinds


def _channels(kinds: dict[str, list[str]]) -> dict[str, Any]:
    def refs(kind: str) -> dict[str, Any]:
        return {name: {"$ref": f"#/components/messages/{name}"} for name in kinds[kind]}

    return {
        "commands": {
            "address": "engram:{p}:commands:inbox",
            "description": "Redis list: RPUSH the request (all a client's role may do), " + _ENVELOPE + "; the "
            "service's gate admits it, within its user's share, into the stream engram:{p}:commands (consumer "
            "group engram-commands), and the reply goes to the Pub/Sub channel named by reply_to, in the "
            "request's format.",
            "parameters": _PARTITION,
            "messages": refs("command"),
        },
        "queries": {
            "address": "engram:{p}:queries:inbox",
            "description": "Redis list, admitted into the stream engram:{p}:queries (consumer group "
            "engram-queries); request/reply like commands.",
            "parameters": _PARTITION,
            "messages": refs("query"),
        },
        "replies": {
            "address": "{reply_to}",
            "description": "Redis Pub/Sub channel chosen by the requester; one reply per request, matched by "
            "correlation_id, in the request's format (a JSON envelope answers a JSON envelope).",
            "parameters": {"reply_to": {"description": "the requester's reply channel"}},
            "messages": refs("reply"),
        },
        "log": {
            "address": "engram:{p}:log",
            "description": "Redis stream: the partition's event log, in commit order (each note's versions in "
            "order), never trimmed. Entry fields: e (the event JSON, its content fields sealed as enc1:...) and u "
            "(the user id). Subscribe with a consumer group of your own on every partition: XGROUP CREATE "
            "engram:{p}:log <group> 0 MKSTREAM (0: from the start; $: new events only), XREADGROUP with >, XACK "
            "once processed, XAUTOCLAIM for what a dead consumer left pending; a restarted consumer reads its own "
            "pending entries first (XREADGROUP with 0). Delivery is at least once: make processing idempotent by "
            "note_id and version. In Python: EngramClient.events(group, ...) (typed deliveries, content opened "
            "with the master key), or FastStream's StreamSub (examples/subscriber.py). " + ERASURE_CONTRACT,
            "parameters": _PARTITION,
            "messages": refs("event"),
        },
        "deadLetters": {
            "address": "engram:{p}:commands:dead",
            "description": "Requests that failed ENGRAM_MAX_DELIVERIES times, kept for an operator.",
            "parameters": _PARTITION,
            "messages": refs("command"),
        },
    }


def _operations() -> dict[str, Any]:
    return {
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
        "followLog": {
            "action": "receive",
            "channel": {"$ref": "#/channels/log"},
            "summary": "Subscribe to memory events with a consumer group of your own; ack after processing.",
            "description": ERASURE_CONTRACT,
        },
    }
