"""What several test modules build: a saved-note event, fuzzed request bodies, and a mixed workload
sent through the bus. (Reading state back is in tests/support.py.)"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

from hypothesis import strategies as st

from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.contracts.errors import EngramError
from engram_ledger.contracts.events import NoteSaved
from engram_ledger.contracts.model import NoteKind
from engram_ledger.services.bus.client import EngramClient

# Events -----------------------------------------------------------------------------------------

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
USER = "alice"


def saved(note_id: str = "AAAAAAAA", content: str = "Alec is my boss", **kw: object) -> NoteSaved:
    fields: dict[str, object] = dict(
        event_id="e1",
        note_id=note_id,
        user_id=USER,
        version=1,
        command_id="c0",
        at=NOW,
        kind=NoteKind.FACT,
        content=content,
        category="person",
        subject="Alec",
        confidence=1.0,
        source="explicit",
        importance=0.5,
    )
    fields.update(kw)
    return NoteSaved(**fields)  # type: ignore[arg-type]


# Request bodies (hypothesis) ---------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=20,
)
TAGS = [
    "get_note",
    "list_notes",
    "search_notes",
    "build_context",
    "save_note",
    "save_notes",
    "update_note",
    "supersede_note",
    "revert_note",
    "diff_notes",
    "record_message",
    "request_forget",
    "nope",
]
bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"type": st.sampled_from(TAGS), "command_id": st.text(max_size=20), "user_id": st.text(max_size=20)},
        optional={"content": st.text(max_size=60), "note_id": st.text(max_size=10), "notes": json_values},
    ).map(lambda v: json.dumps(v).encode()),
)


# A workload through the bus ---------------------------------------------------------------------


async def mixed_workload(client: EngramClient, users: int = 6, steps: int = 120, seed: int = 7) -> str:
    """Saves, updates (some with category or subject changes), supersedes and batches across users;
    every 7th step also a put by key (some keys put again), every 11th a conversation turn (every
    other one retracted). Returns the last token."""
    rng = random.Random(seed)
    notes: dict[str, list[str]] = {f"user-{u}": [] for u in range(users)}
    token = ""
    for step in range(steps):
        user = rng.choice(list(notes))
        mine = notes[user]
        roll = rng.random()
        try:
            if roll < 0.4 or len(mine) < 2:
                reply = await client.save(
                    user, f"fact {step} about {user}", category=rng.choice(["person", "project", "context"])
                )
                mine.append(reply.note_id)
            elif roll < 0.75:
                reply = await client.update(
                    user,
                    rng.choice(mine),
                    content=f"changed at {step}",
                    category=rng.choice([None, "preference"]),
                    subject=rng.choice([None, "Sam"]),
                )
            elif roll < 0.9:
                old, new = rng.sample(mine, 2)
                reply = await client.supersede(user, old, new)
                mine.remove(old)
            else:
                batch = await client.save_many(user, [NoteDraft(content=f"batch {step}.{i}") for i in range(3)])
                mine.extend(n.note_id for n in batch.notes)
                reply = batch  # type: ignore[assignment]
            token = reply.token
            if step % 7 == 0:
                token = (
                    await client.put(user, "kv/items", f"k{step % 3}", {"step": step, "text": f"item {step}"})
                ).token
            if step % 11 == 0:
                turn = await client.record_message(user, f"s{step % 2}", f"turn {step}", item={"step": step})
                token = turn.token
                if step % 22 == 0:
                    token = (await client.retract_message(user, turn.note_id)).token
        except EngramError:
            pass  # superseding a note that another step superseded: refusals are part of the mix
    return token
