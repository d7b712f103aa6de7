"""Replies in the request's own format, and typed errors for malformed JSON envelopes.

FastStream reads two formats from a stream entry's ``__data__`` field: its binary framing
(``BinaryMessageFormatV1``, what ``services/bus/requester.py`` sends) and the JSON envelope
``{"data": "<JSON body>", "headers": {"reply_to": ..., "correlation_id": ...}}`` that any
language can write. But it answers in one format per subscriber, the binary one by default, so a
client that can only read JSON got a reply starting with binary header bytes. Two FastStream
hooks fix that without touching its internals:

- ``EnvelopeFormat``, the subscribers' ``message_format``: parses as FastStream does, and when a
  JSON envelope names a ``reply_to`` but is otherwise malformed (``data`` missing or not a
  string, a header that is not a string), it keeps ``reply_to`` and ``correlation_id`` and marks
  the problem in a header. FastStream's own parser would drop the headers of such an envelope,
  and the caller would wait for a reply that never comes.
- ``ReplyInKind``, a broker middleware: answers a marked request with a typed
  ``INVALID_PARAMETER`` error without running the handler, and publishes the reply to a JSON
  request in ``JSONEnvelopeFormat``: the same envelope, ``{"data": "<JSON reply>", "headers":
  {"correlation_id": ...}}``. A binary request keeps its binary reply.

The format is read from the entry itself, so a request the reclaimer re-queues (its copy keeps
``__data__``) is answered in the format it was sent in.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
from faststream import BaseMiddleware
from faststream.redis.message import bDATA_KEY
from faststream.redis.parser import BinaryMessageFormatV1, MessageFormat
from faststream.redis.response import RedisPublishCommand
from faststream.response.publish_type import PublishType

from engram_ledger.contracts.errors import ErrorCode, ErrorReply

if TYPE_CHECKING:
    from fast_depends.library.serializer import SerializerProto
    from faststream._internal.basic_types import SendableMessage
    from faststream._internal.parser import CodecProto
    from faststream.message import StreamMessage

# Set by ``EnvelopeFormat.parse`` only: the same name sent by a client is dropped on parsing.
ENVELOPE_ERROR = "x-engram-envelope-error"

_JSON_TYPES: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def is_binary(data: bytes) -> bool:
    """Whether a ``__data__`` value is in FastStream's binary framing (else JSON, or raw)."""
    return data.startswith(BinaryMessageFormatV1.IDENTITY_HEADER)


