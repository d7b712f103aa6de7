"""The memory console in a real browser: Debian's chromium, driven by Selenium through its
chromedriver, against a real `engram console` talking to a real `engram serve` on real Redis.
One service, one console and one browser for the module; each test works on users of its own.

Screenshots of each page go to a temporary directory, or to ENGRAM_CONSOLE_SCREENSHOTS (the
README's are made with ENGRAM_CONSOLE_SCREENSHOTS=docs/console)."""

from __future__ import annotations

import asyncio
import base64
import os
import queue
import shutil
import subprocess
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
import redis
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from engram_ledger.contracts.model import NoteKind, Origin
from engram_ledger.services.adapters.redis_server import free_port
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.console.app import create_app
from tests.conftest import TEST_REDIS_URL
from tests.support import ENGRAM_CLI, ROOT, ServeProcess, cli, cli_text, engram_env, wait_until

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TOKEN = "console-e2e-" + uuid.uuid4().hex
WIDE, PHONE = 1280, 390
AUDITED = f"ada-audited-{uuid.uuid4().hex[:6]}"
T = TypeVar("T")


@pytest.fixture(scope="session")
def chromium() -> tuple[Path, Path]:
    """Debian's chromium and chromedriver, installed with apt-get when missing (we are root on
    the test machines); skipped, saying why, only where they cannot be installed."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return CHROMIUM, CHROMEDRIVER
    if shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and there is no apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"]
    done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        # A fresh machine may have no package lists yet.
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True, timeout=600)
        done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        pytest.skip(f"chromium and chromium-driver could not be installed with apt-get: {tail[0]}")
    return CHROMIUM, CHROMEDRIVER


@dataclass
class Console:
    url: str
    env: dict[str, str]
    shots: Path
    lines: list[str] = field(default_factory=list)

    def bus(self, work: Callable[[EngramClient], Awaitable[T]]) -> T:
        """Runs ``work`` with a client of the module's service, as an agent's runtime would."""

        async def go() -> T:
            async with EngramClient(TEST_REDIS_URL, timeout=30, operator=True) as client:
                return await work(client)

        return asyncio.run(go())

    def output(self) -> str:
        return "".join(self.lines)


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    flush = redis.Redis.from_url(TEST_REDIS_URL)
    flush.flushdb()
    data = tmp_path_factory.mktemp("engram")
    # One user's recalls are audited (test_what_an_agent_recalled_by_session).
    env = engram_env(ENGRAM_REDIS_URL=TEST_REDIS_URL, ENGRAM_DATA_DIR=str(data), ENGRAM_RECALL_AUDIT=AUDITED)
    serve = ServeProcess(env).start()
    wait_until(lambda: cli(env, "search", "--user", "warm-up", "anything")[0] == 0, timeout=90, interval=0.5)
    port = free_port()
    process = subprocess.Popen(
        [*ENGRAM_CLI, "console", "--port", str(port)],
        env={**env, "ENGRAM_CONSOLE_TOKEN": TOKEN},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    shots = Path(os.environ.get("ENGRAM_CONSOLE_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    shots = shots if shots.is_absolute() else ROOT / shots
    shots.mkdir(parents=True, exist_ok=True)
    running = Console(f"http://127.0.0.1:{port}", env, shots)
    ready: queue.Queue[bool] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            running.lines.append(line)
            if "engram console on" in line:
                ready.put(True)
        ready.put(False)

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.get(timeout=30), "engram console exited:\n" + running.output()
        yield running
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
        serve.stop()
        flush.flushdb()
        flush.close()
    # Chosen by the environment, the token is never printed.
    assert TOKEN not in running.output()


@pytest.fixture(scope="module")
def browser(chromium: tuple[Path, Path], console: Console) -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium[0])
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--hide-scrollbars"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={WIDE},900")
    try:
        driver = webdriver.Chrome(options=options, service=Service(executable_path=str(chromium[1])))
    except WebDriverException as e:
        pytest.skip(f"chromium does not start here: {e.msg}")
    driver.implicitly_wait(0)
    try:
        # Every test starts logged in: the login itself is the first test's subject too.
        log_in(driver, console)
        yield driver
    finally:
        driver.quit()


def log_in(driver: WebDriver, console: Console) -> None:
    driver.get(console.url + "/")
    field_ = wait_for(driver, lambda d: d.find_element(By.ID, "token"))
    field_.send_keys(TOKEN)
    field_.submit()
    wait_for(driver, lambda d: d.find_elements(By.ID, "users"))


def wait_for(driver: WebDriver, check: Callable[[WebDriver], T], timeout: float = 15) -> T:
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(check)  # type: ignore[no-any-return]


def click(driver: WebDriver, by: str, value: str) -> None:
    """Click the element, found again if a live update re-rendered the page meanwhile."""

    def clicked(d: WebDriver) -> bool:
        d.find_element(by, value).click()
        return True

    ignored = (StaleElementReferenceException, NoSuchElementException)
    WebDriverWait(driver, 15, poll_frequency=0.05, ignored_exceptions=ignored).until(clicked)


def text(driver: WebDriver, css: str) -> str:
    """What the element shows, its white space (block boundaries included) as single spaces."""
    return " ".join(str(driver.find_element(By.CSS_SELECTOR, css).text).split())


def shoot(driver: WebDriver, console: Console, name: str, width: int = WIDE) -> None:
    """The whole page at ``width`` (at most 2,400 px of it), captured past the window's bottom."""
    driver.set_window_size(width, 900)
    height = min(int(driver.execute_script("return document.documentElement.scrollHeight")), 2400)
    clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"captureBeyondViewport": True, "clip": clip})  # type: ignore[attr-defined]
    (console.shots / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))
    driver.set_window_size(WIDE, 900)


