"""LoCoMo conversations as Engram sees them: turns (one per conversation turn, with speaker and
session time), facts (each session's observations, with the evidence turns they cite) and the
scored questions (categories 1-4, evidence ids normalized as the data set's README says).

Read from ``--data DIR`` (e.g. ``../shared/datasets/locomo-dev``); nothing of the data set is
shipped with Engram."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

_EVIDENCE = re.compile(r"D:?(\d+):0*(\d+)")
_SESSION = re.compile(r"^session_(\d+)$")


@dataclass(frozen=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str
    sent_at: datetime


@dataclass(frozen=True)
class Fact:
    text: str
    speaker: str
    session: int
    occurred_at: datetime
    evidence: frozenset[str]


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    evidence: frozenset[str]


@dataclass
class Conversation:
    name: str
    speakers: tuple[str, str]
    sessions: dict[int, list[Turn]] = field(default_factory=dict)
    facts: list[Fact] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    # Category 5: the answer is not in the conversation (the evidence names what it is confused
    # with); scored apart, never in the overall figures.
    adversarial: list[Question] = field(default_factory=list)

    @property
    def turns(self) -> list[Turn]:
        return [t for s in sorted(self.sessions) for t in self.sessions[s]]


def parse_time(text: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` -> an aware datetime (the data set gives no zone: UTC)."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def evidence_ids(raw: object) -> list[str]:
    items = raw if isinstance(raw, list) else [raw]
    found: list[str] = []
    for item in items:
        if isinstance(item, list):
            found += evidence_ids(item)
        elif isinstance(item, str):
            found += [f"D{s}:{t}" for s, t in _EVIDENCE.findall(item)]
    return list(dict.fromkeys(found))


def turn_text(turn: dict[str, str]) -> str:
    """The turn as an agent would have recorded it: the words, and a shared photo's caption."""
    text = turn["text"].strip()
    caption = turn.get("blip_caption")
    return f"{text} [shares a photo: {caption}]" if caption else text


def load_conversation(path: Path) -> Conversation:
    raw = json.loads(path.read_text())
    c = raw.get("conversation", raw)
    conv = Conversation(name=path.stem, speakers=(c["speaker_a"], c["speaker_b"]))
    for key, value in c.items():
        m = _SESSION.match(key)
        if not m or not value:
            continue
        n = int(m.group(1))
        when = parse_time(c[f"session_{n}_date_time"])
        conv.sessions[n] = [
            Turn(
                dia_id=f"D{n}:{int(t['dia_id'].split(':')[-1])}",
                session=n,
                speaker=t["speaker"],
                text=turn_text(t),
                sent_at=when,
            )
            for t in value
        ]
    known = {t.dia_id for t in conv.turns}
    source = raw if any(k.endswith("_observation") for k in raw) else c
    for key, value in source.items():
        m = re.match(r"^session_(\d+)_observation$", key)
        if not m or not isinstance(value, dict) or int(m.group(1)) not in conv.sessions:
            continue
        n = int(m.group(1))
        for speaker, items in value.items():
            for item in items:
                text, ev = item[0], item[1] if len(item) > 1 else []
                ids = frozenset(i for i in evidence_ids(ev) if i in known)
                conv.facts.append(
                    Fact(
                        text=text.strip(),
                        speaker=speaker,
                        session=n,
                        occurred_at=conv.sessions[n][0].sent_at,
                        evidence=ids,
                    )
                )
    for qa in raw["qa"]:
        category = int(qa["category"])
        ids = frozenset(i for i in evidence_ids(qa.get("evidence", [])) if i in known)
        if ids and category in (1, 2, 3, 4, 5):
            scored = conv.questions if category != 5 else conv.adversarial
            scored.append(Question(text=str(qa["question"]), category=category, evidence=ids))
    return conv


def load(data_dir: Path) -> list[Conversation]:
    return [load_conversation(p) for p in sorted(data_dir.glob("*.json"))]
