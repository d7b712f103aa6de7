"""Reading the past from version histories: a note, a listing and the changes between two moments
as they were (``services/application/as_of.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from engram_ledger.contracts.errors import EngramError
from engram_ledger.contracts.model import NoteKind, NoteSource, NoteStatus, NoteView, VersionView
from engram_ledger.services.application.as_of import (
    Listed,
    Moment,
    changes_between,
    forgotten_by,
    listed,
    listed_as_of,
    listed_then,
    listing_as_of,
    note_as_of,
    parse_moment,
)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def version(
    n: int, minute: int, content: str, change: str, status: NoteStatus = NoteStatus.ACTIVE, **kw: object
) -> VersionView:
    fields: dict[str, object] = dict(
        version=n,
        change=change,
        content=content,
        category="work",
        subject=None,
        status=status,
        created_at=at(minute),
        command_id=f"c{n}",
        position=f"{int(at(minute).timestamp() * 1000)}-0",
        confidence=1.0,
        importance=0.5,
    )
    fields.update(kw)
    return VersionView(**fields)  # type: ignore[arg-type]


VERSIONS = [
    version(1, 0, "Tess works at Acme", "saved"),
    version(2, 10, "Tess works at Initech", "updated", importance=0.9),
    version(3, 20, "Tess works at Initech", "superseded", NoteStatus.SUPERSEDED, superseded_by="BBBBBBBB"),
]
NOW_VIEW = NoteView(
    id="AAAAAAAA",
    user_id="u",
    kind=NoteKind.FACT,
    content="Tess works at Initech",
    category="work",
    subject=None,
    confidence=1.0,
    source=NoteSource.EXPLICIT,
    importance=0.9,
    created_at=at(0),
    updated_at=at(20),
    last_accessed_at=at(30),
    version=3,
    status=NoteStatus.SUPERSEDED,
    supersedes=[],
    superseded_by="BBBBBBBB",
    access_count=4,
)


def test_a_note_reads_as_it_was_at_each_moment() -> None:
    assert note_as_of(NOW_VIEW, VERSIONS, Moment(at(-1))) is None  # not saved yet
    first = note_as_of(NOW_VIEW, VERSIONS, Moment(at(5)))
    assert first is not None
    assert (first.version, first.content, first.status, first.importance) == (
        1,
        "Tess works at Acme",
        NoteStatus.ACTIVE,
        0.5,
    )
    assert first.superseded_by is None and first.updated_at == at(0)
    # Reads are not memory: the past carries no access counts.
    assert first.access_count == 0 and first.last_accessed_at is None
    second = note_as_of(NOW_VIEW, VERSIONS, Moment(at(10)))  # the moment of a change includes it
    assert second is not None and (second.version, second.content, second.importance) == (
        2,
        "Tess works at Initech",
        0.9,
    )
    last = note_as_of(NOW_VIEW, VERSIONS, Moment(at(25)))
    assert last is not None and last.status is NoteStatus.SUPERSEDED and last.superseded_by == "BBBBBBBB"


def test_a_token_names_a_moment_by_log_position_within_one_millisecond() -> None:
    ms = int(at(10).timestamp() * 1000)
    versions = [
        version(1, 10, "first", "saved", position=f"{ms}-3"),
        version(2, 10, "second", "updated", position=f"{ms}-4"),
    ]
    view = msgspec.structs.replace(NOW_VIEW, version=2, status=NoteStatus.ACTIVE, superseded_by=None)
    between = note_as_of(view, versions, parse_moment(f"0:{ms}-3"))
    assert between is not None and between.content == "first"
    after = note_as_of(view, versions, parse_moment(f"0:{ms}-4"))
    assert after is not None and after.content == "second"
    # A token of another partition names its time only.
    assert parse_moment(f"0:{ms}-3").on(1) == Moment(at(10))


def test_a_note_forgotten_since_is_its_tombstone_at_every_moment_it_existed() -> None:
    tombstone = msgspec.structs.replace(NOW_VIEW, status=NoteStatus.FORGOTTEN, content="", version=4, updated_at=at(40))
    assert note_as_of(tombstone, [], Moment(at(5))) == tombstone
    assert note_as_of(tombstone, [], Moment(at(-5))) is None
    # Listed then as a tombstone if it was forgotten after the moment; not if before.
    assert listed_as_of(tombstone, [], Moment(at(5)), include_superseded=False) == tombstone
    assert listed_as_of(tombstone, [], Moment(at(45)), include_superseded=False) is None


def forgotten_within_one_millisecond() -> tuple[NoteView, list[VersionView], int]:
    """A note saved, then forgotten at entry ``<ms>-5`` of the log; the worker stamped the forget
    later in that millisecond than the entry's own time (the start of the millisecond)."""
    ms = int(at(40).timestamp() * 1000)
    forgot_at = at(40) + timedelta(microseconds=700)
    saved = version(1, 0, "", "saved")
    forget = version(2, 40, "", "forgotten", NoteStatus.FORGOTTEN, created_at=forgot_at, position=f"{ms}-5")
    tombstone = msgspec.structs.replace(
        NOW_VIEW, status=NoteStatus.FORGOTTEN, content="", version=2, updated_at=forgot_at, superseded_by=None
    )
    return tombstone, [saved, forget], ms


