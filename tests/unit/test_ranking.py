"""The ranking's levers, each with a case it decides: remove the lever and its test fails.
Figures for the choices are in README (LoCoMo, leave-one-conversation-out; bench_quality)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from engram_ledger.services.application.ranking import (
    DEFAULT_POLICY,
    RankingPolicy,
    boost_named,
    boost_period,
    boost_sessions,
    context_text,
    fuse,
    names_in,
    words,
)
from engram_ledger.services.application.vector_index import IndexHit
from engram_ledger.services.application.when import Period, asked_period, time_only


def hit(note_id: str, score: float, context: bool = False) -> IndexHit:
    payload: dict[str, object] = {"note_id": note_id}
    if context:
        payload["context"] = True
    return IndexHit(point_id=f"{note_id}-{int(context)}", score=score, payload=payload)


def order(dense: list[IndexHit], sparse: list[IndexHit], policy: RankingPolicy = DEFAULT_POLICY) -> list[str]:
    return [note_id for note_id, _, _ in fuse(dense, sparse, policy)]


# Dialogue: "When did Caroline go to the LGBTQ support group?". The turn that says so shares a
# rare name and rare words with the question (a strong BM25 score), while small talk sits a
# little nearer in meaning (dense cosines are close together on dialogue).
DIALOGUE_DENSE = [hit("smalltalk", 0.52), hit("other", 0.50), hit("evidence", 0.47), hit("far", 0.20)]
DIALOGUE_SPARSE = [hit("evidence", 38.0), hit("smalltalk", 4.0)]


def test_scaled_fusion_lets_a_strong_keyword_match_win() -> None:
    assert order(DIALOGUE_DENSE, DIALOGUE_SPARSE)[0] == "evidence"
    before = RankingPolicy(method="score", dense_weight=1.0, keyword_weight=0.1)
    assert order(DIALOGUE_DENSE, DIALOGUE_SPARSE, before)[0] == "smalltalk", "the old fusion buried it"


# A paraphrase: "who is my manager at work?" against "Alec is my boss": only a note that shares
# one common word ("work") matches by keyword, weakly, and it is the only keyword match.
PARAPHRASE_DENSE = [hit("boss", 0.62), hit("work", 0.35), hit("coffee", 0.10)]
PARAPHRASE_SPARSE = [hit("work", 5.0)]


def test_a_lone_weak_keyword_match_does_not_count_as_a_strong_one() -> None:
    assert order(PARAPHRASE_DENSE, PARAPHRASE_SPARSE)[0] == "boss"
    no_floor = replace(DEFAULT_POLICY, keyword_floor=0.0)
    assert order(PARAPHRASE_DENSE, PARAPHRASE_SPARSE, no_floor)[0] == "work", "scaled to 1.0 without the floor"


def test_a_turn_matching_by_its_own_words_outranks_one_matching_only_in_context() -> None:
    # "own" says it; "next" only follows it, so its context point repeats the same words.
    dense = [hit("own", 0.60), hit("next", 0.61, context=True), hit("next", 0.30), hit("far", 0.1)]
    sparse = [hit("own", 20.0), hit("next", 20.5, context=True)]
    assert order(dense, sparse)[0] == "own"
    unweighted = replace(DEFAULT_POLICY, context_weight=1.0)
    assert order(dense, sparse, unweighted)[0] == "next"


def test_a_turn_found_only_through_its_context_is_still_found() -> None:
    dense = [hit("reply", 0.55, context=True), hit("reply", 0.05), hit("noise", 0.30)]
    sparse = [hit("reply", 25.0, context=True)]
    assert order(dense, sparse)[0] == "reply"


def test_each_note_appears_once_with_its_best_point_and_ties_break_by_id() -> None:
    ranked = fuse([hit("b", 0.5), hit("a", 0.5), hit("b", 0.4)], [], DEFAULT_POLICY)
    assert [n for n, _, _ in ranked] == ["a", "b"]
    assert [cos for _, _, cos in ranked] == [0.5, 0.5]


def test_context_text_puts_the_turns_before_first() -> None:
    assert context_text("Ann: Mount Tam", ["Ann: I went hiking", "Bob: Where?"]) == (
        "Ann: I went hiking\nBob: Where?\nAnn: Mount Tam"
    )


def test_naming_the_speaker_or_subject_lifts_that_candidate() -> None:
    ranked = [("melanie", 0.50, 0.4), ("caroline", 0.45, 0.4)]
    names = {"melanie": "Melanie", "caroline": "Caroline"}
    lifted = boost_named(ranked, names, "What did Caroline say about the support group?", DEFAULT_POLICY.name_boost)
    assert [n for n, _, _ in lifted] == ["caroline", "melanie"]
    assert [n for n, _, _ in boost_named(ranked, names, "What did Caroline say?", 0.0)] == ["melanie", "caroline"]
    assert not names_in(words("Carol went home"), "Caroline"), "whole words only"
    assert names_in(words("what did mary ann say"), "Mary Ann") and not names_in(words("mary said"), "Mary Ann")


def test_near_duplicates_stay_near_so_a_rare_keyword_tells_them_apart() -> None:
    # "user1 remembers the secret codeword kumquat3user1" among five like it: the cosines differ
    # by noise, and only the target holds the queried word (a weak score in a small collection).
    dense = [hit("dup-a", 0.62), hit("target", 0.60), hit("dup-b", 0.59), hit("dup-c", 0.58)]
    sparse = [hit("target", 5.0)]
    assert order(dense, sparse)[0] == "target"
    assert order(dense, sparse, replace(DEFAULT_POLICY, dense_span=0.0))[0] == "dup-a", "noise scaled to 0-1"


def test_a_turn_whose_session_holds_another_strong_candidate_is_lifted() -> None:
    # "When did Melanie go camping?": the answer sits beside the turn that names the trip, in
    # one session; an equally scored turn alone in another session stays behind.
    ranked = [("lone", 0.50, 0.4), ("names-trip", 0.48, 0.5), ("answer", 0.45, 0.4), ("noise", 0.10, 0.1)]
    sessions = {"lone": "s1", "names-trip": "s2", "answer": "s2", "noise": "s3"}
    lifted = [n for n, _, _ in boost_sessions(ranked, sessions, DEFAULT_POLICY.session_boost)]
    assert lifted[:2] == ["names-trip", "answer"] and lifted.index("answer") < lifted.index("lone")
    assert [n for n, _, _ in boost_sessions(ranked, sessions, 0.0)] == [n for n, _, _ in ranked]
    # A note has no session: it neither gains nor lends.
    assert boost_sessions([("note", 0.5, 0.5), ("turn", 0.4, 0.4)], {"turn": "s1"}, 0.2)[0][0] == "note"


def test_what_happened_in_the_period_the_query_names_comes_first() -> None:
    ranked = [("march", 0.60, 0.6), ("october", 0.40, 0.4), ("may", 0.30, 0.3)]
    within = {"march": False, "october": True, "may": False}
    assert next(n for n, _, _ in boost_period(ranked, within, DEFAULT_POLICY.time_boost)) == "october"
    assert next(n for n, _, _ in boost_period(ranked, within, 0.0)) == "march", "without the lever"
    assert boost_period(ranked, dict.fromkeys(within, False), 0.5) == ranked


def test_the_time_a_query_names_is_read_as_a_period() -> None:
    now = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    month = asked_period("What setback did Melanie face in October 2023?", now)
    assert month == Period(datetime(2023, 10, 1, tzinfo=UTC), datetime(2023, 11, 1, tzinfo=UTC))
    day = asked_period("What did Gina find for her store on 1 February, 2023?", now)
    assert (
        day is not None and day.holds(datetime(2023, 2, 1, tzinfo=UTC)) and day.holds(datetime(2023, 2, 8, tzinfo=UTC))
    )
    assert not day.holds(datetime(2023, 2, 10, tzinfo=UTC))
    assert asked_period("How many times has Melanie gone to the beach in 2023?", now) == Period(
        datetime(2023, 1, 1, tzinfo=UTC), datetime(2024, 1, 1, tzinfo=UTC)
    )
    june = asked_period("When did Melanie go camping in June?", now)
    assert june == Period(month=6) and june.holds(datetime(2021, 6, 9, tzinfo=UTC))
    week = asked_period("what did I do last week?", now)
    assert week is not None and week.holds(datetime(2026, 11, 21, tzinfo=UTC)) and not week.holds(now)
    for nothing in ("Who is my boss?", "May I ask what Caroline likes?", "What did Melanie paint?"):
        assert asked_period(nothing, now) is None, nothing


def test_dates_weeks_and_spans_are_read_as_what_a_person_means() -> None:
    now = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)  # a Friday
    iso = asked_period("what did I do on 2023-05-14?", now)
    assert (
        iso is not None
        and iso.holds(datetime(2023, 5, 14, 9, tzinfo=UTC))
        and not iso.holds(datetime(2023, 6, 1, tzinfo=UTC))
    )
    ago = asked_period("who did I meet 2 months ago?", now)
    assert ago == Period(datetime(2026, 9, 1, tzinfo=UTC), datetime(2026, 10, 1, tzinfo=UTC)), (
        "that month, not every September"
    )
    this_week = asked_period("what happened this week?", now)
    assert this_week is not None and this_week.holds(now) and this_week.holds(datetime(2026, 11, 23, tzinfo=UTC))
    span = asked_period("what did I read between March 2023 and May 2023?", now)
    assert span == Period(datetime(2023, 3, 1, tzinfo=UTC), datetime(2023, 6, 1, tzinfo=UTC))
    # A time recorded without a zone is read as UTC rather than refused.
    assert span.holds(datetime(2023, 4, 2, 10, 0))


def test_a_question_about_a_time_alone_is_told_from_one_about_something_then() -> None:
    assert time_only("What did I do in May 2023?") and time_only("What happened last week?")
    assert not time_only("What did Melanie paint in October 2023?")
    assert not time_only("Who is my boss?"), "no time at all"