def user_id() -> str:
    return f"ada-{uuid.uuid4().hex[:6]}"


def open_user(driver: WebDriver, console: Console, user: str) -> None:
    driver.get(f"{console.url}/user?u={user}")
    wait_for(driver, lambda d: d.find_elements(By.ID, "notes"))


# ------------------------------------------------------------------------------------------------


def route_paths() -> list[tuple[str, str]]:
    """(method, path) for every route of the console's app, static files included."""
    app = create_app("redis://127.0.0.1:1/0", "x" * 32)
    out: list[tuple[str, str]] = [("GET", "/static/console.css"), ("GET", "/static/htmx.min.js"), ("GET", "/nowhere")]
    for route in app.routes:
        for method in sorted(getattr(route, "methods", None) or []):
            if method != "HEAD":
                out.append((method, route.path))  # type: ignore[attr-defined]
    return out


def test_without_the_token_every_route_answers_401(console: Console) -> None:
    routes = route_paths()
    assert ("GET", "/events") in routes and ("POST", "/note/forget") in routes and ("POST", "/login") in routes
    forged = {"Cookie": "engram_console=abc.1999999999.0123456789abcdef"}
    with httpx.Client(base_url=console.url, timeout=10) as http:
        for method, path in routes:
            for headers in ({}, {"Authorization": "Bearer not-the-token"}, forged):
                answered = http.request(method, path + "?u=someone&id=abcdefgh", headers=headers, data={"u": "x"})
                assert answered.status_code == 401, (method, path, headers, answered.status_code)
                assert "engram_console=" not in answered.headers.get("set-cookie", "")
        # A browser is shown the login form, still with 401.
        page = http.get("/user?u=someone", headers={"Accept": "text/html"})
        assert page.status_code == 401 and 'name="token"' in page.text
        assert page.headers["www-authenticate"].startswith("Bearer")
        assert http.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_log_in_find_a_user_and_see_their_memories(browser: WebDriver, console: Console) -> None:
    user = user_id()
    notes: list[tuple[str, str | None, str, NoteKind, dict[str, str]]] = [
        ("person", "Alec", "Alec is my manager at the lab", NoteKind.FACT, {}),
        ("food", None, "Ada drinks green tea every morning", NoteKind.FACT, {}),
        ("work", None, "Ada presented the quarterly results on Friday", NoteKind.EPISODE, {}),
        (
            "work",
            None,
            "When a report is due, draft it a day early",
            NoteKind.PROCEDURE,
            {"trigger": "a report is due", "action": "draft it a day early"},
        ),
    ]

    async def seed(client: EngramClient) -> None:
        for category, subject, content, kind, more in notes:
            await client.save(user, content, category=category, subject=subject, kind=kind, importance=0.7, **more)

    console.bus(seed)
    browser.delete_all_cookies()
    browser.get(console.url + "/")
    assert browser.find_elements(By.ID, "token") and not browser.find_elements(By.ID, "users")
    shoot(browser, console, "login")
    log_in(browser, console)
    find = browser.find_element(By.ID, "find")
    find.send_keys(user[:7])
    find.submit()
    wait_for(browser, lambda d: d.find_element(By.LINK_TEXT, user))
    shoot(browser, console, "users-find")
    click(browser, By.LINK_TEXT, user)
    wait_for(browser, lambda d: d.find_elements(By.ID, "notes"))
    categories = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".category-name")]
    assert categories == ["food", "person", "work"]
    kinds = [e.text.split()[0].lower() for e in browser.find_elements(By.CSS_SELECTOR, ".kind-name")]
    assert kinds == ["facts", "facts", "episodes", "procedures"]
    assert "4 notes" in text(browser, "#notes .count")
    card = text(browser, f"#note-{note_with(console, user, 'manager')}")
    assert "Alec" in card and "Alec is my manager at the lab" in card and "importance 0.70" in card
    assert "reads 0" in card
    shoot(browser, console, "memories")
    shoot(browser, console, "memories-phone", PHONE)
    # At a phone's width nothing is wider than the screen.
    browser.set_window_size(PHONE, 800)
    assert browser.execute_script("return document.documentElement.scrollWidth") <= PHONE
    browser.set_window_size(WIDE, 900)


