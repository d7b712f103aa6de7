"""The recall audit: where the deployment asks for it (``ENGRAM_RECALL_AUDIT``), each search
and memory block served records what it showed (``MemoryRecalled``), so "why did the agent say
that on Tuesday?" is answered by what it recalled. Recording is best effort: a failure is
logged, and the search is still answered."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from engram_ledger.contracts.model import Origin
from engram_ledger.services.application.ports import Appended, EventStore
from engram_ledger.services.domain.recalls import new_recall_id, recorded

log = logging.getLogger("engram.recalls")

# The channel the console's own searches and blocks name: a person looking, not an agent's
# recall, so never recorded.
CONSOLE = "console"


class RecallAudit:
    def __init__(self, store: EventStore, audited: Callable[[str], bool], clock: Callable[[], datetime]) -> None:
        """``audited``: whether a user's recalls are recorded."""
        self._store = store
        self._audited = audited
        self._clock = clock

    def audits(self, user_id: str) -> bool:
        return self._audited(user_id)

    async def record(
        self, user_id: str, kind: str, query: str | None, shown: Sequence[tuple[str, int]], origin: Origin | None
    ) -> str | None:
        """Record one recall; returns its id (None: not recorded)."""
        if not self._audited(user_id) or (origin is not None and origin.channel == CONSOLE):
            return None
        append = recorded(user_id, new_recall_id(), kind, query, shown, origin, self._clock())
        try:
            result = await self._store.append(user_id, append.note_id, [append])
        except Exception:
            log.exception("a recall of user %s could not be recorded", user_id)
            return None
        return append.note_id if isinstance(result, Appended) else None


def audited_users(setting: str) -> Callable[[str], bool]:
    """``ENGRAM_RECALL_AUDIT``: ``off`` (or empty), ``all``, or the user ids to audit, comma-separated."""
    value = setting.strip()
    if value in ("", "off"):
        return lambda user_id: False
    if value == "all":
        return lambda user_id: True
    users = frozenset(u.strip() for u in value.split(",") if u.strip())
    return lambda user_id: user_id in users
