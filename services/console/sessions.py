"""Logging in with the console's token, logging out, and the pages of a failed request."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.console.auth import COOKIE, SESSION_SECONDS, Forbidden, checked_form, safe_next
from engram_ledger.services.console.web import Console, Pages


def routes(console: Console, pages: Pages) -> list[Route]:
    async def login(request: Request) -> Response:
        form = await request.form()
        given = form.get("token")
        target = safe_next(form.get("next") if isinstance(form.get("next"), str) else None)  # type: ignore[arg-type]
        if not console.auth.token_ok(given if isinstance(given, str) else None):
            return pages.login(request, "that is not the console's token", 401)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE,
            console.auth.new_session(),
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    async def logout(request: Request) -> Response:
        await checked_form(request)
        console.auth.end_session(request.cookies.get(COOKIE))
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    return [Route("/login", login, methods=["POST"]), Route("/logout", logout, methods=["POST"])]


def error_handlers(pages: Pages) -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    async def on_engram_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, EngramError)
        if "console" not in request.scope:
            return pages.login(request, None)
        return pages.failed(request, exc)

    async def on_forbidden(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Forbidden)
        error = EngramError(ErrorCode.PERMISSION_DENIED, exc.message)
        return pages.failed(request, error)

    return {EngramError: on_engram_error, Forbidden: on_forbidden}
