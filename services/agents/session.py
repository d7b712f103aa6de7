"""What a tool handler works with: one agent's session with Engram."""

from __future__ import annotations

from dataclasses import dataclass, field

from engram_ledger.contracts.model import Origin
from engram_ledger.services.bus.client import EngramClient


@dataclass
class AgentSession:
    """One agent's session: the client, the user it acts for, its conversation (``session_id``,
    what ``include_conversation`` searches) and read-your-writes: reads pass ``last_token``, the
    token of the last write, so the LLM always reads what it has just written."""

    client: EngramClient
    user_id: str
    session_id: str | None = None
    # The channel its reads name (a recall records it): the tool profile the agent uses.
    channel: str | None = None
    _last_token: str | None = field(default=None, init=False, repr=False)

    @property
    def origin(self) -> Origin:
        """Where this session's requests come from: its channel and conversation."""
        return Origin(channel=self.channel, session_id=self.session_id)

    @property
    def last_token(self) -> str | None:
        """The consistency token of the last write this session knows of (None before any)."""
        return self._last_token

    def track(self, token: str | None) -> None:
        """Let later reads see a write: the session's own, or one made through another path
        (a message the host application recorded, a note saved with the client directly)."""
        if token:
            self._last_token = token
