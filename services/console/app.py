"""The memory console: a Starlette app that shows a person what an agent remembers, through
``EngramClient`` (the bus) for everything about memories and the public event log for what no
query answers (users, activity, pending deletions). See README, "Memory console".

Memory content never goes into a URL (searches, memory blocks and forms are POSTed) nor into a
log line (no access log; the console logs its own failures only, never what a page showed).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.datastructures import FormData, QueryParams
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import ACCOUNT
from engram_ledger.contracts.limits import (
    MAX_CONTEXT_TOKENS,
    SEARCH_TOP_K_DEFAULT,
    SEARCH_TOP_K_MAX,
    parse_time,
)
from engram_ledger.contracts.model import NoteKind, NoteStatus, NoteView, VersionView
from engram_ledger.contracts.queries import ForgetReply, SearchHit
from engram_ledger.services.application.decoding import check_user_id
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.bus.subscription import Subscription
from engram_ledger.services.console.auth import (
    COOKIE,
    SESSION_SECONDS,
    ConsoleAuth,
    Forbidden,
    Who,
    checked_form,
    safe_next,
)
from engram_ledger.services.console.live import LogEvent, LogWatch
from engram_ledger.services.ops.listening import check_port, http_url

log = logging.getLogger("engram.console")

HERE = Path(__file__).resolve().parent
PAGE = 50
# Open event streams at once: each holds a Redis connection of its own.
MAX_STREAMS = 16
# The search's explanation of a note not shown looks this deep (the most a search pages to).
EXPLAIN_DEPTH = 100
STATUS_OF = {
    ErrorCode.INVALID_PARAMETER: 400,
    ErrorCode.MEMORY_NOT_FOUND: 404,
    ErrorCode.VERSION_CONFLICT: 409,
    ErrorCode.IDEMPOTENCY_CONFLICT: 409,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.UNAVAILABLE: 503,
}
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class Console:
    """What every request shares."""

    url: str
    auth: ConsoleAuth
    cluster: bool = False
    timeout: float = 10.0
    max_streams: int = MAX_STREAMS
    client: EngramClient | None = None
    watch: LogWatch | None = None
    streams: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_STREAMS))

    @property
    def bus(self) -> EngramClient:
        assert self.client is not None, "the console's client is opened by the app's lifespan"
        return self.client

    @property
    def log(self) -> LogWatch:
        assert self.watch is not None, "the console's log watch is opened by the app's lifespan"
        return self.watch


# Requests ---------------------------------------------------------------------------------------


def _user(value: str | None, name: str = "u") -> str:
    if not value:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{name}: give a user id")
    check_user_id(value, name)
    return value


def _note_id(value: str | None) -> str:
    if not value or not value.isalnum() or len(value) != 8 or not value.isascii():
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"id: {value!r} is not a note id (8 letters or digits)")
    return value


def _int(source: QueryParams | FormData, name: str, default: int | None, low: int, high: int) -> int | None:
    raw = source.get(name)
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        return default
    if not isinstance(raw, str):
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{name}: expected a number, not a file")
    try:
        value = int(raw)
    except ValueError:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{name}: {raw[:40]!r} is not a whole number") from None
    if not low <= value <= high:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{name}: {value} is out of range ({low}-{high})")
    return value


def _text(source: QueryParams | FormData, name: str) -> str | None:
    raw = source.get(name)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{name}: expected text, not a file")
    return raw.strip() or None


def _flag(source: QueryParams | FormData, name: str) -> bool:
    return source.get(name) in ("1", "on", "true")


def _token(source: QueryParams | FormData) -> str | None:
    after = _text(source, "after")
    if after is not None:
        try:
            channels.parse_token(after)
        except ValueError:
            raise EngramError(ErrorCode.INVALID_PARAMETER, f"after: {after!r} is not a consistency token") from None
    return after


def _link(path: str, **params: Any) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "", False)}
    return f"{path}?{urlencode(kept)}" if kept else path


# Views ------------------------------------------------------------------------------------------


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


def grouped(notes: list[NoteView]) -> list[tuple[str, list[tuple[str, list[NoteView]]]]]:
    """A page of the listing (already in category order) by category, then by kind."""
    by_category: dict[str, dict[str, list[NoteView]]] = {}
    for note in notes:
        by_category.setdefault(note.category, {}).setdefault(note.kind.value, []).append(note)
    order = [k.value for k in NoteKind]
    return [
        (category, [(kind, kinds[kind]) for kind in order if kind in kinds]) for category, kinds in by_category.items()
    ]


def _best_score(hits: list[SearchHit]) -> float:
    return max([h.score for h in hits] + [1.0])


def _ago(moment: datetime | None) -> str:
    if moment is None:
        return ""
    seconds = (datetime.now(UTC) - moment).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    for size, unit in ((86_400, "d"), (3_600, "h"), (60, "min")):
        if seconds >= size:
            # A deadline is not met early: 4 min 59 s from now reads "in 5 min".
            amount = f"{math.ceil(seconds / size) if future else int(seconds // size)} {unit}"
            break
    else:
        amount = f"{int(seconds)} s"
    return f"in {amount}" if future else f"{amount} ago"


def _when(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "–"


# The app ----------------------------------------------------------------------------------------


def create_app(
    url: str, token: str, *, cluster: bool = False, timeout: float = 10.0, max_streams: int = MAX_STREAMS
) -> Starlette:
    """The console for the Engram bus at ``url``, opened to whoever holds ``token``."""
    console = Console(url, ConsoleAuth(token), cluster, timeout, max_streams, streams=asyncio.Semaphore(max_streams))
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.filters["when"] = _when
    env.filters["ago"] = _ago
    env.globals["link"] = _link
    env.globals["kinds"] = [k.value for k in NoteKind]
    env.globals["top_k_max"] = SEARCH_TOP_K_MAX
    env.globals["max_context_tokens"] = MAX_CONTEXT_TOKENS
    login_css = (HERE / "static" / "console.css").read_text()
    env.globals["login_css"] = login_css
    css_hash = base64.b64encode(hashlib.sha256(login_css.encode()).digest()).decode()
    policy = (
        "default-src 'self'; script-src 'self'; "
        f"style-src 'self' 'sha256-{css_hash}'; img-src 'self' data:; connect-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"
    )

    def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        who: Who = request.scope["console"]
        return templates.TemplateResponse(request, name, {"csrf": who.csrf, **context}, status_code=status)

    def failed(request: Request, error: EngramError, **context: Any) -> Response:
        return page(request, "error.html", STATUS_OF.get(error.code, 500), error=error, **context)

    # users ------------------------------------------------------------------------------------

    async def home(request: Request) -> Response:
        q = request.query_params
        find = _text(q, "q") or ""
        offset = _int(q, "offset", 0, 0, 10**9) or 0
        users, total = console.log.users(find, offset, PAGE)
        exact = None
        if find and not total:
            with contextlib.suppress(EngramError):
                exact = _user(find)
        return page(
            request,
            "users.html",
            users=users,
            total=total,
            find=find,
            offset=offset,
            page_size=PAGE,
            exact=exact,
            watch=console.log,
        )

    async def user_page(request: Request) -> Response:
        q = request.query_params
        user = _user(_text(q, "u"))
        category = _text(q, "category")
        superseded = _flag(q, "superseded")
        offset = _int(q, "offset", 0, 0, 10**9) or 0
        after = _token(q)
        listed = await console.bus.list_notes(
            user, category=category, include_superseded=superseded, offset=offset, limit=PAGE, after=after
        )
        categories = (await console.bus.list_categories(user)).categories
        await console.log.reached(after)
        return page(
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
            activity=console.log.user(user),
            chart=console.log.chart(user),
            pending=console.log.pending(user),
            account=ACCOUNT,
        )

    async def activity(request: Request) -> Response:
        q = request.query_params
        user = _user(_text(q, "u"))
        await console.log.reached(_token(q))
        return page(request, "_chart.html", user_id=user, chart=console.log.chart(user))

    # search -----------------------------------------------------------------------------------

    async def search(request: Request) -> Response:
        if request.method == "GET":
            user = _user(_text(request.query_params, "u"))
            return page(request, "search.html", user_id=user, section="search", asked=None, form={})
        form = await checked_form(request)
        user = _user(_text(form, "u"))
        asked: dict[str, Any] = {}
        try:
            query = _text(form, "query")
            if query is None:
                raise EngramError(ErrorCode.INVALID_PARAMETER, "query: give the words to search for")
            kind = _text(form, "kind")
            if kind is not None and kind not in {k.value for k in NoteKind}:
                raise EngramError(ErrorCode.INVALID_PARAMETER, f"kind: {kind!r} is not one of fact, episode, procedure")
            since, until = _text(form, "since"), _text(form, "until")
            ranking = _text(form, "ranking") or "relevance"
            if ranking not in ("relevance", "blended"):
                raise EngramError(ErrorCode.INVALID_PARAMETER, f"ranking: {ranking!r} is not relevance or blended")
            asked = {
                "top_k": _int(form, "top_k", SEARCH_TOP_K_DEFAULT, 1, SEARCH_TOP_K_MAX),
                "category": _text(form, "category"),
                "kind": NoteKind(kind) if kind else None,
                "subject": _text(form, "subject"),
                "include_superseded": _flag(form, "include_superseded"),
                "include_conversation": _flag(form, "include_conversation"),
                "since": parse_time(since) if since else None,
                "until": parse_time(until) if until else None,
                "ranking": ranking,
            }
            reply = await console.bus.search(user, query, **asked)
            explain_id = _text(form, "explain")
            explained = await explain(user, query, asked, reply.results, _note_id(explain_id)) if explain_id else None
        except EngramError as e:
            return page(
                request,
                "search.html",
                STATUS_OF.get(e.code, 500),
                user_id=user,
                section="search",
                form=form,
                asked=None,
                error=e,
            )
        return page(
            request,
            "search.html",
            user_id=user,
            section="search",
            form=form,
            asked=asked,
            hits=reply.results,
            best=_best_score(reply.results),
            best_keyword=max([h.keyword for h in reply.results], default=0.0),
            explained=explained,
        )

    async def explain(user: str, query: str, asked: dict[str, Any], hits: list[SearchHit], note_id: str) -> list[str]:
        """Why ``note_id`` is, or is not, among what a search showed, in words."""
        for rank, hit in enumerate(hits, start=1):
            if hit.note_id == note_id:
                return [
                    f"{note_id} is result #{rank}: score {hit.score:.3f}, cosine {hit.similarity:.3f}, "
                    f"keyword {hit.keyword:.2f}."
                ]
        history = await console.bus.history(user, note_id)
        latest = history.versions[-1] if history.versions else None
        reasons: list[str] = []
        if history.status == NoteStatus.FORGOTTEN.value:
            return [f"{note_id} was forgotten: its content is gone and no search can find it."]
        if history.status == NoteStatus.SUPERSEDED.value and not asked["include_superseded"]:
            by = latest.superseded_by if latest else None
            reasons.append(f"{note_id} is superseded (by {by}): searches leave it out unless 'include superseded'.")
        if latest is not None and asked["category"] and latest.category != asked["category"]:
            reasons.append(f"its category is {latest.category}; the search asked for {asked['category']}.")
        if latest is not None and asked["subject"]:
            mine = " ".join((latest.subject or "").casefold().split())
            if mine != " ".join(asked["subject"].casefold().split()):
                reasons.append("its subject is not the one the search asked for.")
        if reasons:
            return reasons
        deeper = {**asked, "top_k": SEARCH_TOP_K_MAX}
        for offset in range(0, EXPLAIN_DEPTH, SEARCH_TOP_K_MAX):
            page_of = await console.bus.search(user, query, offset=offset, **deeper)
            for rank, hit in enumerate(page_of.results, start=offset + 1):
                if hit.note_id == note_id:
                    return [
                        f"{note_id} ranks #{rank} (score {hit.score:.3f}, cosine {hit.similarity:.3f}, "
                        f"keyword {hit.keyword:.2f}): "
                        f"below the {asked['top_k']} shown."
                    ]
            if len(page_of.results) < SEARCH_TOP_K_MAX:
                break
        if asked["kind"] is not None:
            return [f"{note_id} is not a {asked['kind'].value}, or is not among the {EXPLAIN_DEPTH} best matches."]
        return [
            f"{note_id} is not among the {EXPLAIN_DEPTH} best matches: it shares no rare word with the query "
            "and its meaning is farther than the candidates' (each signal keeps its 50 best)."
        ]

    # a note -----------------------------------------------------------------------------------

    async def note_page(request: Request) -> Response:
        q = request.query_params
        user = _user(_text(q, "u"))
        note_id = _note_id(_text(q, "id"))
        after = _token(q)
        history = await console.bus.history(user, note_id, after=after)
        view = await console.bus.get_note(user, note_id)
        await console.log.reached(after)
        pending = next((p for p in console.log.pending(user) if p.note_id == note_id), None)
        return page(
            request,
            "note.html",
            user_id=user,
            section="memories",
            note=view,
            note_status=history.status,
            changes=timeline(history.versions, pending.expires_at if pending else None),
            pending=pending,
            done=_text(q, "done"),
        )

    async def forget(request: Request) -> Response:
        form = await checked_form(request)
        user = _user(_text(form, "u"))
        note_id = _note_id(_text(form, "id"))
        # Never ``confirmed``: the console asks twice, as the tools do.
        reply = await console.bus.forget(user, note_ids=[note_id])
        return _after_forget("/note", reply, u=user, id=note_id)

    # erasing a user ---------------------------------------------------------------------------

    async def erase_page(request: Request, user: str, done: str | None, error: EngramError | None = None) -> Response:
        pending = next((p for p in console.log.pending(user) if p.note_id == ACCOUNT), None)
        held = (await console.bus.list_notes(user, include_superseded=True, limit=1)).total
        activity_of = console.log.user(user)
        status = STATUS_OF.get(error.code, 500) if error else 200
        return page(
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
            user = _user(_text(q, "u"))
            await console.log.reached(_token(q))
            return await erase_page(request, user, _text(q, "done"))
        form = await checked_form(request)
        user = _user(_text(form, "u"))
        if _text(form, "confirm_user") != user:
            typed = EngramError(ErrorCode.INVALID_PARAMETER, "confirm_user: type the user's id exactly to erase it")
            return await erase_page(request, user, None, typed)
        # Never ``confirmed``: two calls, as ``engram forget --all``.
        reply = await console.bus.forget_user(user)
        return _after_forget("/user/erase", reply, u=user)

    def _after_forget(path: str, reply: ForgetReply, **params: str) -> Response:
        # Post/redirect/get: reloading the page must never send the second, deleting call.
        return RedirectResponse(_link(path, **params, after=reply.token, done=reply.status), status_code=303)

    # the prompt block -------------------------------------------------------------------------

    async def _context(form: FormData | QueryParams, user: str) -> Any:
        fmt = _text(form, "format") or "markdown"
        if fmt not in ("markdown", "xml"):
            raise EngramError(ErrorCode.INVALID_PARAMETER, f"format: {fmt!r} is not markdown or xml")
        budget = _int(form, "max_tokens", 0, 0, MAX_CONTEXT_TOKENS) or None
        return await console.bus.context(user, format=fmt, query=_text(form, "query"), max_tokens=budget)

    async def context(request: Request) -> Response:
        source: FormData | QueryParams
        if request.method == "GET":
            source = request.query_params
        else:
            source = await checked_form(request)
        user = _user(_text(source, "u"))
        form = {"format": _text(source, "format") or "markdown", "max_tokens": _text(source, "max_tokens") or "0"}
        try:
            block = await _context(source, user)
        except EngramError as e:
            status = STATUS_OF.get(e.code, 500)
            return page(request, "context.html", status, user_id=user, section="context", form=form, error=e)
        return page(request, "context.html", user_id=user, section="context", form=form, block=block)

    async def context_text(request: Request) -> Response:
        form = await checked_form(request)
        user = _user(_text(form, "u"))
        block = await _context(form, user)
        extension = "xml" if _text(form, "format") == "xml" else "md"
        return Response(
            block.text.encode(),
            media_type="text/plain; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="memory.{extension}"'},
        )

    # live -------------------------------------------------------------------------------------

    async def events(request: Request) -> Response:
        q = request.query_params
        user = _user(_text(q, "u")) if _text(q, "u") else None
        if console.streams.locked():
            raise EngramError(
                ErrorCode.UNAVAILABLE, f"{console.max_streams} event streams are open already: close a console tab"
            )

        async def stream() -> AsyncIterator[dict[str, str]]:
            # The slot is taken here, beside where it is given back: a response that never starts
            # its body (a HEAD, a client gone at once) must not keep one.
            if console.streams.locked():
                yield {"event": "busy", "data": "{}"}
                return
            await console.streams.acquire()
            subscription: Subscription | None = None
            try:
                subscription = Subscription.connect(
                    console.url,
                    None,
                    cluster=console.cluster,
                    partition_count=console.bus.partitions,
                    users=[user] if user else None,
                )
                await subscription.start()
                yield {"event": "ready", "data": "{}"}
                async for delivery in subscription:
                    shown = LogEvent.of(delivery)
                    yield {"event": "engram", "id": shown.token, "data": json.dumps(shown.public())}
            finally:
                console.streams.release()
                # The response's task group is being cancelled (the browser went away): anyio
                # cancels every await in it again unless shielded, and the connection would leak.
                if subscription is not None:
                    with anyio.CancelScope(shield=True):
                        await subscription.close()

        return EventSourceResponse(stream(), ping=15, headers={"Cache-Control": "no-store"})

    # sessions ---------------------------------------------------------------------------------

    async def login(request: Request) -> Response:
        form = await request.form()
        given = form.get("token")
        target = safe_next(form.get("next") if isinstance(form.get("next"), str) else None)  # type: ignore[arg-type]
        if not console.auth.token_ok(given if isinstance(given, str) else None):
            return _login_page(request, "that is not the console's token", 401)
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
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    def _login_page(request: Request, problem: str | None, status: int = 401) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        html = templates.get_template("login.html").render(
            next=safe_next("/" if request.url.path == "/login" else target), problem=problem
        )
        return HTMLResponse(html, status_code=status, headers={"WWW-Authenticate": 'Bearer realm="engram-console"'})

    async def on_engram_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, EngramError)
        if "console" not in request.scope:
            return _login_page(request, None)
        return failed(request, exc)

    async def on_forbidden(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Forbidden)
        error = EngramError(ErrorCode.PERMISSION_DENIED, exc.message)
        return failed(request, error)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with EngramClient(url, timeout=timeout, cluster=cluster, operator=True) as client:
            console.client = client
            watch = LogWatch.connect(url, cluster=cluster, partitions=client.partitions)
            await watch.start()
            console.watch = watch
            try:
                yield
            finally:
                await watch.close()

    routes = [
        Route("/", home),
        Route("/user", user_page),
        Route("/user/activity", activity),
        Route("/user/search", search, methods=["GET", "POST"]),
        Route("/user/context", context, methods=["GET", "POST"]),
        Route("/user/context.txt", context_text, methods=["POST"]),
        Route("/user/erase", erase, methods=["GET", "POST"]),
        Route("/note", note_page),
        Route("/note/forget", forget, methods=["POST"]),
        Route("/events", events),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={EngramError: on_engram_error, Forbidden: on_forbidden},
    )
    app.state.console = console
    app.add_middleware(RequireToken, auth=console.auth, login=_login_page, policy=policy)
    return app


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


def http_server(app: Starlette, host: str, port: int) -> Any:
    """uvicorn as the console runs it: no access log (paths name users and notes; the console
    keeps to itself what people looked at), warnings and errors only."""
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=3
    )
    return uvicorn.Server(config)


async def serve_console(
    url: str,
    token: str,
    host: str,
    port: int,
    *,
    cluster: bool = False,
    timeout: float = 10.0,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Runs the console with uvicorn until SIGINT/SIGTERM. The bus and the port are tried first,
    so that either failing is one typed error."""
    async with EngramClient(url, timeout=timeout, cluster=cluster):
        pass  # UNAVAILABLE now, in words, rather than as a failed lifespan later
    check_port(host, port)
    if host not in LOOPBACK:
        log.warning(
            "the console listens on %s without TLS: its token and every memory shown cross the network in clear; "
            "put a TLS proxy in front or keep it on loopback",
            host,
        )
    server = http_server(create_app(url, token, cluster=cluster, timeout=timeout), host, port)
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.05)
    if server.started and announce is not None:
        announce(http_url(host, port))
    await serving
