"""The search page, and its explanation of why a note is or is not among the results."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import SEARCH_TOP_K_DEFAULT, SEARCH_TOP_K_MAX, parse_time
from engram_ledger.contracts.model import NoteKind, NoteStatus, Origin
from engram_ledger.contracts.queries import SearchHit
from engram_ledger.services.application.recalls import CONSOLE
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.config import Settings
from engram_ledger.services.console.auth import checked_form
from engram_ledger.services.console.web import (
    STATUS_OF,
    Console,
    Pages,
    flag_of,
    fraction_of,
    int_of,
    note_id_of,
    text_of,
    user_of,
)
from engram_ledger.services.domain.values import normalize_subject

# The search's explanation of a note not shown looks this deep (the most a search pages to).
EXPLAIN_DEPTH = 100


# The console's searches are a person looking: never recorded as an agent's recall.
LOOKING = Origin(channel=CONSOLE)


def routes(console: Console, pages: Pages) -> list[Route]:
    async def search(request: Request) -> Response:
        if request.method == "GET":
            user = user_of(text_of(request.query_params, "u"))
            return pages.page(request, "search.html", user_id=user, section="search", asked=None, form={})
        form = await checked_form(request)
        user = user_of(text_of(form, "u"))
        asked: dict[str, Any] = {}
        try:
            query = text_of(form, "query")
            if query is None:
                raise EngramError(ErrorCode.INVALID_PARAMETER, "query: give the words to search for")
            kind = text_of(form, "kind")
            if kind is not None and kind not in {k.value for k in NoteKind}:
                raise EngramError(ErrorCode.INVALID_PARAMETER, f"kind: {kind!r} is not one of fact, episode, procedure")
            since, until = text_of(form, "since"), text_of(form, "until")
            ranking = text_of(form, "ranking") or "relevance"
            if ranking not in ("relevance", "blended"):
                raise EngramError(ErrorCode.INVALID_PARAMETER, f"ranking: {ranking!r} is not relevance or blended")
            asked = {
                "top_k": int_of(form, "top_k", SEARCH_TOP_K_DEFAULT, 1, SEARCH_TOP_K_MAX),
                "category": text_of(form, "category"),
                "kind": NoteKind(kind) if kind else None,
                "subject": text_of(form, "subject"),
                "include_superseded": flag_of(form, "include_superseded"),
                "include_conversation": flag_of(form, "include_conversation"),
                "since": parse_time(since) if since else None,
                "until": parse_time(until) if until else None,
                "ranking": ranking,
                "min_relevance": fraction_of(form, "min_relevance"),
            }
            reply = await console.bus.search(user, query, origin=LOOKING, **asked)
            explain_id = text_of(form, "explain")
            explained = None
            if explain_id:
                explained = await explain(console.bus, user, query, asked, reply.results, note_id_of(explain_id))
        except EngramError as e:
            return pages.page(
                request,
                "search.html",
                STATUS_OF.get(e.code, 500),
                user_id=user,
                section="search",
                form=form,
                asked=None,
                error=e,
            )
        return pages.page(
            request,
            "search.html",
            user_id=user,
            section="search",
            form=form,
            asked=asked,
            query=query,
            hits=reply.results,
            best=best_score(reply.results),
            best_keyword=max([h.keyword for h in reply.results], default=0.0),
            explained=explained,
        )

    return [Route("/user/search", search, methods=["GET", "POST"])]


async def explain(
    bus: EngramClient, user: str, query: str, asked: dict[str, Any], hits: list[SearchHit], note_id: str
) -> list[str]:
    """Why ``note_id`` is, or is not, among what a search showed, in words."""
    for rank, hit in enumerate(hits, start=1):
        if hit.note_id == note_id:
            return [
                f"{note_id} is result #{rank}: relevance {hit.relevance:.2f}, score {hit.score:.3f}, "
                f"cosine {hit.similarity:.3f}, keyword {hit.keyword:.2f}."
            ]
    history = await bus.history(user, note_id)
    latest = history.versions[-1] if history.versions else None
    reasons: list[str] = []
    if history.status == NoteStatus.FORGOTTEN.value:
        return [f"{note_id} was forgotten: its content is gone and no search can find it."]
    if history.status == NoteStatus.SUPERSEDED.value and not asked["include_superseded"]:
        by = latest.superseded_by if latest else None
        reasons.append(f"{note_id} is superseded (by {by}): searches leave it out unless 'include superseded'.")
    if latest is not None and asked["category"] and latest.category != asked["category"]:
        reasons.append(f"its category is {latest.category}; the search asked for {asked['category']}.")
    subject = asked["subject"]
    if latest is not None and subject and normalize_subject(latest.subject or "") != normalize_subject(subject):
        reasons.append("its subject is not the one the search asked for.")
    if reasons:
        return reasons
    # The same search with the floor off, page by page with the page size asked (a search's
    # candidates are sized by its page, so another size is another ranking): a note below the
    # floor is still ranked, and the explanation says which it is.
    floor = asked["min_relevance"] if asked["min_relevance"] is not None else Settings.from_env().min_relevance
    size = asked["top_k"]
    for offset in range(0, EXPLAIN_DEPTH, size):
        page_of = await bus.search(user, query, offset=offset, origin=LOOKING, **{**asked, "min_relevance": 0.0})
        for rank, hit in enumerate(page_of.results, start=offset + 1):
            if hit.note_id == note_id:
                below = (
                    f"its relevance is below the floor ({floor:g})"
                    if hit.relevance < floor
                    else f"below the {asked['top_k']} shown"
                )
                return [
                    f"{note_id} ranks #{rank} (relevance {hit.relevance:.2f}, score {hit.score:.3f}, "
                    f"cosine {hit.similarity:.3f}, keyword {hit.keyword:.2f}): {below}."
                ]
        if len(page_of.results) < size:
            break
    if asked["kind"] is not None:
        return [f"{note_id} is not a {asked['kind'].value}, or is not among the {EXPLAIN_DEPTH} best matches."]
    return [
        f"{note_id} is not among the {EXPLAIN_DEPTH} best matches: it shares no rare word with the query "
        "and its meaning is farther than the candidates' (each signal keeps its 50 best)."
    ]


def best_score(hits: list[SearchHit]) -> float:
    return max([h.score for h in hits] + [1.0])
