"""Error replies. Every refusal on the bus is an ``ErrorReply`` with one of these codes."""

from __future__ import annotations

import enum

from engram_ledger.contracts.base import Message


class ErrorCode(enum.StrEnum):
    """Stable, documented error codes (requirements §4's vocabulary plus Engram's own)."""

    INVALID_PARAMETER = "INVALID_PARAMETER"
    MEMORY_NOT_FOUND = "MEMORY_NOT_FOUND"
    VERSION_CONFLICT = "VERSION_CONFLICT"
    # A command id already used for a different request: a client bug (a retry must repeat the
    # first request exactly). Nothing is written.
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    STORAGE_ERROR = "STORAGE_ERROR"
    EMBEDDING_ERROR = "EMBEDDING_ERROR"
    TIMEOUT = "TIMEOUT"
    UNAVAILABLE = "UNAVAILABLE"
    # Redis's ACL refused the caller's user what it asked (a role without that stream, key or
    # channel): raised by the client and the CLI, never sent by the service. Retrying cannot help.
    PERMISSION_DENIED = "PERMISSION_DENIED"
    # The service is starting: what the request needs (the embedding model, for a search) is still
    # loading, and was not ready within the caller's wait. Nothing was done; ask again in
    # ``retry_after_ms``.
    STARTING = "STARTING"
    # The caller holds its whole share of the service (requests waiting on a worker, or in flight
    # from one client): nothing was done. Send the same request again after ``retry_after_ms``.
    RATE_LIMITED = "RATE_LIMITED"


class ErrorReply(Message, tag="error", frozen=True, kw_only=True):
    """The request was refused or failed. ``message`` is meant for a human (or an LLM) to read."""

    code: ErrorCode
    message: str
    # With ``RATE_LIMITED``: how long to wait before sending the request again, in milliseconds.
    retry_after_ms: int | None = None


class EngramError(Exception):
    """An ``ErrorReply`` raised as an exception (by the domain, the handlers and the client).

    ``command_id``: set by the client on a command that got no reply in time (``TIMEOUT``) or
    could not be sent (``UNAVAILABLE``): it may still be applied, and sending it again under the
    same id is safe (the first outcome comes back, nothing is written twice)."""

    def __init__(
        self, code: ErrorCode, message: str, *, command_id: str | None = None, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.command_id = command_id
        self.retry_after_ms = retry_after_ms

    def reply(self) -> ErrorReply:
        return ErrorReply(code=self.code, message=self.message, retry_after_ms=self.retry_after_ms)

    @classmethod
    def from_reply(cls, reply: ErrorReply) -> EngramError:
        return cls(reply.code, reply.message, retry_after_ms=reply.retry_after_ms)