def note_with(console: Console, user: str, word: str) -> str:
    async def find(client: EngramClient) -> str:
        listed = await client.list_notes(user, include_superseded=True)
        return next(n.id for n in listed.notes if word in n.content)

    return console.bus(find)


def test_search_shows_each_hit_with_its_scores(browser: WebDriver, console: Console) -> None:
    user = user_id()

    async def seed(client: EngramClient) -> str:
        await client.save(user, "Ada keeps bees on the roof of her flat", category="hobby")
        await client.save(user, "Ada's sister lives in Porto", category="family")
        written = await client.save(user, "Ada's favourite composer is Hildegard von Bingen", category="music")
        return written.note_id

    wanted = console.bus(seed)
    browser.get(f"{console.url}/user/search?u={user}")
    box = wait_for(browser, lambda d: d.find_element(By.ID, "query"))
    box.send_keys("which composer does Ada like best?")
    # The whole ranking (the floor at 0): the explanation below names a note ranked third.
    browser.find_element(By.ID, "min-relevance").send_keys("0")
    browser.find_element(By.ID, "search-go").click()
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#results .hit"))
    hits = browser.find_elements(By.CSS_SELECTOR, "#results .hit")
    assert hits[0].get_attribute("data-note") == wanted
    finals = [float(e.text) for e in browser.find_elements(By.CSS_SELECTOR, ".score-final")]
    cosines = [float(e.text) for e in browser.find_elements(By.CSS_SELECTOR, ".score-cosine")]
    assert finals == sorted(finals, reverse=True) and finals[0] > 0 and len(cosines) == len(finals)
    assert cosines[0] == max(cosines)
    relevances = [float(e.text) for e in browser.find_elements(By.CSS_SELECTOR, ".score-relevance")]
    assert len(relevances) == len(finals) and relevances[0] == max(relevances) > 0.5, relevances
    # "composer" is a word of the query and of the wanted note only: its keyword part shows.
    keywords = [float(e.text) for e in browser.find_elements(By.CSS_SELECTOR, ".score-keyword")]
    assert len(keywords) == len(finals) and keywords[0] > 0, keywords
    # The words searched for never go into a URL.
    assert "composer" not in browser.current_url
    shoot(browser, console, "search")
    assert "Hildegard" not in console.output() and "composer" not in console.output()
    # Why was a note not shown? One result only, and the third note named: it ranks lower.
    third = hits[2].get_attribute("data-note")
    top_k = browser.find_element(By.NAME, "top_k")
    top_k.clear()
    top_k.send_keys("1")
    browser.find_element(By.NAME, "explain").send_keys(third)
    browser.find_element(By.ID, "search-go").click()
    explained = wait_for(browser, lambda d: d.find_elements(By.ID, "explain"))
    assert f"{third} ranks #3" in explained[0].text and "below the 1 shown" in explained[0].text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#results .hit")) == 1
    # With the service's floor, a question about nothing Ada's memory holds finds nothing, in words.
    for name, value in (("explain", ""), ("min_relevance", ""), ("query", "What is the capital of Peru?")):
        browser.find_element(By.NAME, name).clear()
        if value:
            browser.find_element(By.NAME, name).send_keys(value)
    browser.find_element(By.ID, "search-go").click()
    nothing = wait_for(browser, lambda d: d.find_elements(By.ID, "no-match"))
    assert nothing[0].text.startswith("No memory matched “What is the capital of Peru?”")
    assert browser.find_elements(By.CSS_SELECTOR, "#results .hit") == []
    shoot(browser, console, "search-no-match")


