"""FastStream's binary message format (``BinaryMessageFormatV1``, FastStream 0.7), written and read
without importing FastStream.

A client only frames request bodies and reads replies; importing FastStream for that costs a
command-line call about a third of its time (its package pulls in the broker, pydantic and the
AsyncAPI machinery). These two functions write the same bytes as FastStream's ``encode`` for a
bytes body and read what its ``parse`` reads; ``tests/unit/test_wire.py`` holds them to FastStream
itself. The service's subscribers still use FastStream's own.

A frame: the identity header, the version (2 bytes), where the headers start and where the data
starts (4 bytes each, big-endian), the header count (2 bytes), each header as a length-prefixed
key and value (2-byte lengths), then the body."""

from __future__ import annotations

import json
from struct import error as StructError
from struct import pack, unpack_from
from typing import Any

IDENTITY = b"\x89BIN\x0d\x0a\x1a\x0a"
VERSION = 1
_PREFIX = len(IDENTITY) + 2 + 4 + 4  # identity, version, headers start, data start


def encode(body: bytes, *, reply_to: str | None, headers: dict[str, str], correlation_id: str) -> bytes:
    """``body`` framed as FastStream frames a bytes message: ``correlation_id`` first, then
    ``reply_to`` if any, then ``headers``."""
    every = {"correlation_id": correlation_id, **({"reply_to": reply_to} if reply_to else {}), **headers}
    framed = bytearray()
    for key, value in every.items():
        for text in (key.encode(), str(value).encode()):
            framed += pack(">H", len(text)) + text
    data_start = _PREFIX + 2 + len(framed)
    return b"".join((IDENTITY, pack(">HII", VERSION, _PREFIX, data_start), pack(">H", len(every)), bytes(framed), body))


def parse(data: bytes) -> tuple[bytes, dict[str, Any]]:
    """The body and headers of a message: a binary frame, else a JSON envelope (``{"data":
    "...", "headers": {...}}``), else the raw bytes with no headers, as FastStream reads them."""
    if data.startswith(IDENTITY):
        try:
            return _frame(data)
        except (StructError, ValueError):  # a frame cut short, or not one after all
            pass
    try:
        envelope = json.loads(data)
        return envelope["data"].encode(), dict(envelope.get("headers", {}))
    except Exception:
        return data, {}


def _frame(data: bytes) -> tuple[bytes, dict[str, Any]]:
    version, headers_start, data_start = unpack_from(">HII", data, len(IDENTITY))
    if version != VERSION:
        raise ValueError(f"frame version {version}")
    (count,) = unpack_from(">H", data, headers_start)
    at = headers_start + 2
    headers: dict[str, Any] = {}
    for _ in range(count):
        key, at = _text(data, at)
        headers[key], at = _text(data, at)
    return data[data_start:], headers


def _text(data: bytes, at: int) -> tuple[str, int]:
    (length,) = unpack_from(">H", data, at)
    end = at + 2 + length
    if end > len(data):
        raise ValueError("a header runs past the frame")
    return data[at + 2 : end].decode(), end
