"""The users page (who has memories, found by id) and one user's memories with their activity."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engram_ledger.contracts.errors import EngramError
from engram_ledger.contracts.events import ACCOUNT
from engram_ledger.contracts.model import NoteKind, NoteView
from engram_ledger.services.console.web import (
    PAGE,
    Console,
    Pages,
    flag_of,
    int_of,
    moment_of,
    text_of,
    token_of,
    user_of,
)


class _UserPages:
    """The pages of the users and of one user's memories (each a route)."""

    def __init__(self, console: Console, pages: Pages) -> None:
        self.console = console
        self.pages = pages

    async def home(self, request: Request) -> Response:
        q = request.query_params
        find = text_of(q, "q") or ""
        offset = int_of(q, "offset", 0, 0, 10**9) or 0
        users, total = self.console.log.users(find, offset, PAGE)
        exact = None
        if find and not total:
            with contextlib.suppress(EngramError):
                exact = user_of(find)
        return self.pages.page(
            request,
            "users.html",
            users=users,
            total=total,
            find=find,
            offset=offset,
            page_size=PAGE,
            exact=exact,
            watch=self.console.log,
        )

    async def user_page(self, request: Request) -> Response:
        q = request.query_params
        user = user_of(text_of(q, "u"))
        category = text_of(q, "category")
        superseded = flag_of(q, "superseded")
        offset = int_of(q, "offset", 0, 0, 10**9) or 0
        after = token_of(q)
        as_of = moment_of(q, "as_of")
        listed = await self.console.bus.list_notes(
            user, category=category, include_superseded=superseded, offset=offset, limit=PAGE, after=after, as_of=as_of
        )
        categories = (await self.console.bus.list_categories(user)).categories
        await self.console.log.reached(after)
        return self.pages.page(
            request,
            "user.html",
            user_id=user,
            section="memories",
            groups=grouped(listed.notes),
            shown=len(listed.notes),
            total=listed.total,
            offset=offset,
            page_size=PAGE,
            category=category,
            categories=categories,
            superseded=superseded,
            as_of=as_of,
            activity=self.console.log.user(user),
            chart=self.console.log.chart(user),
            pending=self.console.log.pending(user),
            account=ACCOUNT,
        )

    async def changes(self, request: Request) -> Response:
        """What changed in the user's notes between two moments (by default, the last day)."""
        q = request.query_params
        user = user_of(text_of(q, "u"))
        since = moment_of(q, "since") or (datetime.now(UTC) - timedelta(days=1)).replace(microsecond=0).isoformat()
        until = moment_of(q, "until")
        diff = await self.console.bus.diff(user, since, until, after=token_of(q))
        return self.pages.page(
            request,
            "changes.html",
            user_id=user,
            section="memories",
            since=since,
            until=until,
            changes=diff.changes,
            truncated=diff.truncated,
        )

    async def recalls(self, request: Request) -> Response:
        """What searches and memory blocks showed the user's agents (where recalls are audited),
        newest first; ``session``: one conversation's."""
        q = request.query_params
        user = user_of(text_of(q, "u"))
        session = text_of(q, "session")
        reply = await self.console.bus.recalls(user, session_id=session, limit=PAGE, after=token_of(q))
        return self.pages.page(
            request, "recalls.html", user_id=user, section="memories", session=session, recalls=reply.recalls
        )

    async def activity(self, request: Request) -> Response:
        q = request.query_params
        user = user_of(text_of(q, "u"))
        await self.console.log.reached(token_of(q))
        return self.pages.page(request, "_chart.html", user_id=user, chart=self.console.log.chart(user))


def routes(console: Console, pages: Pages) -> list[Route]:
    user = _UserPages(console, pages)
    return [
        Route("/", user.home),
        Route("/user", user.user_page),
        Route("/user/changes", user.changes),
        Route("/user/recalls", user.recalls),
        Route("/user/activity", user.activity),
    ]


def grouped(notes: list[NoteView]) -> list[tuple[str, list[tuple[str, list[NoteView]]]]]:
    """A page of the listing (already in category order) by category, then by kind."""
    by_category: dict[str, dict[str, list[NoteView]]] = {}
    for note in notes:
        by_category.setdefault(note.category, {}).setdefault(note.kind.value, []).append(note)
    order = [k.value for k in NoteKind]
    return [
        (category, [(kind, kinds[kind]) for kind in order if kind in kinds]) for category, kinds in by_category.items()
    ]
