"""What every page of the console shares: the running console (its client and log watch), the
templates and the page a handler answers, and the checks of what a request asks."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.datastructures import FormData, QueryParams
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.templating import Jinja2Templates

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import MAX_CONTEXT_TOKENS, SEARCH_TOP_K_MAX
from engram_ledger.contracts.model import NoteKind
from engram_ledger.services.application.as_of import parse_moment
from engram_ledger.services.application.decoding import check_user_id
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.console.auth import ConsoleAuth, Who, safe_next
from engram_ledger.services.console.live import LogWatch

HERE = Path(__file__).resolve().parent
PAGE = 50
# Open event streams at once: each holds a Redis connection of its own.
MAX_STREAMS = 16
STATUS_OF = {
    ErrorCode.INVALID_PARAMETER: 400,
    ErrorCode.MEMORY_NOT_FOUND: 404,
    ErrorCode.VERSION_CONFLICT: 409,
    ErrorCode.IDEMPOTENCY_CONFLICT: 409,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.UNAVAILABLE: 503,
}


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


class Pages:
    """The templates, and the responses built from them."""

    def __init__(self) -> None:
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        env = self.templates.env
        env.filters["when"] = when
        env.filters["ago"] = ago
        env.globals["link"] = link
        env.globals["kinds"] = [k.value for k in NoteKind]
        env.globals["top_k_max"] = SEARCH_TOP_K_MAX
        env.globals["max_context_tokens"] = MAX_CONTEXT_TOKENS
        login_css = (HERE / "static" / "console.css").read_text()
        env.globals["login_css"] = login_css
        # The login page inlines its stylesheet (it is served before any cookie): the policy
        # allows that one stylesheet by its hash.
        css_hash = base64.b64encode(hashlib.sha256(login_css.encode()).digest()).decode()
        self.policy = (
            "default-src 'self'; script-src 'self'; "
            f"style-src 'self' 'sha256-{css_hash}'; img-src 'self' data:; connect-src 'self'; "
            "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"
        )

    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        who: Who = request.scope["console"]
        return self.templates.TemplateResponse(request, name, {"csrf": who.csrf, **context}, status_code=status)

    def failed(self, request: Request, error: EngramError, **context: Any) -> Response:
        return self.page(request, "error.html", STATUS_OF.get(error.code, 500), error=error, **context)

    def login(self, request: Request, problem: str | None, status: int = 401) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        html = self.templates.get_template("login.html").render(
            next=safe_next("/" if request.url.path == "/login" else target), problem=problem
        )
        return HTMLResponse(html, status_code=status, headers={"WWW-Authenticate": 'Bearer realm="engram-console"'})


# Requests ---------------------------------------------------------------------------------------


def user_of(value: str | None, name: str = "u") -> str:
    if not value:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{name}: give a user id")
    check_user_id(value, name)
    return value


def note_id_of(value: str | None) -> str:
    if not value or not value.isalnum() or len(value) != 8 or not value.isascii():
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"id: {value!r} is not a note id (8 letters or digits)")
    return value


def fraction_of(source: QueryParams | FormData, name: str) -> float | None:
    """A number from 0 to 1, or None when the field is empty."""
    raw = source.get(name)
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        return None
    if not isinstance(raw, str):
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{name}: expected a number, not a file")
    try:
        value = float(raw)
    except ValueError:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{name}: {raw[:40]!r} is not a number") from None
    if not 0 <= value <= 1:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{name}: {value:g} is not between 0 and 1")
    return value


def int_of(source: QueryParams | FormData, name: str, default: int | None, low: int, high: int) -> int | None:
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


def text_of(source: QueryParams | FormData, name: str) -> str | None:
    raw = source.get(name)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{name}: expected text, not a file")
    return raw.strip() or None


def moment_of(source: QueryParams | FormData, name: str) -> str | None:
    """A moment a page is asked about: an ISO 8601 time (a browser's datetime field sends one
    without a zone: UTC, as the console shows times) or a consistency token."""
    text = text_of(source, name)
    if text is None:
        return None
    try:
        parse_moment(text)
    except EngramError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{name}: {e.message}") from None
    return text


def flag_of(source: QueryParams | FormData, name: str) -> bool:
    return source.get(name) in ("1", "on", "true")


def token_of(source: QueryParams | FormData) -> str | None:
    after = text_of(source, "after")
    if after is not None:
        try:
            channels.parse_token(after)
        except ValueError:
            raise EngramError(ErrorCode.INVALID_PARAMETER, f"after: {after!r} is not a consistency token") from None
    return after


def link(path: str, **params: Any) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "", False)}
    return f"{path}?{urlencode(kept)}" if kept else path


def ago(moment: datetime | None) -> str:
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


def when(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "–"
