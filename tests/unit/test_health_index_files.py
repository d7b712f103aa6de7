"""What `engram health` says of deleted points still in the index's files (the workers' reports
folded into one answer): complete only when nothing is owed and the index has applied every log
entry (an entry it has not applied may be a forget)."""

from __future__ import annotations

from engram_ledger.services.observability.health import OVERDUE_SECONDS, _index_files

NOW = 1_800_000_000.0


def worker(owed: str | None = None, rewritten: str | None = "2027-01-15T07:59:00+00:00") -> dict[str, object]:
    return {"index_files": {"owed_since": owed, "rewritten_at": rewritten, "bound_seconds": 60.0}}


def test_complete_only_when_nothing_is_owed_and_the_index_has_applied_the_log() -> None:
    assert _index_files([worker()], NOW, unapplied=0) == {
        "removal": "complete",
        "bound_seconds": 60.0,
        "last_rewritten_at": "2027-01-15T07:59:00Z",
    }
    waiting = _index_files([worker()], NOW, unapplied=3)
    assert waiting is not None and waiting["removal"] == "pending" and "3 log entries" in waiting["waiting_for"]


def test_owed_is_pending_until_its_bound_then_overdue() -> None:
    owed = "2027-01-15T08:00:00+00:00"  # NOW is 08:00:00 on that day
    pending = _index_files([worker(owed)], NOW, unapplied=0)
    assert pending is not None and pending["removal"] == "pending" and pending["due_by"] == "2027-01-15T08:01:00Z"
    late = _index_files([worker(owed)], NOW + 60 + OVERDUE_SECONDS + 1, unapplied=0)
    assert late is not None and late["removal"] == "overdue"


def test_no_report_of_index_files_says_nothing() -> None:
    assert _index_files([{"roles": ["history"]}], NOW, unapplied=0) is None
