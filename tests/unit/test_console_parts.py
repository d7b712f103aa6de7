"""The console's pure parts: its sessions and CSRF tokens, what it learns from the log (users,
activity per day, pending deletions, receipts), and how a note's versions become a timeline."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import (
    ACCOUNT,
    ForgetExpired,
    ForgetRequested,
    NoteForgotten,
    NoteSaved,
    UserForgotten,
)
from engram_ledger.contracts.model import NoteKind, NoteSource, NoteStatus, NoteView, Origin, VersionView
from engram_ledger.services.console import auth
from engram_ledger.services.console.auth import ConsoleAuth, check_token, safe_next
from engram_ledger.services.console.live import LogEvent, LogWatch
from engram_ledger.services.console.notes import timeline
from engram_ledger.services.console.users import grouped

TOKEN = "unit-console-token-0123456789"
NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def test_a_session_cookie_opens_only_under_its_token_and_until_it_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = ConsoleAuth(TOKEN)
    cookie = gate.new_session()
    sid = gate.session_id(cookie)
    assert sid is not None and TOKEN not in cookie
    assert ConsoleAuth(TOKEN).session_id(cookie) == sid, "a restart with the same token keeps sessions"
    assert ConsoleAuth(TOKEN + "-new").session_id(cookie) is None, "a new token ends them"
    head, issued, mac = cookie.split(".")
    for forged in (
        f"{head}x.{issued}.{mac}",
        f"{head}.{int(issued) + 99}.{mac}",
        f"{head}.{issued}.{mac[:-1]}{'1' if mac.endswith('0') else '0'}",
        "",
        "a.b",
    ):
        assert gate.session_id(forged) is None, forged
    later = int(issued) + auth.SESSION_SECONDS + 1
    monkeypatch.setattr(auth.time, "time", lambda: later)
    assert gate.session_id(cookie) is None, "expired"


def test_each_session_has_its_own_csrf_token() -> None:
    gate = ConsoleAuth(TOKEN)
    one, two = (gate.session_id(gate.new_session()) for _ in range(2))
    assert one and two and gate.csrf(one) != gate.csrf(two)
    assert gate.csrf(one) == ConsoleAuth(TOKEN).csrf(one)


def test_credentials_are_read_from_the_bearer_header_or_the_cookie() -> None:
    gate = ConsoleAuth(TOKEN)
    assert gate.who({"headers": [(b"authorization", f"Bearer {TOKEN}".encode())]}).how == "bearer"  # type: ignore[union-attr]
    assert gate.who({"headers": [(b"authorization", f"Basic {TOKEN}".encode())]}) is None
    assert gate.who({"headers": [(b"authorization", b"Bearer nope")]}) is None
    cookie = f"theme=dark; {auth.COOKIE}={gate.new_session()}".encode()
    who = gate.who({"headers": [(b"cookie", cookie)]})
    assert who is not None and who.how == "session" and who.csrf
    assert gate.who({"headers": []}) is None


def test_a_weak_console_token_is_refused_in_words() -> None:
    for weak in ("short", " padded-token-0123456789 ", ""):
        with pytest.raises(EngramError) as refused:
            check_token(weak)
        assert refused.value.code is ErrorCode.INVALID_PARAMETER and "ENGRAM_CONSOLE_TOKEN" in refused.value.message
    assert len(auth.new_token()) >= auth.MIN_TOKEN_CHARS


def test_after_logging_in_only_a_path_of_this_site_is_followed() -> None:
    assert safe_next("/user?u=alice") == "/user?u=alice"
    for away in ("//evil.example/x", "https://evil.example", "/\\evil.example", "", None, "user"):
        assert safe_next(away) == "/", away


def _event(cls: type, note_id: str, at: datetime, version: int = 1, user: str = "alice", **fields: object) -> object:
    return cls(
        event_id=f"e-{note_id}-{version}",
        note_id=note_id,
        user_id=user,
        version=version,
        command_id="c",
        at=at,
        **fields,
    )


def _apply(watch: LogWatch, event: object, position: int) -> None:
    e = event  # type: ignore[assignment]
    shown = LogEvent(
        type=str(e.__struct_config__.tag),  # type: ignore[attr-defined]
        user_id=e.user_id,  # type: ignore[attr-defined]
        note_id=e.note_id,  # type: ignore[attr-defined]
        version=e.version,  # type: ignore[attr-defined]
        at=e.at,  # type: ignore[attr-defined]
        command_id="c",
        channel=None,
        session_id=None,
        token=f"0:{position}-0",
    )
    watch.apply(e, shown)  # type: ignore[arg-type]


def _saved(note_id: str, at: datetime, user: str = "alice") -> object:
    return _event(
        NoteSaved,
        note_id,
        at,
        user=user,
        kind=NoteKind.FACT,
        content="",
        category="general",
        subject=None,
        confidence=1.0,
        source=NoteSource.EXPLICIT,
        importance=0.5,
    )


def test_the_log_watch_counts_per_day_and_tracks_pending_deletions_and_receipts() -> None:
    watch = LogWatch(subscription=None)  # type: ignore[arg-type]
    yesterday = NOW - timedelta(days=1)
    _apply(watch, _saved("aaaaaaaa", yesterday), 1)
    _apply(watch, _saved("bbbbbbbb", NOW), 2)
    _apply(watch, _saved("cccccccc", NOW, user="bob"), 3)
    expires = NOW + timedelta(minutes=5)
    _apply(watch, _event(ForgetRequested, "aaaaaaaa", NOW, 2, request_count=1, expires_at=expires), 4)
    _apply(watch, _event(ForgetRequested, "bbbbbbbb", NOW, 2, request_count=1, expires_at=expires), 5)
    [first, second] = watch.pending("alice")
    assert second.note_id == "bbbbbbbb"
    assert (first.note_id, first.expires_at, first.request_count) == ("aaaaaaaa", expires, 1)
    _apply(watch, _event(ForgetExpired, "aaaaaaaa", NOW, 3, reason="expired"), 6)
    _apply(watch, _event(NoteForgotten, "bbbbbbbb", NOW, 3, request_count=2), 7)
    assert watch.pending("alice") == []
    chart = watch.chart("alice", days=3, today=NOW.date())
    assert [(d.day, d.saves, d.updates, d.forgets) for d in chart] == [
        (date(2026, 3, 8), 0, 0, 0),
        (date(2026, 3, 9), 1, 0, 0),
        (date(2026, 3, 10), 1, 0, 1),
    ]
    # Most recently active first (ties by id, descending), and found by any part of the id.
    assert [u.user_id for u in watch.users()[0]] == ["bob", "alice"] and watch.users()[1] == 2
    assert [u.user_id for u in watch.users("BO")[0]] == ["bob"]
    _apply(watch, _event(ForgetRequested, ACCOUNT, NOW, 1, user="bob", request_count=1, expires_at=expires), 8)
    assert [p.note_id for p in watch.pending("bob")] == [ACCOUNT]
    _apply(watch, _event(UserForgotten, ACCOUNT, NOW, 2, user="bob", erased=["cccccccc"]), 9)
    bob = watch.user("bob")
    assert bob is not None and bob.receipt is not None and bob.receipt.erased == 1 and watch.pending("bob") == []
    assert watch.events_read == 9 and len(watch.recent) == 9


def test_the_log_watch_keeps_a_bounded_number_of_days_per_user() -> None:
    watch = LogWatch(subscription=None)  # type: ignore[arg-type]
    for back in range(100):
        _apply(watch, _saved(f"n{back:07d}", NOW - timedelta(days=back)), back + 1)
    user = watch.user("alice")
    assert user is not None and len(user.days) == 60 and min(user.days) == (NOW - timedelta(days=59)).date()
    assert len(user.recent) == 25


def _version(version: int, change: str, content: str, **fields: object) -> VersionView:
    values: dict[str, object] = {
        "category": "work",
        "subject": None,
        "status": NoteStatus.ACTIVE,
        "created_at": NOW + timedelta(minutes=version),
        "command_id": f"cmd-{version}",
        "origin": Origin(channel="tui"),
    }
    values.update(fields)
    return VersionView(version=version, change=change, content=content, **values)  # type: ignore[arg-type]


def test_a_timeline_is_newest_first_with_what_each_version_changed() -> None:
    versions = [
        _version(1, "saved", "Ada works at the lab"),
        _version(2, "updated", "Ada leads the lab", subject="job"),
        _version(
            3, "superseded", "Ada leads the lab", subject="job", status=NoteStatus.SUPERSEDED, superseded_by="Bbbbbbbb"
        ),
        _version(
            4,
            "forget_requested",
            "Ada leads the lab",
            subject="job",
            status=NoteStatus.SUPERSEDED,
            superseded_by="Bbbbbbbb",
        ),
    ]
    until = NOW + timedelta(minutes=9)
    steps = timeline(versions, until)
    assert [s.version.version for s in steps] == [4, 3, 2, 1]
    assert steps[0].fields == [] and steps[0].pending_until == until
    assert steps[1].fields == [("status", "active", "superseded"), ("superseded_by", None, "Bbbbbbbb")]
    assert steps[2].fields == [("content", "Ada works at the lab", "Ada leads the lab"), ("subject", None, "job")]
    assert steps[3].fields == [] and steps[3].pending_until is None
    assert timeline(versions[:3], until)[0].pending_until is None, "only a request still last is pending"


def test_a_page_of_the_listing_is_grouped_by_category_then_kind() -> None:
    def note(note_id: str, category: str, kind: NoteKind) -> NoteView:
        return NoteView(
            id=note_id,
            user_id="alice",
            kind=kind,
            content="",
            category=category,
            subject=None,
            confidence=1.0,
            source=NoteSource.EXPLICIT,
            importance=0.5,
            created_at=NOW,
            updated_at=NOW,
            last_accessed_at=None,
            version=1,
            status=NoteStatus.ACTIVE,
            supersedes=[],
            superseded_by=None,
        )

    page = [
        note("a0000001", "food", NoteKind.PROCEDURE),
        note("a0000002", "food", NoteKind.FACT),
        note("a0000003", "work", NoteKind.EPISODE),
    ]
    shown = [(c, [(k, [n.id for n in ns]) for k, ns in kinds]) for c, kinds in grouped(page)]
    assert shown == [
        ("food", [("fact", ["a0000002"]), ("procedure", ["a0000001"])]),
        ("work", [("episode", ["a0000003"])]),
    ]


def test_a_logout_ends_the_session_for_good_a_restart_and_a_copied_cookie_included(tmp_path: Path) -> None:
    ended = tmp_path / "state" / "console-ended-sessions"
    auth = ConsoleAuth(TOKEN, ended)
    gone, kept = auth.new_session(), auth.new_session()
    auth.end_session(gone)
    assert auth.session_id(gone) is None and auth.session_id(kept) is not None
    restarted = ConsoleAuth(TOKEN, ended)  # the same token, the same data dir
    assert restarted.session_id(gone) is None, "a restart keeps the logout"
    assert restarted.session_id(kept) is not None, "and every session not logged out of"
    assert ended.stat().st_mode & 0o777 == 0o600 and ended.parent.stat().st_mode & 0o777 == 0o700
    assert TOKEN not in ended.read_text()