def _kind(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _envelope_problem(envelope: dict[str, Any], headers: dict[str, Any]) -> str | None:
    """What makes an envelope that names a ``reply_to`` unusable, in words; None if nothing."""
    if "data" not in envelope:
        return (
            "the request envelope has no `data`: put the JSON body there, as a string "
            "(JSON text: JSON.stringify(body), json.dumps(body))"
        )
    data = envelope["data"]
    if not isinstance(data, str):
        return (
            f"the request envelope's `data` must be a string holding the JSON body, not {_kind(data)}: "
            "send the body as JSON text (JSON.stringify(body), json.dumps(body))"
        )
    for name, value in headers.items():
        if not isinstance(value, str):
            return f"the request envelope's header `{name}` must be a string, not {_kind(value)}"
    return None


class EnvelopeFormat(BinaryMessageFormatV1):
    """FastStream's binary format and JSON envelope, read as FastStream reads them, except that a
    malformed envelope naming a ``reply_to`` is kept answerable (see the module's docstring).
    Encodes in the binary format; ``ReplyInKind`` picks ``JSONEnvelopeFormat`` for JSON requests."""

    __slots__ = ()

    @classmethod
    def parse(cls, data: bytes) -> tuple[bytes, dict[str, Any]]:
        try:
            return cls._parse(data)
        except (RecursionError, ValueError) as e:
            # JSON nested past msgspec's depth limit, text that is not UTF-8: FastStream's own
            # parsing raises too, and the request would sit pending until it is dead-lettered.
            return _unreadable(data, e)

    @classmethod
    def _parse(cls, data: bytes) -> tuple[bytes, dict[str, Any]]:
        if not is_binary(data):
            answerable = cls._parse_answerable_json(data)
            if answerable is not None:
                return answerable
        body, headers = super().parse(data)
        if not isinstance(headers, dict):
            # FastStream passes an envelope's "headers" on as they are; anything but an object
            # breaks its message parser on every delivery, until the request is dead-lettered.
            headers = {}
        headers.pop(ENVELOPE_ERROR, None)
        if not isinstance(headers.get("reply_to", ""), str):
            headers.pop("reply_to")  # names no channel: nowhere to answer
        return body, headers

    @classmethod
    def _parse_answerable_json(cls, data: bytes) -> tuple[bytes, dict[str, Any]] | None:
        """The body and headers of a JSON envelope with a ``reply_to``; None for anything else
        (not JSON, not an object, no reply_to), which FastStream's own parsing handles."""
        try:
            envelope = msgspec.json.decode(data)
        except msgspec.DecodeError:
            return None
        if not isinstance(envelope, dict):
            return None
        headers = envelope.get("headers")
        if not isinstance(headers, dict):
            return None
        reply_to = headers.get("reply_to")
        if not isinstance(reply_to, str) or not reply_to:
            return None
        headers.pop(ENVELOPE_ERROR, None)
        problem = _envelope_problem(envelope, headers)
        if problem is None:
            return envelope["data"].encode(), headers
        answer: dict[str, Any] = {"reply_to": reply_to, ENVELOPE_ERROR: problem}
        if "correlation_id" in headers:
            # Echoed as sent, even when it is not a string, so that the caller can match the error.
            answer["correlation_id"] = headers["correlation_id"]
        return b"", answer


# Where a caller that sent an unreadable envelope waits: read off its bytes without parsing them.
_REPLY_TO = re.compile(rb'"reply_to"\s*:\s*"([^"\\]{1,512})"')
_CORRELATION_ID = re.compile(rb'"correlation_id"\s*:\s*"([^"\\]{1,512})"')


def _unreadable(data: bytes, error: Exception) -> tuple[bytes, dict[str, Any]]:
    """A request no parser can read: answered with a typed error on the ``reply_to`` its bytes
    name, if any; with none it is refused all the same (no reply), and taken off the stream."""
    problem = (
        "the request's JSON is nested too deeply"
        if isinstance(error, RecursionError)
        else "the request is not valid UTF-8 JSON"
    )
    reply_to = _REPLY_TO.search(data)
    if reply_to is None:
        return b"", {}
    headers: dict[str, Any] = {"reply_to": reply_to.group(1).decode("utf-8", "replace"), ENVELOPE_ERROR: problem}
    correlation_id = _CORRELATION_ID.search(data)
    if correlation_id is not None:
        headers["correlation_id"] = correlation_id.group(1).decode("utf-8", "replace")
    return b"", headers


class JSONEnvelopeFormat(MessageFormat):
    """The JSON envelope, written the way requests are: ``{"data": "<body as JSON text>",
    "headers": {...}}``, ``data`` a string as in a request, so one parser reads both ways (and
    FastStream's own parser reads it too)."""

    __slots__ = ()

    @classmethod
    async def encode(
        cls,
        *,
        message: SendableMessage | Sequence[SendableMessage],
        reply_to: str | None,
        headers: dict[str, Any] | None,
        correlation_id: str,
        serializer: SerializerProto | None = None,
        codec: CodecProto | None = None,
    ) -> bytes:
        built = await cls.build(
            message=message,
            reply_to=reply_to,
            headers=headers,
            correlation_id=correlation_id,
            serializer=serializer,
            codec=codec,
        )
        return msgspec.json.encode({"data": built.data.decode(), "headers": built.headers})

    @classmethod
    def parse(cls, data: bytes) -> tuple[bytes, dict[str, Any]]:
        return EnvelopeFormat.parse(data)


def _sent_as_json(raw: Any) -> bool:
    """Whether the stream entry under ``raw`` (FastStream's raw message) holds a JSON request."""
    if not isinstance(raw, dict) or raw.get("type") != "stream":
        return False
    fields = raw.get("data")
    value = fields.get(bDATA_KEY) if isinstance(fields, dict) else None
    return isinstance(value, bytes) and not is_binary(value)


_error_encoder = msgspec.json.Encoder()


class ReplyInKind(BaseMiddleware):
    """Answers a request in the format it came in, and a malformed envelope with a typed error."""

    async def consume_scope(self, call_next: Callable[[Any], Awaitable[Any]], msg: StreamMessage[Any]) -> Any:
        problem = msg.headers.get(ENVELOPE_ERROR)
        if problem is not None:
            return _error_encoder.encode(ErrorReply(code=ErrorCode.INVALID_PARAMETER, message=str(problem)))
        return await call_next(msg)

    async def publish_scope(self, call_next: Callable[[Any], Awaitable[Any]], cmd: Any) -> Any:
        if isinstance(cmd, RedisPublishCommand) and cmd.publish_type is PublishType.REPLY and _sent_as_json(self.msg):
            cmd.message_format = JSONEnvelopeFormat
        return await call_next(cmd)
