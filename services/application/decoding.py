"""Requests off the bus: bytes to a contract, or a typed INVALID_PARAMETER refusal."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from contracts.errors import EngramError, ErrorCode
from contracts.limits import MAX_MESSAGE_BYTES

T = TypeVar("T")


def refuse_oversized(body: bytes) -> None:
    if len(body) > MAX_MESSAGE_BYTES:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER, f"message of {len(body):,} bytes: the limit is {MAX_MESSAGE_BYTES:,}"
        )


def decode_request(body: bytes, decoder: msgspec.json.Decoder[T], what: str) -> T:
    """``what`` names the request kind in the refusal ("command", "query")."""
    refuse_oversized(body)
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"invalid {what}: {e}") from None
    except msgspec.DecodeError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"malformed JSON: {e}") from None
