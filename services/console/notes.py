"""A note's page: its timeline of versions, and the request to forget it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.model import VersionView
from engram_ledger.contracts.queries import ForgetReply, GetNote, NoteReply
from engram_ledger.services.console.auth import checked_form
from engram_ledger.services.console.search import LOOKING
from engram_ledger.services.console.web import Console, Pages, int_of, link, note_id_of, text_of, token_of, user_of


def routes(console: Console, pages: Pages) -> list[Route]:
    async def note_page(request: Request) -> Response:
        q = request.query_params
        user = user_of(text_of(q, "u"))
        note_id = note_id_of(text_of(q, "id"))
        after = token_of(q)
        history = await console.bus.history(user, note_id, after=after)
        # A person looking: the note shows its reads and counts none.
        view = (await console.bus.ask(GetNote(user_id=user, note_id=note_id, origin=LOOKING), NoteReply)).note
        await console.log.reached(after)
        pending = next((p for p in console.log.pending(user) if p.note_id == note_id), None)
        return pages.page(
            request,
            "note.html",
            user_id=user,
            section="memories",
            note=view,
            note_status=history.status,
            changes=timeline(history.versions, pending.expires_at if pending else None),
            pending=pending,
            done=text_of(q, "done"),
            reverted_to=int_of(q, "to", None, 1, 10**9),
        )

    async def forget(request: Request) -> Response:
        form = await checked_form(request)
        user = user_of(text_of(form, "u"))
        note_id = note_id_of(text_of(form, "id"))
        # Never ``confirmed``: the console asks twice, as the tools do.
        reply = await console.bus.forget(user, note_ids=[note_id])
        return after_forget("/note", reply, u=user, id=note_id)

    async def revert(request: Request) -> Response:
        """Undo as a new version; refused (``VERSION_CONFLICT``) if the note changed since the
        page showed it."""
        form = await checked_form(request)
        user = user_of(text_of(form, "u"))
        note_id = note_id_of(text_of(form, "id"))
        to_version = int_of(form, "to_version", None, 1, 10**9)
        shown = int_of(form, "version", None, 1, 10**9)
        if to_version is None:
            raise EngramError(ErrorCode.INVALID_PARAMETER, "to_version: give the version to go back to")
        reply = await console.bus.revert(user, note_id, to_version, expected_version=shown)
        page = link("/note", u=user, id=note_id, after=reply.token, done="reverted", to=to_version)
        return RedirectResponse(page, status_code=303)

    return [
        Route("/note", note_page),
        Route("/note/forget", forget, methods=["POST"]),
        Route("/note/revert", revert, methods=["POST"]),
    ]


def after_forget(path: str, reply: ForgetReply, **params: str) -> Response:
    # Post/redirect/get: reloading the page must never send the second, deleting call.
    return RedirectResponse(link(path, **params, after=reply.token, done=reply.status), status_code=303)


@dataclass(frozen=True)
class Change:
    """One version of a note on its timeline, with what it changed since the one before."""

    version: VersionView
    fields: list[tuple[str, str | None, str | None]]
    pending_until: datetime | None = None


def timeline(versions: list[VersionView], pending_until: datetime | None) -> list[Change]:
    """Newest first; each version with the fields it changed (name, before, after)."""
    out: list[Change] = []
    before: VersionView | None = None
    for v in versions:
        changed: list[tuple[str, str | None, str | None]] = []
        if before is not None:
            for name in ("content", "category", "subject", "status", "superseded_by"):
                old, new = getattr(before, name), getattr(v, name)
                if old != new:
                    changed.append((name, None if old is None else str(old), None if new is None else str(new)))
        last_request = v.change == "forget_requested" and v is versions[-1]
        out.append(Change(v, changed, pending_until if last_request else None))
        before = v
    return out[::-1]
