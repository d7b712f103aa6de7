"""Which points a read or a write of the index reaches, as conditions both Qdrant adapters turn
into their own filter types: the user always, then a note (from a chunk on), a time window, and
the payload fields a search matches."""

from __future__ import annotations

from dataclasses import dataclass

from engram_ledger.services.application.vector_index import ANY_TIME, Ranges, TimeWindow


@dataclass(frozen=True)
class Condition:
    """One payload field: equal to ``value``, one of ``values``, or within ``gte``..``lte``."""

    key: str
    value: str | None = None
    values: list[str] | None = None
    gte: float | None = None
    lte: float | None = None

    @property
    def is_range(self) -> bool:
        return self.value is None and self.values is None


def conditions(
    user_id: str,
    match: dict[str, str | list[str]],
    note_id: str | None = None,
    from_chunk: int = 0,
    window: TimeWindow = ANY_TIME,
    ranges: Ranges | None = None,
) -> list[Condition]:
    """Every condition a point must meet (all of them)."""
    found = [Condition("user_id", value=user_id)]
    if note_id is not None:
        found.append(Condition("note_id", value=note_id))
    if from_chunk:
        found.append(Condition("chunk", gte=from_chunk))
    if window.since is not None or window.until is not None:
        found.append(Condition("time", gte=window.since, lte=window.until))
    for key, (low, high) in (ranges or {}).items():
        found.append(Condition(key, gte=low, lte=high))
    for key, value in match.items():
        found.append(Condition(key, values=list(value)) if isinstance(value, list) else Condition(key, value=value))
    return found