def test_a_timeline_shows_an_update_and_a_supersede_with_their_commands_and_channels(
    browser: WebDriver, console: Console
) -> None:
    user = user_id()

    async def seed(client: EngramClient) -> tuple[str, str]:
        old = await client.save(
            user, "Ada works at the Analytical Engine lab", category="work", origin=Origin(channel="whatsapp")
        )
        await client.update(
            user,
            old.note_id,
            content="Ada leads the Analytical Engine lab",
            expected_version=1,
            command_id="cmd-promotion",
            origin=Origin(channel="tui", session_id="s-7"),
        )
        new = await client.save(user, "Ada left the lab to found a company", category="work")
        await client.supersede(user, old.note_id, new.note_id, command_id="cmd-left", origin=Origin(channel="api"))
        return old.note_id, new.note_id

    old, new = console.bus(seed)
    browser.get(f"{console.url}/note?u={user}&id={old}")
    wait_for(browser, lambda d: d.find_elements(By.ID, "timeline"))
    steps = browser.find_elements(By.CSS_SELECTOR, "#timeline .step")
    assert [s.get_attribute("data-version") for s in steps] == ["3", "2", "1"]
    superseded, updated, saved = steps
    assert "Superseded" in superseded.text and "cmd-left" in superseded.text and "api" in superseded.text
    assert superseded.find_element(By.LINK_TEXT, new)
    assert "cmd-promotion" in updated.text and "tui" in updated.text and "s-7" in updated.text
    assert updated.find_element(By.CSS_SELECTOR, "del").text == "Ada works at the Analytical Engine lab"
    assert updated.find_element(By.CSS_SELECTOR, "ins").text == "Ada leads the Analytical Engine lab"
    assert "whatsapp" in saved.text
    assert text(browser, "#status") == "superseded"
    shoot(browser, console, "timeline")
    shoot(browser, console, "timeline-phone", PHONE)
    # ...and the other way: the replacement names what it replaced.
    browser.find_element(By.CSS_SELECTOR, "#links .superseded-by").click()
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#links .supersedes"))
    assert text(browser, "#links .supersedes") == old
    assert new in browser.current_url