def test_a_forget_is_part_of_the_moment_its_own_token_names() -> None:
    tombstone, versions, ms = forgotten_within_one_millisecond()
    own, before = parse_moment(f"0:{ms}-5"), parse_moment(f"0:{ms}-4")
    assert forgotten_by(tombstone, versions, own) and not forgotten_by(tombstone, versions, before)
    # The listing as of the forget's token no longer holds it; as of the entry before, its tombstone.
    assert listed_as_of(tombstone, versions, own, include_superseded=False) is None
    then = listed_as_of(tombstone, versions, before, include_superseded=False)
    assert then is not None and then.status is NoteStatus.FORGOTTEN
    # What changed up to the forget's token holds the forget; up to the entry before, nothing.
    since = Moment(at(30))
    (gone,) = changes_between(tombstone, versions, since, own)
    assert (gone.change, gone.version, gone.at) == ("forgotten", 2, tombstone.updated_at)
    assert changes_between(tombstone, versions, since, before) == []
    assert changes_between(tombstone, versions, own, None) == []


def test_a_forget_stamped_before_the_entry_ahead_of_it_is_still_after_that_token() -> None:
    """The worker's clock may run behind the log's: a forget stamped a millisecond before the
    write logged just ahead of it is still after that write's token."""
    tombstone, versions, ms = forgotten_within_one_millisecond()
    early = at(40) - timedelta(milliseconds=1)
    versions[-1] = msgspec.structs.replace(versions[-1], created_at=early)
    tombstone = msgspec.structs.replace(tombstone, updated_at=early)
    before = parse_moment(f"0:{ms}-4")
    assert not forgotten_by(tombstone, versions, before)
    assert listed_as_of(tombstone, versions, before, include_superseded=False) is not None
    assert changes_between(tombstone, versions, Moment(at(30)), before) == []


def test_a_time_counts_a_forget_made_at_or_before_it_to_the_microsecond() -> None:
    tombstone, versions, _ = forgotten_within_one_millisecond()
    forgot_at = tombstone.updated_at
    assert forgotten_by(tombstone, versions, Moment(forgot_at))
    assert not forgotten_by(tombstone, versions, Moment(forgot_at - timedelta(microseconds=1)))
    # A history recorded before the forget's position was kept: its time alone places it.
    assert forgotten_by(tombstone, versions[:1], Moment(forgot_at))
    assert not forgotten_by(tombstone, versions[:1], Moment(forgot_at - timedelta(microseconds=1)))


def test_a_listing_then_is_the_listing_now_with_the_changed_notes_as_they_were() -> None:
    now = [Listed("home", 1, "X"), Listed("work", 5, "Y"), Listed("work", 9, "Z")]
    then_y = msgspec.structs.replace(NOW_VIEW, id="Y", category="hobby", created_at=datetime.fromtimestamp(0.005, UTC))
    order = listing_as_of(now, {"Y": then_y, "N": None}, expired=["Z"])
    assert order == [Listed("hobby", 5, "Y"), Listed("home", 1, "X")]
    assert listed(then_y) == Listed("hobby", 5, "Y")


def test_expired_by_then_or_superseded_then_leave_the_listing() -> None:
    view = msgspec.structs.replace(NOW_VIEW, status=NoteStatus.ACTIVE, expires_at=at(15))
    assert listed_then(view, Moment(at(10)), include_superseded=False)
    assert not listed_then(view, Moment(at(15)), include_superseded=False)
    superseded = msgspec.structs.replace(NOW_VIEW, expires_at=None)
    assert not listed_then(superseded, Moment(at(30)), include_superseded=False)
    assert listed_then(superseded, Moment(at(30)), include_superseded=True)


def test_changes_between_two_moments_say_before_and_after() -> None:
    changes = changes_between(NOW_VIEW, VERSIONS, Moment(at(5)), Moment(at(20)))
    assert [(c.version, c.change) for c in changes] == [(2, "updated"), (3, "superseded")]
    update = changes[0]
    assert update.before is not None and update.before.content == "Tess works at Acme"
    assert update.after is not None and update.after.content == "Tess works at Initech"
    # ``since`` is exclusive, ``until`` inclusive.
    assert [c.version for c in changes_between(NOW_VIEW, VERSIONS, Moment(at(10)), Moment(at(19)))] == []
    forgotten = msgspec.structs.replace(NOW_VIEW, status=NoteStatus.FORGOTTEN, content="", updated_at=at(40))
    (gone,) = changes_between(forgotten, [], Moment(at(30)), None)
    assert gone.change == "forgotten" and gone.after is None


@pytest.mark.parametrize(
    "text", ["2026-03-01T09:00:00", "2026-03-01T09:00:00Z", "2026-03-01T10:00:00+01:00", "2026-03-01 09:00"]
)
def test_times_without_a_zone_are_utc(text: str) -> None:
    assert parse_moment(text).at == T0
    assert parse_moment("2026-03-01").at == datetime(2026, 3, 1, tzinfo=UTC)  # a date: its start


def test_a_moment_that_is_neither_time_nor_token_is_refused() -> None:
    with pytest.raises(EngramError, match=r"is neither an ISO 8601 time .* nor a consistency token"):
        parse_moment("2026-13-45")
