"""The memory console's routes over real HTTP (uvicorn on a free port, in this process) against an
in-process service on real Redis: who may use it, the cross-site checks on every form, the two
calls of a forget, typed errors for bad input, and what the event stream and the logs carry.
The browser tests (tests/e2e/test_console_browser.py) drive the same pages through chromium."""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.services.adapters.redis_server import free_port
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.console.app import create_app, http_server
from engram_ledger.services.console.auth import COOKIE
from engram_ledger.services.console.web import when
from tests.conftest import RunningService, service_settings
from tests.support import eventually, serving_task

TOKEN = "integration-console-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
MAX_STREAMS = 2


@dataclass
class Served:
    url: str
    client: EngramClient
    app_routes: list[tuple[str, str]]

    def http(self, **options: object) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=15, **options)  # type: ignore[arg-type]


@pytest.fixture
async def served(redis_url: str) -> AsyncIterator[Served]:
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    try:
        app = create_app(redis_url, TOKEN, max_streams=MAX_STREAMS)
        routes = [("GET", "/static/console.css"), ("GET", "/static/console.js"), ("GET", "/no/such/page")]
        for route in app.routes:
            for method in sorted(getattr(route, "methods", None) or []):
                routes.append((method, route.path))  # type: ignore[attr-defined]
        web = http_server(app, "127.0.0.1", free_port())
        serving = await serving_task(web)
        try:
            async with EngramClient(redis_url, operator=True) as client:
                yield Served(f"http://127.0.0.1:{web.config.port}", client, routes)
        finally:
            web.should_exit = True
            await serving
    finally:
        await running.stop()