def test_forgetting_takes_two_steps_and_the_note_is_gone(browser: WebDriver, console: Console) -> None:
    user = user_id()
    secret = "Ada's door code is 4711"

    async def seed(client: EngramClient) -> str:
        await client.save(user, "Ada likes long walks", category="general")
        return (await client.save(user, secret, category="general")).note_id

    note = console.bus(seed)
    open_user(browser, console, user)
    click(browser, By.LINK_TEXT, note)
    wait_for(browser, lambda d: d.find_elements(By.ID, "forget-request")).__getitem__(0).click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "forget-confirm"))
    # Pending: nothing is deleted yet, and the page says until when.
    assert text(browser, "#status") == "active" and secret in text(browser, "#content")
    assert browser.find_element(By.ID, "expires").get_attribute("datetime")
    assert "Deletion pending" in text(browser, "#forget")
    shoot(browser, console, "forget-pending")
    # A reload shows the same request; it never sends the second call.
    browser.refresh()
    wait_for(browser, lambda d: d.find_elements(By.ID, "forget-confirm"))
    assert text(browser, "#status") == "active"
    browser.find_element(By.ID, "forget-confirm").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "tombstone"))
    assert text(browser, "#status") == "forgotten" and secret not in browser.page_source
    shoot(browser, console, "forgotten")
    open_user(browser, console, user)
    assert not browser.find_elements(By.ID, f"note-{note}") and "1 note" in text(browser, "#notes .count")
    assert "4711" not in console.output()


def test_a_new_save_arrives_live(browser: WebDriver, console: Console) -> None:
    user = user_id()
    console.bus(lambda client: client.save(user, "Ada reads Byron's letters", category="books"))
    open_user(browser, console, user)
    wait_for(browser, lambda d: d.find_element(By.ID, "live").get_attribute("data-state") == "on")
    saves_before = int(browser.find_elements(By.CSS_SELECTOR, "#chart .day")[-1].get_attribute("data-saves") or 0)
    harp = "Ada plays the harp on Sundays"
    written = console.bus(lambda client: client.save(user, harp, category="music", origin=Origin(channel="sms")))
    # The event, then the refreshed list and chart, without a reload.
    row = wait_for(
        browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"#live li.note_saved[data-note='{written.note_id}']")
    )
    assert "sms" in row[0].text
    wait_for(browser, lambda d: d.find_elements(By.ID, f"note-{written.note_id}"))
    wait_for(
        browser,
        lambda d: (
            int(d.find_elements(By.CSS_SELECTOR, "#chart .day")[-1].get_attribute("data-saves") or 0)
            == saves_before + 1
        ),
    )
    assert harp in text(browser, f"#note-{written.note_id}")
    shoot(browser, console, "live")


