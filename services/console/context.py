"""The memory block page: what an agent would be given, and its text to download."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import FormData, QueryParams
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import MAX_CONTEXT_TOKENS
from engram_ledger.services.console.auth import checked_form
from engram_ledger.services.console.search import LOOKING
from engram_ledger.services.console.web import STATUS_OF, Console, Pages, int_of, text_of, user_of


def routes(console: Console, pages: Pages) -> list[Route]:
    async def _context(form: FormData | QueryParams, user: str) -> Any:
        fmt = text_of(form, "format") or "markdown"
        if fmt not in ("markdown", "xml"):
            raise EngramError(ErrorCode.INVALID_PARAMETER, f"format: {fmt!r} is not markdown or xml")
        budget = int_of(form, "max_tokens", 0, 0, MAX_CONTEXT_TOKENS) or None
        # As `engram context` shows it: a block for a model, naming no tool (none is known here).
        return await console.bus.context(
            user, format=fmt, query=text_of(form, "query"), max_tokens=budget, origin=LOOKING, update_tool=None
        )

    async def context(request: Request) -> Response:
        source: FormData | QueryParams
        if request.method == "GET":
            source = request.query_params
        else:
            source = await checked_form(request)
        user = user_of(text_of(source, "u"))
        form = {"format": text_of(source, "format") or "markdown", "max_tokens": text_of(source, "max_tokens") or "0"}
        try:
            block = await _context(source, user)
        except EngramError as e:
            status = STATUS_OF.get(e.code, 500)
            return pages.page(request, "context.html", status, user_id=user, section="context", form=form, error=e)
        return pages.page(request, "context.html", user_id=user, section="context", form=form, block=block)

    async def context_text(request: Request) -> Response:
        form = await checked_form(request)
        user = user_of(text_of(form, "u"))
        block = await _context(form, user)
        extension = "xml" if text_of(form, "format") == "xml" else "md"
        return Response(
            block.text.encode(),
            media_type="text/plain; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="memory.{extension}"'},
        )

    return [
        Route("/user/context", context, methods=["GET", "POST"]),
        Route("/user/context.txt", context_text, methods=["POST"]),
    ]
