"""``SessionLimits``: what one bearer token may hold of the MCP server over HTTP.

The SDK bounds the sessions of the whole server (past its limit every caller is refused), so one
token opening sessions in a loop locked every other user out, and a revoked token's open sessions
and event streams lived on until they went idle. Here each token may hold ``per_token`` open
sessions (the gateway's, per user it names: it speaks for all of them); one more is refused 429
in plain words. And every ``check_seconds`` the tokens holding sessions are verified again: the
sessions of one revoked or expired since are ended, their event streams closed.

A request opening a session takes its place before the SDK sees it (the check and the taking
have no await between them, so concurrent requests cannot all pass one check), and gives it
back when the SDK has answered: by then the session, if one was opened, is counted as open.

The SDK keeps its sessions in its session manager, which it does not expose: ``_sessions_of``
reaches in, and fails loudly (the tests run it) if an SDK release moves them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from mcp.server.auth.provider import TokenVerifier

from engram_ledger.services.common.periodic import every

log = logging.getLogger("engram.mcp")

MCP_SESSION_HEADER = "mcp-session-id"


def _sessions_of(server: Any) -> Any:
    manager = getattr(server, "_session_manager", None)
    if manager is None or not hasattr(manager, "_server_instances") or not hasattr(manager, "_discard_session"):
        raise RuntimeError("this MCP SDK keeps its HTTP sessions elsewhere: SessionLimits cannot bound them")
    return manager


class SessionLimits:
    def __init__(self, verifier: TokenVerifier, per_token: int = 16, check_seconds: float = 5.0) -> None:
        self._verifier = verifier
        self.per_token = per_token
        self.check_seconds = check_seconds
        self._server: Any = None
        # Open session -> (who holds it, the token it was opened with).
        self._holders: dict[str, tuple[str, str]] = {}
        # Holder -> requests let through to open a session that the SDK has not answered yet.
        self._opening: dict[str, int] = {}

    def attach(self, server: Any) -> None:
        """The server whose HTTP app is built (``Server.streamable_http_app``)."""
        _sessions_of(server)
        self._server = server

    def _open(self) -> dict[str, Any]:
        instances: dict[str, Any] = _sessions_of(self._server)._server_instances
        for gone in [s for s in self._holders if s not in instances]:  # ended by the client or idleness
            del self._holders[gone]
        return instances

    def held_by(self, holder: str) -> int:
        """The sessions ``holder`` has open, and those it is opening."""
        self._open()
        return self._opening.get(holder, 0) + sum(1 for who, _ in self._holders.values() if who == holder)

    def _take_place(self, holder: str) -> bool:
        if self.held_by(holder) >= self.per_token:
            return False
        self._opening[holder] = self._opening.get(holder, 0) + 1
        return True

    def _give_back(self, holder: str) -> None:
        left = self._opening.pop(holder) - 1
        if left:
            self._opening[holder] = left

    def guard(self, app: Any, holder_of: Callable[[Any], str | None]) -> Any:
        """ASGI before the SDK's route: a request opening a session (no session id) is refused
        when its holder (``holder_of(scope)``: None for an unauthenticated request, which the SDK
        answers 401) holds ``per_token`` already; the session it opens is recorded."""

        async def guarded(scope: Any, receive: Any, send: Any) -> None:
            holder = holder_of(scope) if scope["type"] == "http" else None
            resuming = any(k.lower() == MCP_SESSION_HEADER.encode() for k, _ in scope.get("headers", []))
            if holder is None or resuming:
                await app(scope, receive, send)
            elif self._take_place(holder):
                await self._opening_session(app, holder, scope, receive, send)
            else:
                await self._refuse(holder, scope, receive, send)

        return guarded

    async def _opening_session(self, app: Any, holder: str, scope: Any, receive: Any, send: Any) -> None:
        """The SDK answers a request for which ``holder``'s place is taken; the place is given back
        as its answer starts (the session it names, if any, is recorded at that moment), or when
        the SDK ends without an answer."""
        token = scope["user"].access_token.token
        placed = True

        async def recording(message: Any) -> None:
            nonlocal placed
            if message["type"] == "http.response.start" and placed:
                for key, value in message.get("headers", []):
                    if key.lower() == MCP_SESSION_HEADER.encode():
                        self._holders[value.decode("latin-1")] = (holder, token)
                placed = False
                self._give_back(holder)
            await send(message)

        try:
            await app(scope, receive, recording)
        finally:
            if placed:
                self._give_back(holder)

    async def _refuse(self, holder: str, scope: Any, receive: Any, send: Any) -> None:
        from starlette.responses import JSONResponse

        message = (
            f"this token already holds {self.held_by(holder)} open sessions, its limit: end one (DELETE with its "
            f"{MCP_SESSION_HEADER}) or let one go idle, then open another"
        )
        reply = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}
        await JSONResponse(reply, status_code=429, headers={"Retry-After": "5"})(scope, receive, send)

    async def end_revoked(self) -> int:
        """End the sessions of every token no longer valid (revoked, expired); how many ended."""
        self._open()
        tokens = {token for _, token in self._holders.values()}
        now = time.time()
        dead = set()
        for token in tokens:
            found = await self._verifier.verify_token(token)
            if found is None or (found.expires_at is not None and found.expires_at <= now):
                dead.add(token)
        if not dead:
            return 0
        manager = _sessions_of(self._server)
        ended = 0
        for session_id, (_, token) in list(self._holders.items()):
            transport = manager._server_instances.get(session_id)
            if token in dead and transport is not None:
                await manager._discard_session(session_id, transport)
                del self._holders[session_id]
                ended += 1
        log.info("ended %d MCP session(s) of %d token(s) no longer valid", ended, len(dead))
        return ended

    async def run(self, stop: asyncio.Event) -> None:
        await every(self.check_seconds, stop, self.end_revoked, "checking the MCP sessions' tokens", log)
