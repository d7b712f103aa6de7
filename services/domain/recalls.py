"""A recall: what a search or a memory block showed an agent, as the log records it where the
deployment audits recalls. Pure: the recall's id and time come from the caller."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from datetime import datetime

from engram_ledger.contracts.events import RECALL_PREFIX, MemoryRecalled
from engram_ledger.contracts.model import Origin
from engram_ledger.services.domain.appends import StreamAppend
from engram_ledger.services.domain.ids import event_id
from engram_ledger.services.domain.values import normalize_subject

# The longest subject, in words, that a query is looked at for (the index holds subjects as
# keyed hashes, so each run of words is hashed and looked up whole).
SUBJECT_WORDS_MAX = 8
# Beyond this many runs of words a query is not checked, and so not kept (a query of the most
# characters a search takes, in ordinary words, makes fewer).
SUBJECT_PHRASES_MAX = 8192
_WORD = re.compile(r"\w+")
# What a word in running text may have around it that a subject would not ("Smith," "(Alec)");
# a period stays: "Dr." is a subject's word as written.
_AROUND = "\"'()[]{},;:!?"


def new_recall_id() -> str:
    return f"{RECALL_PREFIX}{uuid.uuid4().hex}"


def subject_phrases(query: str) -> list[str] | None:
    """Every run of up to ``SUBJECT_WORDS_MAX`` words of the query, as ``normalize_subject``
    makes a subject: what it could name. Words are read three ways: as the white space cuts them,
    without the punctuation around them ("Dr. Smith," names "Dr. Smith"), and as letters and
    digits alone ("Alec's" names "Alec"). None: too many to look up."""
    spaced = query.split()
    phrases: dict[str, None] = {}
    for words in (spaced, [w.strip(_AROUND) for w in spaced], _WORD.findall(query)):
        for start in range(len(words)):
            for end in range(start + 1, min(start + SUBJECT_WORDS_MAX, len(words)) + 1):
                phrases[normalize_subject(" ".join(words[start:end]))] = None
        if len(phrases) > SUBJECT_PHRASES_MAX:
            return None
    return list(phrases)


def recorded(
    user_id: str,
    recall_id: str,
    kind: str,
    query: str | None,
    shown: Sequence[tuple[str, int]],
    origin: Origin | None,
    now: datetime,
    named: Sequence[str] | None = (),
) -> StreamAppend:
    """The recall's own stream, version 1: ``shown`` is each note or turn shown, with its
    version; ``named``, the notes not shown whose subject the query names (None: not known).
    The query's text is kept only where the notes its key is drawn from say all it is about: a
    recall that showed nothing, or whose named notes are not known, records that it was asked
    (an empty query) and not what."""
    ids = [note_id for note_id, _ in shown]
    kept = query is not None and bool(shown) and named is not None
    event = MemoryRecalled(
        event_id=event_id(user_id, recall_id, 1),
        note_id=recall_id,
        user_id=user_id,
        version=1,
        command_id=recall_id,
        at=now,
        origin=origin,
        kind=kind,
        notes=ids,
        versions=[version for _, version in shown],
        query=query if kept or query is None else "",
        named=[n for n in dict.fromkeys(named or ()) if n not in ids] if kept else [],
    )
    return StreamAppend(note_id=recall_id, expected_version=0, events=[event])
