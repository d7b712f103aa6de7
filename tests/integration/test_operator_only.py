"""Deleting without the second call (``confirmed``) is an operator's: taken from the operators'
stream only. An agent's request that sets it is refused and deletes nothing."""

from __future__ import annotations

import msgspec
import pytest

from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import RequestForget
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService


async def test_an_agents_confirmed_forget_is_refused_and_deletes_nothing(
    service: RunningService, client: EngramClient
) -> None:
    note = await client.save("alice", "the garage code is 2291", advise=False)
    async with EngramClient(service.settings.redis_url) as agent:
        for erase in (
            agent.forget("alice", note_ids=[note.note_id], confirmed=True),
            agent.forget_user("alice", confirmed=True),
            agent.forget_session("alice", "s1", confirmed=True),
        ):
            with pytest.raises(EngramError) as refused:
                await erase
            assert refused.value.code is ErrorCode.INVALID_PARAMETER and "operator" in refused.value.message
        # Straight onto the agents' command stream, as another language's client would send it.
        body = msgspec.json.encode(
            RequestForget(command_id="raw-1", user_id="alice", note_ids=[note.note_id], confirmed=True)
        )
        raw = msgspec.json.decode(await agent.request_raw(channels.command_stream(0), body))
        assert raw["type"] == "error" and raw["code"] == "INVALID_PARAMETER"
        # The two calls are the agent's way, and they still work.
        first = await agent.forget("alice", note_ids=[note.note_id])
        assert first.status == "confirmation_required"
    assert (await client.get_note("alice", note.note_id)).status == "active"
    done = await client.forget("alice", note_ids=[note.note_id], confirmed=True)  # the operator's
    assert done.status == "forgotten"
