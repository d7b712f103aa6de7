"""The HTTP API's refusals: each contract error code as an HTTP status, with one JSON body,
``{"error": <the bus's ErrorReply>}``: ``error.code`` and ``error.message`` as MCP's tools and
the console answer them, and the rest of the bus's reply beside (``retry_after_ms``)."""

from __future__ import annotations

import math

import msgspec
from starlette.responses import Response

from engram_ledger.contracts.errors import EngramError, ErrorCode, ErrorReply

STATUS_OF: dict[ErrorCode, int] = {
    ErrorCode.INVALID_PARAMETER: 400,
    # The front door's own refusals of a credential say 401 or 403 themselves (``Refusal``).
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.MEMORY_NOT_FOUND: 404,
    ErrorCode.VERSION_CONFLICT: 409,
    ErrorCode.IDEMPOTENCY_CONFLICT: 409,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.STORAGE_ERROR: 500,
    ErrorCode.EMBEDDING_ERROR: 500,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.STARTING: 503,
    ErrorCode.TIMEOUT: 504,
}
# Seconds a caller is asked to wait when the refusal itself does not say (Retry-After).
RETRY_AFTER: dict[ErrorCode, int] = {ErrorCode.RATE_LIMITED: 1, ErrorCode.STARTING: 1, ErrorCode.UNAVAILABLE: 5}


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """Every refusal of the HTTP API: ``error`` is the bus's own error reply, whose ``code`` says
    what went wrong (the status follows from it) and whose ``message`` says it in words."""

    error: ErrorReply


class Refusal(Exception):
    """An error answered with a status of its own rather than its code's (401, 413)."""

    def __init__(self, status: int, error: EngramError, headers: dict[str, str] | None = None) -> None:
        super().__init__(error.message)
        self.status = status
        self.error = error
        self.headers = headers or {}


def error_response(error: EngramError, status: int | None = None, headers: dict[str, str] | None = None) -> Response:
    answered = dict(headers or {})
    wait = math.ceil(error.retry_after_ms / 1000) if error.retry_after_ms is not None else RETRY_AFTER.get(error.code)
    if wait is not None:
        answered["Retry-After"] = str(max(1, wait))
    return Response(
        msgspec.json.encode(ErrorBody(error=error.reply())),
        status_code=status or STATUS_OF.get(error.code, 500),
        headers=answered,
        media_type="application/json",
    )


def refused(refusal: Refusal) -> Response:
    return error_response(refusal.error, refusal.status, refusal.headers)