def test_the_prompt_block_is_byte_identical_to_engram_context(browser: WebDriver, console: Console) -> None:
    user = user_id()

    async def seed(client: EngramClient) -> None:
        await client.save(user, "Ada's name is Augusta Ada King", category="profile", subject="name")
        await client.save(user, "Ada prefers answers with equations", category="preferences", importance=0.9)
        rule = {"trigger": "asked about engines", "action": "cite Babbage"}
        await client.save(
            user, "When asked about engines, cite Babbage", category="rules", kind=NoteKind.PROCEDURE, **rule
        )

    console.bus(seed)
    browser.get(f"{console.url}/user/context?u={user}")
    wait_for(browser, lambda d: d.find_elements(By.ID, "prompt"))
    prompt = "return document.getElementById('prompt').textContent"
    shown = browser.execute_script(prompt)
    assert shown == cli_text(console.env, "context", "--user", user).stdout
    shoot(browser, console, "context")
    # XML with a budget: the slider's change redraws the block in place.
    browser.find_element(By.CSS_SELECTOR, "#format option[value='xml']").click()
    wait_for(
        browser, lambda d: "<user_memory>" in d.execute_script("return document.getElementById('prompt').textContent")
    )
    browser.execute_script(
        "const r = document.getElementById('budget'); r.value = '120'; r.dispatchEvent(new Event('input'));"
        "r.dispatchEvent(new Event('change', {bubbles: true}));"
    )
    expected = cli_text(console.env, "context", "--user", user, "--format", "xml", "--max-tokens", "120").stdout
    wait_for(browser, lambda d: d.execute_script(prompt) == expected)
    assert text(browser, "#budget-shown") == "120 tokens"
    with httpx.Client(base_url=console.url, timeout=10) as http:
        download = http.post(
            "/user/context.txt",
            data={"u": user, "format": "xml", "max_tokens": "120"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    assert download.status_code == 200 and download.content == expected.encode()


def test_erasing_a_user_asks_twice_and_gives_a_receipt(browser: WebDriver, console: Console) -> None:
    user = user_id()

    async def seed(client: EngramClient) -> None:
        for n in range(3):
            await client.save(user, f"Ada's note number {n}", category="general")

    console.bus(seed)
    browser.get(f"{console.url}/user/erase?u={user}")
    wait_for(browser, lambda d: d.find_element(By.ID, "confirm-user")).send_keys(user)
    browser.find_element(By.ID, "erase-request").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "erase-confirm"))
    assert "Nothing is deleted yet" in text(browser, "#pending")
    shoot(browser, console, "erase-pending")
    assert console.bus(lambda client: client.list_notes(user)).total == 3
    browser.find_element(By.ID, "confirm-user").send_keys(user)
    browser.find_element(By.ID, "erase-confirm").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "receipt"))
    assert text(browser, "#receipt-count") == "3"
    assert console.bus(lambda client: client.list_notes(user)).total == 0
    shoot(browser, console, "erase")
    # Every user this module made, most recently active first, and the log's latest events.
    browser.get(console.url + "/")
    wait_for(browser, lambda d: d.find_element(By.ID, "live").get_attribute("data-state") == "on")
    assert text(browser, "#users li:first-child .user-link") == user
    assert "erased" in text(browser, "#users li:first-child")
    shoot(browser, console, "users")


