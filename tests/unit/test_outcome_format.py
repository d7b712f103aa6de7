"""The stored outcome of a command: what a retry is answered from, kept across releases."""

from __future__ import annotations

import msgspec

from engram_ledger.services.adapters.event_store import decode_outcome
from engram_ledger.services.application.ports import ErasureStep, HeldDraft, NoteForgetStep, Outcome, OutcomeDetail


def test_an_outcome_round_trips_with_its_typed_detail() -> None:
    detail = OutcomeDetail(
        duplicates=[HeldDraft(index=2, note_id="AAAAAAAA", version=3)],
        forget=[NoteForgetStep("BBBBBBBB", "pending", 1, "2026-01-01T00:05:00+00:00")],
        user=ErasureStep(status="forgotten", erased=["CCCCCCCC"], at="2026-01-01T00:00:00+00:00"),
    )
    outcome = Outcome(position="5-0", notes=[("AAAAAAAA", 1)], detail=detail)
    raw = msgspec.json.encode(outcome)
    # The detail's wire name is the one earlier releases stored.
    assert msgspec.json.decode(raw)["extra"]["duplicates"] == [[2, "AAAAAAAA", 3]]
    assert decode_outcome(raw) == outcome


def test_outcomes_stored_by_earlier_releases_still_answer_retries() -> None:
    # cjson wrote an empty list as {}: a batch without duplicates and an erasure of nothing.
    batch = decode_outcome(b'{"position":"1-0","notes":[["AAAAAAAA",1]],"extra":{"duplicates":{}}}')
    assert batch.detail.duplicates == []
    assert batch.notes == [("AAAAAAAA", 1)]
    erased = decode_outcome(
        b'{"position":"2-0","notes":[["_account",2]],"extra":{"user":{"status":"forgotten","erased":{},'
        b'"at":"2026-01-01T00:00:00+00:00"}}}'
    )
    assert erased.detail.user == ErasureStep(status="forgotten", erased=[], at="2026-01-01T00:00:00+00:00")
    forget = decode_outcome(
        b'{"position":"3-0","notes":[["BBBBBBBB",2]],"extra":{"forget":[["BBBBBBBB","forgotten",2,null]]}}'
    )
    assert forget.detail.forget == [NoteForgetStep("BBBBBBBB", "forgotten", 2, None)]
