"""Who calls the HTTP API, and how much of it one caller may hold.

The bearer tokens are MCP's (``engram tokens``, ``services/agents/tokens.py``), checked by the
same SDK backend on every request, so a revoked token is refused from its next request on. A
user's token acts as its user only; an operator's token, or a gateway's shared secret, names the
user in ``X-Engram-User``, and only an operator's token may call the operators' routes (whose
path names the user).

One token may have ``requests`` requests in flight and ``streams`` event streams open; one more
is refused 429 with Retry-After at once, before it reaches the bus: a flood from one token waits
on nobody's turn but its own, and another token's requests are still answered (the bus then
shares its workers fairly between the users the admitted requests are for).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.agents.mcp_server import USER_HEADER, session_holder
from engram_ledger.services.agents.tokens import OPERATOR_SCOPE, USER_SCOPE
from engram_ledger.services.application.decoding import check_user_id
from engram_ledger.services.http.errors import Refusal

ASK_FOR_A_TOKEN = {"WWW-Authenticate": 'Bearer realm="engram"'}
REQUESTS_PER_TOKEN = 32
STREAMS_PER_TOKEN = 4


@dataclass(frozen=True)
class Caller:
    """An authenticated request: the user it acts as, and whose share of the front door it takes."""

    user: str
    holder: str
    token: str


def caller(scope: Any, headers: list[str], *, operator_route: bool, path_user: str | None) -> Caller:
    """``headers``: the request's ``X-Engram-User`` values; ``path_user``: the user an
    operator's route names in its path. Raises ``Refusal`` (401, 403) or ``EngramError``."""
    who = scope.get("user")
    if not isinstance(who, AuthenticatedUser):
        raise Refusal(
            401,
            EngramError(
                ErrorCode.PERMISSION_DENIED,
                "a valid bearer token is required: Authorization: Bearer <token> (`engram tokens create`); "
                "this one is missing, unknown, revoked or expired",
            ),
            ASK_FOR_A_TOKEN,
        )
    for value in headers:
        check_user_id(value, USER_HEADER)
    if len(headers) > 1:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"name one user: the request has {len(headers)} {USER_HEADER}")
    holder = session_holder(scope) or ""
    token = who.access_token.token
    if operator_route:
        if OPERATOR_SCOPE not in who.scopes:
            raise Refusal(
                403,
                EngramError(
                    ErrorCode.PERMISSION_DENIED,
                    "this route is an operator's: use an operator token (`engram tokens create --operator`)",
                ),
            )
        assert path_user is not None
        check_user_id(path_user, "the path's user")
        return Caller(path_user, holder, token)
    if USER_SCOPE in who.scopes:
        own = who.access_token.subject or ""
        if headers and headers[0] != own:
            raise Refusal(
                403,
                EngramError(
                    ErrorCode.PERMISSION_DENIED, f"this token acts as user {own!r} only; {USER_HEADER} names another"
                ),
            )
        return Caller(own, holder, token)
    if not headers:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"name the user in the {USER_HEADER} header")
    return Caller(headers[0], holder, token)


class Shares:
    """What each holder has in flight: requests and event streams."""

    def __init__(self, requests: int = REQUESTS_PER_TOKEN, streams: int = STREAMS_PER_TOKEN) -> None:
        self.requests = requests
        self.streams = streams
        self._in_flight: Counter[str] = Counter()
        self._open: Counter[str] = Counter()

    @contextlib.contextmanager
    def request(self, holder: str) -> Iterator[None]:
        with self._taken(self._in_flight, holder, self.requests, "requests in flight"):
            yield

    @contextlib.contextmanager
    def stream(self, holder: str) -> Iterator[None]:
        with self._taken(self._open, holder, self.streams, "event streams open"):
            yield

    @staticmethod
    @contextlib.contextmanager
    def _taken(counts: Counter[str], holder: str, limit: int, what: str) -> Iterator[None]:
        # The check and the taking have no await between them: concurrent requests cannot all pass.
        if counts[holder] >= limit:
            raise EngramError(
                ErrorCode.RATE_LIMITED,
                f"this token has {counts[holder]} {what}, its limit: wait for an answer, then send again",
                retry_after_ms=1000,
            )
        counts[holder] += 1
        try:
            yield
        finally:
            counts[holder] -= 1
            if not counts[holder]:
                del counts[holder]
