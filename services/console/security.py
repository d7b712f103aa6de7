"""The console's door: the token check before any route, and the security headers on every response."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram_ledger.contracts.errors import ErrorCode
from engram_ledger.services.console.auth import ConsoleAuth


class RequireToken:
    """ASGI: every request without the console token is answered 401 (a browser gets the login
    form as the body) before any route runs; POST /login alone passes, to present the token.
    Every response gets the security headers (CSP, no framing, no referrer, no caching)."""

    def __init__(
        self,
        app: ASGIApp,
        auth: ConsoleAuth,
        login: Callable[[Request, str | None], Response],
        policy: str,
    ) -> None:
        self.app = app
        self.auth = auth
        self.login = login
        self.policy = policy.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() not in (b"content-security-policy", b"cache-control")
                ]
                headers += [
                    (b"content-security-policy", self.policy),
                    (b"x-frame-options", b"DENY"),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"cache-control", b"no-store"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        who = self.auth.who(scope)
        if who is not None:
            scope["console"] = who
            await self.app(scope, receive, secured)
            return
        request = Request(scope, receive)
        if scope["path"] == "/login" and scope["method"] == "POST":
            await self.app(scope, receive, secured)
            return
        if "text/html" in request.headers.get("accept", ""):
            response = self.login(request, None)
        else:
            response = JSONResponse(
                {
                    "error": {
                        "code": ErrorCode.PERMISSION_DENIED.value,
                        "message": "the console token is required: Authorization: Bearer <token>, or log in",
                    }
                },
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="engram-console"'},
            )
        await response(scope, receive, secured)