@contextlib.asynccontextmanager
async def logged_in(served: Served) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A client holding a session cookie, and the CSRF token its pages carry."""
    async with served.http() as http:
        answered = await http.post("/login", data={"token": TOKEN, "next": "/"})
        assert answered.status_code == 303
        page = await http.get("/")
        assert page.status_code == 200
        found = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert found, "the page carries its CSRF token"
        yield http, found.group(1)


async def test_every_route_answers_401_without_the_token(served: Served) -> None:
    assert {("GET", "/events"), ("POST", "/note/forget"), ("POST", "/user/erase"), ("HEAD", "/")} <= set(
        served.app_routes
    )
    stale = "abc.1000000000.0000000000000000000000000000000000000000000000000000000000000000"
    refused = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Cookie": f"{COOKIE}={stale}"}]
    async with served.http() as http:
        for method, path in [*served.app_routes, ("OPTIONS", "/user")]:
            for headers in refused:
                answered = await http.request(method, path, params={"u": "alice", "id": "abcdefgh"}, headers=headers)
                assert answered.status_code == 401, (method, path, headers)
                assert COOKIE not in answered.headers.get("set-cookie", "")
                if method != "HEAD":
                    assert "alice" not in answered.text or path == "/login"
        json_reply = (await http.get("/user", params={"u": "alice"})).json()
        assert json_reply["error"]["code"] == "PERMISSION_DENIED"
        assert "console token" in json_reply["error"]["message"]
        for method, path in served.app_routes:
            if path in ("/events", "/login", "/logout") or method != "GET":
                continue
            answered = await http.request(method, path, params={"u": "alice", "id": "abcdefgh"}, headers=BEARER)
            assert answered.status_code != 401, (method, path)


async def test_the_login_sets_a_strict_http_only_session_cookie(served: Served) -> None:
    async with served.http() as http:
        wrong = await http.post("/login", data={"token": TOKEN + "x", "next": "/"})
        assert wrong.status_code == 401 and "not the console" in wrong.text and "set-cookie" not in wrong.headers
        right = await http.post("/login", data={"token": TOKEN, "next": "//evil.example/x"})
        assert right.status_code == 303 and right.headers["location"] == "/"
        cookie = right.headers["set-cookie"]
        for part in ("HttpOnly", "SameSite=strict", "Path=/", "Max-Age=43200"):
            assert part.lower() in cookie.lower(), cookie
        assert TOKEN not in cookie, "the cookie holds a session, never the token"
        assert (await http.get("/")).status_code == 200
        page = await http.get("/")
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"
        # Going to a page after logging in:
        again = await http.post("/login", data={"token": TOKEN, "next": "/user?u=alice"})
        assert again.headers["location"] == "/user?u=alice"
    # A cookie made under another token opens nothing.
    other = create_app(served.url, "another-token-0123456789abcdef").state.console.auth.new_session()
    async with served.http(cookies={COOKIE: other}) as http:
        assert (await http.get("/")).status_code == 401


async def test_a_form_without_the_sessions_csrf_token_is_refused_and_changes_nothing(served: Served) -> None:
    saved = await served.client.save("alice", "Alice's door code is 4312")
    async with logged_in(served) as (http, csrf):
        for method, path in served.app_routes:
            if method != "POST" or path == "/login":
                continue
            answered = await http.post(path, data={"u": "alice", "id": saved.note_id, "confirm_user": "alice"})
            assert answered.status_code == 403, path
            assert "CSRF" in answered.text
        form = {"u": "alice", "id": saved.note_id, "csrf": csrf}
        async with logged_in(served) as (_, other_csrf):
            assert other_csrf != csrf, "each session has its own"
        refused = await http.post("/note/forget", data={**form, "csrf": other_csrf})
        assert refused.status_code == 403
        cross = await http.post("/note/forget", data=form, headers={"Origin": "http://evil.example"})
        assert cross.status_code == 403 and "another origin" in cross.text
        history = await served.client.history("alice", saved.note_id)
        assert [v.change for v in history.versions] == ["saved"], "nothing was asked for"
        # The token in a header (as htmx sends it) or in the form: accepted.
        asked = await http.post(
            "/note/forget", data={"u": "alice", "id": saved.note_id}, headers={"X-CSRF-Token": csrf}
        )
        assert asked.status_code == 303
    # A bearer request carries no ambient credential: no CSRF token needed.
    async with served.http(headers=BEARER) as bearer:
        page = await bearer.get("/note", params={"u": "alice", "id": saved.note_id})
        assert page.status_code == 200 and "Deletion pending" in page.text


async def test_forgetting_asks_twice_and_reloading_the_page_never_confirms(served: Served) -> None:
    saved = await served.client.save("bob", "Bob's pin is 9911")
    async with served.http(headers=BEARER) as http:
        first = await http.post("/note/forget", data={"u": "bob", "id": saved.note_id})
        assert first.status_code == 303
        location = first.headers["location"]
        assert "done=confirmation_required" in location and "9911" not in location
        for _ in range(3):  # reloads
            page = await http.get(location)
            assert page.status_code == 200 and 'id="forget-confirm"' in page.text and 'id="expires"' in page.text
        assert (await served.client.get_note("bob", saved.note_id)).status.value == "active"
        second = await http.post("/note/forget", data={"u": "bob", "id": saved.note_id})
        page = await http.get(second.headers["location"])
        assert 'id="tombstone"' in page.text and "9911" not in page.text
        assert (await served.client.history("bob", saved.note_id)).status == "forgotten"


async def test_the_console_shows_a_notes_reads_as_a_get_does_and_counts_none(served: Served) -> None:
    saved = await served.client.save("dan", "Dan's locker is 12")
    got = await served.client.get_note("dan", saved.note_id, after=saved.token)
    assert got.access_count == 1
    async with served.http(headers=BEARER) as http:
        for _ in range(2):
            page = await http.get("/note", params={"u": "dan", "id": saved.note_id})
            assert page.status_code == 200 and 'id="reads">1<' in page.text
            assert f'id="last-read">{when(got.last_accessed_at)}<' in page.text
        listing = await http.get("/user", params={"u": "dan"})
        assert "<dt>reads</dt><dd>1</dd>" in listing.text
    assert (await served.client.get_note("dan", saved.note_id)).access_count == 2, "the console counted no read"


async def test_erasing_a_user_needs_its_id_typed_and_two_calls(served: Served) -> None:
    for n in range(3):
        await served.client.save("carol", f"Carol's note {n}")
    async with served.http(headers=BEARER) as http:
        mistyped = await http.post("/user/erase", data={"u": "carol", "confirm_user": "caro"})
        assert mistyped.status_code == 400 and "INVALID_PARAMETER" in mistyped.text
        assert 'id="erase-request"' in mistyped.text, "nothing was asked for"
        first = await http.post("/user/erase", data={"u": "carol", "confirm_user": "carol"})
        page = await http.get(first.headers["location"])
        assert 'id="erase-confirm"' in page.text and "Nothing is deleted yet" in page.text
        assert (await served.client.list_notes("carol")).total == 3
        second = await http.post("/user/erase", data={"u": "carol", "confirm_user": "carol"})
        page = await http.get(second.headers["location"])
        assert re.search(r'id="receipt-count">3<', page.text)
        assert (await served.client.list_notes("carol")).total == 0


async def test_bad_input_gets_a_typed_error_with_a_clear_message(served: Served) -> None:
    saved = await served.client.save("dave", "Dave likes jazz")
    cases = [
        ("GET", "/user", {}, 400, "INVALID_PARAMETER", "u: give a user id"),
        ("GET", "/user", {"u": "dave smith"}, 400, "INVALID_PARAMETER", "no spaces"),
        ("GET", "/user", {"u": "dave", "offset": "abc"}, 400, "INVALID_PARAMETER", "offset: &#39;abc&#39; is not"),
        ("GET", "/user", {"u": "dave", "after": "soon"}, 400, "INVALID_PARAMETER", "not a consistency token"),
        ("GET", "/note", {"u": "dave", "id": "short"}, 400, "INVALID_PARAMETER", "is not a note id"),
        ("GET", "/note", {"u": "dave", "id": "ZZZZZZZZ"}, 404, "MEMORY_NOT_FOUND", "ZZZZZZZZ not found"),
        ("GET", "/note", {"u": "eve", "id": saved.note_id}, 404, "MEMORY_NOT_FOUND", "not found"),
        ("POST", "/user/context", {"u": "dave", "format": "pdf"}, 400, "INVALID_PARAMETER", "is not markdown or xml"),
        ("POST", "/user/context", {"u": "dave", "max_tokens": "-3"}, 400, "INVALID_PARAMETER", "out of range"),
        ("POST", "/user/context", {"u": "dave", "max_tokens": "5"}, 400, "INVALID_PARAMETER", "max_tokens"),
        ("POST", "/user/search", {"u": "dave", "query": " "}, 400, "INVALID_PARAMETER", "give the words"),
        ("POST", "/user/search", {"u": "dave", "query": "x", "top_k": "99"}, 400, "INVALID_PARAMETER", "out of range"),
        ("POST", "/user/search", {"u": "dave", "query": "x", "since": "May"}, 400, "INVALID_PARAMETER", "since"),
        ("POST", "/user/search", {"u": "dave", "query": "jazz"}, 503, "UNAVAILABLE", "search is off"),
        ("POST", "/note/forget", {"u": "dave", "id": "ZZZZZZZZ"}, 404, "MEMORY_NOT_FOUND", "ZZZZZZZZ"),
    ]
    async with served.http(headers=BEARER) as http:
        for method, path, values, status, code, words in cases:
            if method == "GET":
                answered = await http.get(path, params=values)
            else:
                answered = await http.post(path, data=values)
            assert answered.status_code == status, (path, values, answered.status_code)
            assert code in answered.text and words in answered.text, (path, values, answered.text[-800:])


async def test_the_prompt_block_is_the_replys_text_byte_for_byte(served: Served) -> None:
    await served.client.save("erin", "Erin's name is Erin", category="profile", subject="name")
    await served.client.save("erin", "Erin <b>likes</b> & tags\n  indented", category="preferences")
    async with served.http(headers=BEARER) as http:
        for form in ({"format": "markdown"}, {"format": "xml"}, {"format": "xml", "max_tokens": "80"}):
            budget = int(form.get("max_tokens", 0)) or None
            # As the console asks for it: a block naming no tool (none is known there).
            expected = await served.client.context("erin", format=form["format"], max_tokens=budget, update_tool=None)
            download = await http.post("/user/context.txt", data={"u": "erin", **form})
            assert download.status_code == 200 and download.content == expected.text.encode()
            assert download.headers["content-type"] == "text/plain; charset=utf-8"
            page = await http.post("/user/context", data={"u": "erin", **form})
            shown = re.search(r'<pre class="prompt" id="prompt">\n(.*?)</pre>', page.text, re.S)
            assert shown is not None
            assert html.unescape(shown.group(1)) == expected.text


async def test_the_event_stream_sends_new_events_without_their_content(served: Served) -> None:
    secret = "Frank's safe combination is 31-7-22"
    async with served.http(headers=BEARER) as http, http.stream("GET", "/events", params={"u": "frank"}) as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.aiter_lines()
        assert "event: ready" in [await anext(lines) for _ in range(2)]
        written = await served.client.save("frank", secret, category="security")
        await served.client.save("grace", "Grace's own note")  # another user's: not on frank's stream
        seen = ""
        while f'"note_id": "{written.note_id}"' not in seen:
            seen += await asyncio.wait_for(anext(lines), 10) + "\n"
        event = json.loads(next(line[5:] for line in seen.splitlines() if line.startswith("data:") and "frank" in line))
        assert event["type"] == "note_saved" and event["user_id"] == "frank" and event["token"] == written.token
        assert "31-7-22" not in seen and "combination" not in seen and "grace" not in seen


async def test_event_streams_are_bounded(served: Served) -> None:
    async with served.http(headers=BEARER) as http:
        # A HEAD never starts the stream's body: it must not keep a place (it kept one for good).
        for _ in range(MAX_STREAMS + 2):
            assert (await http.head("/events")).status_code == 200
        opened = [http.stream("GET", "/events") for _ in range(MAX_STREAMS)]
        streams = [await s.__aenter__() for s in opened]
        try:
            # Held: a line iterator dropped closes its response (httpx), which frees its place.
            lines = [s.aiter_lines() for s in streams]
            for s, line in zip(streams, lines, strict=True):
                assert s.status_code == 200 and await anext(line) == "event: ready"
            refused = await http.get("/events")
            assert refused.status_code == 503 and "UNAVAILABLE" in refused.text
        finally:
            for s in opened:
                await s.__aexit__(None, None, None)

        # A closed stream gives its place back.
        async def a_place_again() -> bool:
            async with http.stream("GET", "/events") as again:
                return again.status_code == 200

        await eventually(a_place_again, what="a place freed by the closed streams")


async def test_no_memory_content_goes_into_a_url_or_a_log_line(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    words = "Heidi hides the spare key under the blue flowerpot"
    saved = await served.client.save("heidi", words, category="home", subject="spare key")
    async with served.http(headers=BEARER) as http:
        pages = [
            await http.get("/", params={"q": "heidi"}),
            await http.get("/user", params={"u": "heidi"}),
            await http.get("/note", params={"u": "heidi", "id": saved.note_id}),
            await http.post("/user/context", data={"u": "heidi", "query": "flowerpot"}),
            await http.post("/user/search", data={"u": "heidi", "query": "flowerpot"}),
        ]
        first = await http.post("/note/forget", data={"u": "heidi", "id": saved.note_id})
        pages.append(await http.get(first.headers["location"]))
    assert words in pages[1].text, "the page shows the memory"
    for page in pages:
        for url in re.findall(r'(?:href|action|hx-post|hx-get|data-src)="([^"]*)"', page.text):
            assert not any(w in url for w in ("flowerpot", "spare", "blue", "hides")), url
    assert "flowerpot" not in caplog.text and "spare key" not in caplog.text


async def test_a_large_memory_is_listed_page_by_page(served: Served) -> None:
    for batch in range(3):
        drafts = [NoteDraft(content=f"Ivan's fact {batch}-{n:03d}", category=f"c{batch}") for n in range(45)]
        written = await served.client.save_many("ivan", drafts)
    async with served.http(headers=BEARER) as http:
        first = await http.get("/user", params={"u": "ivan", "after": written.token})
        assert "1–50 of 135 notes" in first.text and 'rel="next"' in first.text and 'rel="prev"' not in first.text
        assert first.text.count('class="note active"') == 50
        last = await http.get("/user", params={"u": "ivan", "offset": "100"})
        assert "101–135 of 135 notes" in last.text and "page 3 of 3" in last.text and 'rel="next"' not in last.text
        assert last.text.count('class="note active"') == 35
        only = await http.get("/user", params={"u": "ivan", "category": "c1"})
        assert "1–45 of 45 notes in c1" in only.text and "Ivan&#39;s fact 0-" not in only.text


async def test_after_logout_a_copy_of_the_sessions_cookie_opens_nothing(served: Served) -> None:
    async with logged_in(served) as (http, csrf):
        copied = http.cookies[COOKIE]
        out = await http.post("/logout", data={"csrf": csrf})
        assert out.status_code == 303
    async with served.http(cookies={COOKIE: copied}) as thief:
        assert (await thief.get("/")).status_code == 401
    async with logged_in(served) as (http, _):  # logging in again makes a new session
        assert (await http.get("/")).status_code == 200
