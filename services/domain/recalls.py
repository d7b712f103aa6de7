"""A recall: what a search or a memory block showed an agent, as the log records it where the
deployment audits recalls. Pure: the recall's id and time come from the caller."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from engram_ledger.contracts.events import RECALL_PREFIX, MemoryRecalled
from engram_ledger.contracts.model import Origin
from engram_ledger.services.domain.appends import StreamAppend
from engram_ledger.services.domain.ids import event_id


def new_recall_id() -> str:
    return f"{RECALL_PREFIX}{uuid.uuid4().hex}"


def recorded(
    user_id: str,
    recall_id: str,
    kind: str,
    query: str | None,
    shown: Sequence[tuple[str, int]],
    origin: Origin | None,
    now: datetime,
) -> StreamAppend:
    """The recall's own stream, version 1: ``shown`` is each note or turn shown, with its version."""
    event = MemoryRecalled(
        event_id=event_id(user_id, recall_id, 1),
        note_id=recall_id,
        user_id=user_id,
        version=1,
        command_id=recall_id,
        at=now,
        origin=origin,
        kind=kind,
        notes=[note_id for note_id, _ in shown],
        versions=[version for _, version in shown],
        query=query,
    )
    return StreamAppend(note_id=recall_id, expected_version=0, events=[event])
