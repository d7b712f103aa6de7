"""The relevance estimate on hits shaped like what people ask: each signal moves it the way a
person reading the hit would, and the floor falls between "nothing I hold" and "here it is"."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engram_ledger.services.application.relevance import DEFAULT_FLOOR, MODEL, Signals, features, proper_names


def estimate(query: str, *hits: Signals) -> list[float]:
    return MODEL.estimate(features(query, list(hits)))


def note(similarity: float, text: str, name: str | None = None, within: bool = False) -> Signals:
    return Signals(similarity=similarity, conversation=False, text=text, name=name, within=within)


def test_the_best_hit_of_a_question_about_nothing_held_is_below_the_floor() -> None:
    # A small memory: an unrelated question's best hit is the least unrelated note, near cosine 0.15.
    unrelated = estimate("what car do I drive?", note(0.16, "I moved to Rotterdam in 2021"), note(0.12, "cello"))
    assert max(unrelated) < DEFAULT_FLOOR


def test_a_paraphrase_with_no_shared_word_is_above_the_floor() -> None:
    (boss, cello) = estimate("who do I report to at work?", note(0.45, "Alec: Alec is my boss"), note(0.2, "cello"))
    assert boss > DEFAULT_FLOOR > cello


def test_a_hit_about_whom_the_query_names_is_more_relevant_than_one_lacking_the_name() -> None:
    (about, lacking) = estimate(
        "what does Alec do?", note(0.5, "Alec: works on the platform team", name="Alec"), note(0.5, "Maria works")
    )
    assert about > DEFAULT_FLOOR and lacking < about
    (no_name,) = estimate("what does Alec do?", note(0.5, "Maria: works on the platform team", name="Maria"))
    (with_name,) = estimate("what does Alec do?", note(0.5, "Alec: works on the platform team", name="Alec"))
    assert with_name > no_name


def test_a_month_or_a_day_in_the_query_is_not_a_name_a_note_lacks() -> None:
    assert proper_names("What did I do in May 2023, on Friday?") == set()
    assert proper_names("Where did Tess go in June?") == {"tess"}
    assert proper_names("May I ask what Caroline likes?") == {"caroline"}


def test_more_of_the_query_s_words_and_a_closer_cosine_each_raise_it() -> None:
    # Each alone, as the best hit of its search.
    (none,) = estimate("black coffee in the morning", note(0.4, "tea at night"))
    (some,) = estimate("black coffee in the morning", note(0.4, "coffee at night"))
    assert some > none
    (far,) = estimate("my dog's name", note(0.25, "Max is a beagle"))
    (near,) = estimate("my dog's name", note(0.55, "Max is a beagle"))
    assert near > far


@given(
    st.lists(
        st.tuples(st.floats(0, 1), st.booleans(), st.sampled_from(["Alec is my boss", "coffee", "May 2023 in Paris"])),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from(["who is Alec?", "what did I do in May 2023?", "coffee or tea", "nothing at all"]),
)
def test_no_hit_is_more_relevant_than_the_most_its_rank_and_cosine_allow(
    hits: list[tuple[float, bool, str]], query: str
) -> None:
    # What a search skips reading, as no word of it could lift it to the floor, is bounded here.
    signals = [Signals(similarity=s, conversation=c, text=t, name="Alec" if c else None, within=c) for s, c, t in hits]
    best = max(s for s, _, _ in hits)
    for rank, (signal, relevance) in enumerate(zip(signals, MODEL.estimate(features(query, signals)), strict=True), 1):
        for at_most in range(1, rank + 1):
            assert relevance <= MODEL.most(signal.similarity, best, at_most, signal.conversation) + 1e-12
