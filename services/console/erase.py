"""Erasing a user: the page that asks for the user's id typed again, then the two calls."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import ACCOUNT
from engram_ledger.services.console.auth import checked_form
from engram_ledger.services.console.notes import after_forget
from engram_ledger.services.console.web import STATUS_OF, Console, Pages, text_of, token_of, user_of


def routes(console: Console, pages: Pages) -> list[Route]:
    async def erase_page(request: Request, user: str, done: str | None, error: EngramError | None = None) -> Response:
        pending = next((p for p in console.log.pending(user) if p.note_id == ACCOUNT), None)
        held = (await console.bus.list_notes(user, include_superseded=True, limit=1)).total
        activity_of = console.log.user(user)
        status = STATUS_OF.get(error.code, 500) if error else 200
        return pages.page(
            request,
            "erase.html",
            status,
            user_id=user,
            section="erase",
            pending=pending,
            receipt=activity_of.receipt if activity_of else None,
            done=done,
            error=error,
            held=held,
        )

    async def erase(request: Request) -> Response:
        if request.method == "GET":
            q = request.query_params
            user = user_of(text_of(q, "u"))
            await console.log.reached(token_of(q))
            return await erase_page(request, user, text_of(q, "done"))
        form = await checked_form(request)
        user = user_of(text_of(form, "u"))
        if text_of(form, "confirm_user") != user:
            typed = EngramError(ErrorCode.INVALID_PARAMETER, "confirm_user: type the user's id exactly to erase it")
            return await erase_page(request, user, None, typed)
        # Never ``confirmed``: two calls, as ``engram forget --all``.
        reply = await console.bus.forget_user(user)
        return after_forget("/user/erase", reply, u=user)

    return [Route("/user/erase", erase, methods=["GET", "POST"])]