def test_the_memories_as_of_a_moment_what_changed_and_a_revert(browser: WebDriver, console: Console) -> None:
    user = user_id()

    async def seed(client: EngramClient) -> tuple[str, str, str]:
        note = await client.save(user, "Grace writes her compilers in COBOL", category="work")
        # A moment the console can name (to the second) between the save and the update.
        await asyncio.sleep(0.05)
        then = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
        await asyncio.sleep(1.1)
        await client.update(user, note.note_id, content="Grace writes her compilers in Rust", expected_version=1)
        await client.save(user, "Grace adopted a greyhound", category="home")
        await client.save(
            user, "Grace lived in Arlington", category="home", valid_until=datetime(1969, 1, 1, tzinfo=UTC)
        )
        return note.note_id, then.isoformat(), note.token

    note, then, _ = console.bus(seed)
    # The memories page as of a moment: the note as it was, the later one absent.
    browser.get(f"{console.url}/user?u={user}&as_of={then[:19]}")
    wait_for(browser, lambda d: d.find_elements(By.ID, "as-of-banner"))
    assert "The memory as it was at" in text(browser, "#as-of-banner")
    assert text(browser, f"#note-{note} .content") == "Grace writes her compilers in COBOL"
    assert "greyhound" not in text(browser, "#notes") and "1–1 of 1 note" in text(browser, "#notes .count")
    # A datetime-local input leaves out seconds that are zero.
    shown = browser.find_element(By.ID, "as-of").get_attribute("value")
    assert shown == (then[:16] if then[17:19] == "00" else then[:19])
    shoot(browser, console, "memories-as-of")
    # What changed since then: the update, before and after, and the new note.
    click(browser, By.LINK_TEXT, "what changed since")
    wait_for(browser, lambda d: d.find_elements(By.ID, "change-list"))
    steps = browser.find_elements(By.CSS_SELECTOR, "#change-list .step")
    assert [s.get_attribute("data-version") for s in steps] == ["2", "1", "1"]
    assert steps[0].find_element(By.CSS_SELECTOR, "del").text == "Grace writes her compilers in COBOL"
    assert steps[0].find_element(By.CSS_SELECTOR, "ins").text == "Grace writes her compilers in Rust"
    assert "greyhound" in steps[1].text
    shoot(browser, console, "changes")
    # World time: the memories page says when a fact held.
    open_user(browser, console, user)
    arlington = next(a for a in browser.find_elements(By.CSS_SELECTOR, "#notes .note") if "Arlington" in a.text)
    assert "held until 1969-01-01" in arlington.find_element(By.CSS_SELECTOR, ".validity").text
    # Undo on the timeline: a new version with what version 1 held.
    browser.get(f"{console.url}/note?u={user}&id={note}")
    click(browser, By.ID, "revert-1")
    wait_for(browser, lambda d: d.find_elements(By.ID, "done"))
    assert "version 3 holds what version 1 held" in text(browser, "#done")
    assert text(browser, "#content") == "Grace writes her compilers in COBOL"
    versions = [s.get_attribute("data-version") for s in browser.find_elements(By.CSS_SELECTOR, "#timeline .step")]
    assert versions == ["3", "2", "1"]
    shoot(browser, console, "reverted")
    # The form carries the version it was shown: a revert from a stale page is refused.
    stale = browser.find_elements(By.ID, "revert-2")
    assert (
        stale and stale[0].find_element(By.XPATH, "..").find_element(By.NAME, "version").get_attribute("value") == "3"
    )
    console.bus(lambda client: client.update(user, note, content="Grace writes her compilers in Zig"))
    click(browser, By.ID, "revert-2")
    # The refusal page names the version the form was shown at ("version 3" is on the page before too).
    wait_for(browser, lambda d: "not the expected 3" in d.page_source)
    assert "is at version 4" in browser.page_source


def test_what_an_agent_recalled_by_session(browser: WebDriver, console: Console) -> None:
    user = AUDITED

    async def seed(client: EngramClient) -> tuple[str, str]:
        boss = await client.save(user, "Ada reports to Charles Babbage", category="work")
        code = await client.save(user, "Ada's locker code is 2718", category="private")
        # The floor off: every note is shown, whatever its relevance.
        manager = Origin(channel="tui", session_id="s-9")
        await client.search(user, "who is my manager?", origin=manager, min_relevance=0, after=code.token)
        locker = Origin(channel="whatsapp", session_id="s-10")
        await client.search(user, "locker code", origin=locker, min_relevance=0)
        return boss.note_id, code.note_id

    boss, code = console.bus(seed)
    open_user(browser, console, user)
    click(browser, By.ID, "recalls-link")
    wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#recall-list .recall")) == 2)
    newest, oldest = browser.find_elements(By.CSS_SELECTOR, "#recall-list .recall")
    assert "locker code" in newest.text and "whatsapp" in newest.text and "s-10" in newest.text
    assert "who is my manager?" in oldest.text and "tui" in oldest.text and boss in oldest.text
    shoot(browser, console, "recalls")
    # One session's recalls.
    oldest.find_element(By.CSS_SELECTOR, "a.session").click()
    wait_for(browser, lambda d: "session s-9" in d.find_element(By.CSS_SELECTOR, "#recalls .count").text)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#recall-list .recall")) == 1
    # Forgetting the note a recall showed takes its query with it; the ids stay.
    console.bus(lambda client: client.forget(user, note_ids=[code], confirmed=True))
    browser.get(f"{console.url}/user/recalls?u={user}")
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#recall-list .gone"))
    newest = browser.find_elements(By.CSS_SELECTOR, "#recall-list .recall")[0]
    assert "locker code" not in newest.text and "Its query is gone" in newest.text and code in newest.text
