"""The recall audit: where the deployment asks for it (``ENGRAM_RECALL_AUDIT``), each search
and memory block served records what it showed (``MemoryRecalled``), so "why did the agent say
that on Tuesday?" is answered by what it recalled. Recording is best effort: a failure is
logged, and the search is still answered.

A recall's query goes with the notes it is about: those it showed, and those whose subject it
names ("where does Alec work now" is about every note whose subject is Alec, shown or not), so
its key is drawn from all of theirs (services/adapters/crypto.py, ``recall_key``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from engram_ledger.contracts.model import Origin
from engram_ledger.services.application.ports import Appended, EventStore
from engram_ledger.services.application.vector_index import DENSE, NearestQuery, SearchableIndex
from engram_ledger.services.domain.recalls import new_recall_id, recorded, subject_phrases

log = logging.getLogger("engram.recalls")

# The channel the console's own searches and blocks name: a person looking, not an agent's
# recall, so never recorded.
CONSOLE = "console"
# Index points read to find the notes a query names by subject; a query that names more (the
# answer fills this) is not kept, as its notes cannot all be told.
NAMED_POINTS_MAX = 2048


class RecallAudit:
    def __init__(self, store: EventStore, audited: Callable[[str], bool], clock: Callable[[], datetime]) -> None:
        """``audited``: whether a user's recalls are recorded."""
        self._store = store
        self._audited = audited
        self._clock = clock

    def audits(self, user_id: str) -> bool:
        return self._audited(user_id)

    async def record(
        self,
        user_id: str,
        kind: str,
        query: str | None,
        shown: Sequence[tuple[str, int]],
        origin: Origin | None,
        subjects: SearchableIndex | None = None,
    ) -> str | None:
        """Record one recall; returns its id (None: not recorded). ``subjects``: the index the
        notes a query names by subject are found in (None: they cannot be, and the query's
        text is not kept)."""
        if not self._audited(user_id) or (origin is not None and origin.channel == CONSOLE):
            return None
        named = await self._named(subjects, user_id, query) if query is not None and shown else []
        append = recorded(user_id, new_recall_id(), kind, query, shown, origin, self._clock(), named)
        try:
            result = await self._store.append(user_id, append.note_id, [append])
        except Exception:
            log.exception("a recall of user %s could not be recorded", user_id)
            return None
        return append.note_id if isinstance(result, Appended) else None

    @staticmethod
    async def _named(subjects: SearchableIndex | None, user_id: str, query: str) -> list[str] | None:
        if subjects is None:
            return None
        try:
            return await notes_named(subjects, user_id, query)
        except Exception:
            log.exception("the notes a recall of user %s names could not be found: its query is not kept", user_id)
            return None


async def notes_named(subjects: SearchableIndex, user_id: str, query: str) -> list[str] | None:
    """The user's notes (any status the index keeps) whose subject ``query`` names, by the keyed
    hash the index filters subjects on; None when they cannot all be told."""
    phrases = subject_phrases(query)
    if phrases is None:
        return None
    # Ranked by the query's own vector (the search just embedded it: the embedder has it), but
    # only the filter matters: every point of a named subject, up to the bound.
    (dense,) = await subjects.embedder.embed([query])
    hits = await subjects.index.nearest(
        NearestQuery(
            user_id=user_id,
            using=DENSE,
            dense=dense,
            match={"subject_key": [subjects.subject_key(user_id, p) for p in phrases]},
            limit=NAMED_POINTS_MAX,
            fields=["note_id"],
        )
    )
    if len(hits) >= NAMED_POINTS_MAX:
        return None
    return list(dict.fromkeys(str(h.payload["note_id"]) for h in hits))


def audited_users(setting: str) -> Callable[[str], bool]:
    """``ENGRAM_RECALL_AUDIT``: ``off`` (or empty), ``all``, or the user ids to audit, comma-separated."""
    value = setting.strip()
    if value in ("", "off"):
        return lambda user_id: False
    if value == "all":
        return lambda user_id: True
    users = frozenset(u.strip() for u in value.split(",") if u.strip())
    return lambda user_id: user_id in users
