"""Who may use the console: whoever holds its token, as ``Authorization: Bearer <token>`` or
through the login form, which sets a session cookie (HttpOnly, SameSite=Strict). Every request
without one is answered 401, the login page included (its body is the form), static files too.

Sessions are stateless: the cookie is ``<id>.<issued>.<mac>``, its MAC a keyed hash under a key
derived from the console token, so a new token ends every session and a restart ends none. Logging
out ends the session for good: its id is kept (in a file under the data dir, so a restart keeps it
too) until the cookie would have expired anyway. A
form posted with the cookie must carry the session's CSRF token (a MAC of the session id), and a
cross-origin ``Origin`` is refused: SameSite=Strict alone leaves older browsers and same-site
subdomains. A request with the bearer token carries no ambient credential and needs neither.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import FormData
from starlette.requests import Request

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.private_files import NotPrivate, private_dir, write_private

log = logging.getLogger("engram.console")

COOKIE = "engram_console"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"
SESSION_SECONDS = 12 * 3600
MIN_TOKEN_CHARS = 16


class Forbidden(Exception):
    """A request the console refuses although its credentials are good (a missing CSRF token)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class Who:
    """How a request proved it holds the token: ``session`` for the cookie (then ``csrf`` is the
    token its forms carry), ``bearer`` for the header."""

    how: str
    csrf: str = ""


def new_token() -> str:
    return secrets.token_urlsafe(32)


def check_token(token: str) -> str:
    if len(token) < MIN_TOKEN_CHARS or token != token.strip():
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"ENGRAM_CONSOLE_TOKEN must be at least {MIN_TOKEN_CHARS} characters with no spaces around it "
            "(unset it and one is generated)",
        )
    return token


class ConsoleAuth:
    def __init__(self, token: str, ended_file: Path | None = None) -> None:
        self._token = check_token(token).encode()
        self._key = hashlib.sha256(b"engram-console-session\0" + self._token).digest()
        # Sessions logged out of, by id, with when their cookie would have expired.
        self._ended_file = ended_file
        self._ended: dict[str, int] = {}
        if ended_file is not None and ended_file.exists():
            for line in ended_file.read_text().splitlines():
                sid, _, until = line.partition(" ")
                if until.isdigit():
                    self._ended[sid] = int(until)

    def token_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self._token)

    def _mac(self, *parts: str) -> str:
        return hmac.new(self._key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()

    def new_session(self) -> str:
        sid = secrets.token_urlsafe(18)
        issued = str(int(time.time()))
        return f"{sid}.{issued}.{self._mac('session', sid, issued)}"

    def session_id(self, cookie: str | None) -> str | None:
        """The session's id if the cookie is one this token made and it has not expired."""
        if not cookie:
            return None
        parts = cookie.split(".")
        if len(parts) != 3 or not parts[1].isdigit():
            return None
        sid, issued, mac = parts
        if not hmac.compare_digest(mac, self._mac("session", sid, issued)):
            return None
        if not 0 <= time.time() - int(issued) <= SESSION_SECONDS:
            return None
        if sid in self._ended:
            return None
        return sid

    def end_session(self, cookie: str | None) -> None:
        """Log out: the session's cookie opens nothing any more, a copy of it included."""
        sid = self.session_id(cookie)
        if sid is None or cookie is None:
            return
        now = int(time.time())
        self._ended = {s: until for s, until in self._ended.items() if until > now}
        self._ended[sid] = int(cookie.split(".")[1]) + SESSION_SECONDS
        if self._ended_file is not None:
            lines = "".join(f"{s} {until}\n" for s, until in self._ended.items())
            try:
                private_dir(self._ended_file.parent)
                write_private(self._ended_file, lines)
            except (OSError, NotPrivate) as e:  # ended here all the same; a restart would forget it
                log.warning("the logout is not kept across a restart: %s", e)

    def csrf(self, sid: str) -> str:
        return self._mac("csrf", sid)

    def who(self, scope: Any) -> Who | None:
        """The request's credentials, if good."""
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, given = auth.partition(" ")
        if scheme.lower() == "bearer" and self.token_ok(given.strip()):
            return Who("bearer")
        sid = self.session_id(_cookie(headers.get(b"cookie", b"").decode("latin-1"), COOKIE))
        if sid is not None:
            return Who("session", self.csrf(sid))
        return None


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


async def checked_form(request: Request) -> FormData:
    """A POST's form, once it has passed the cross-site checks (a session must name its CSRF
    token; no request may come from another origin)."""
    origin = request.headers.get("origin")
    # "null": the pages' no-referrer policy makes browsers send an opaque origin with their own
    # forms, so it says nothing either way; the CSRF token below is what decides.
    if origin is not None and origin != "null":
        own = f"{request.url.scheme}://{request.url.netloc}"
        if origin.rstrip("/") != own:
            raise Forbidden(f"a form from another origin ({urlsplit(origin).netloc or origin}) is refused")
    form = await request.form()
    who: Who = request.scope["console"]
    if who.how == "session":
        given = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD)
        if not isinstance(given, str) or not hmac.compare_digest(given, who.csrf):
            raise Forbidden("this form lacks the console's CSRF token: reload the page and try again")
    return form


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path of this site only (never ``//host`` or a URL)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
