"""Error replies. Every refusal on the bus is an ``ErrorReply`` with one of these codes."""

from __future__ import annotations

import enum

from contracts.base import Message


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


class ErrorReply(Message, tag="error", frozen=True, kw_only=True):
    """The request was refused or failed. ``message`` is meant for a human (or an LLM) to read."""

    code: ErrorCode
    message: str


class EngramError(Exception):
    """An ``ErrorReply`` raised as an exception (by the domain, the handlers and the client)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message

    def reply(self) -> ErrorReply:
        return ErrorReply(code=self.code, message=self.message)

    @classmethod
    def from_reply(cls, reply: ErrorReply) -> EngramError:
        return cls(reply.code, reply.message)
