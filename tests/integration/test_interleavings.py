"""Writes that race an erasure, forced to land where the race is lost: each would survive the
erasure without the step that looks again after it (a real Redis, the real bus)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engram_ledger.contracts.events import ACCOUNT, session_stream
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService


def write_while_deciding(service: RunningService, control: str, write: Any) -> list[bool]:
    """Make ``write`` land in the store while the erasure on ``control`` decides: after it has
    loaded what it will erase, before it appends."""
    store = service.engram.store
    original = store.load
    done: list[bool] = []

    async def load(user_id: str, note_ids: Sequence[str]) -> Any:
        loaded = await original(user_id, note_ids)
        if control in note_ids and not done:
            done.append(True)
            await write()
        return loaded

    store.load = load  # type: ignore[method-assign]
    return done


async def test_a_turn_recorded_while_its_conversation_is_erased_is_erased_with_it(
    service: RunningService, client: EngramClient
) -> None:
    await client.record_message("ada", "chat-1", "hello there")
    assert (await client.forget_session("ada", "chat-1")).status == "confirmation_required"
    async with EngramClient(service.settings.redis_url, timeout=10) as agent:
        raced = write_while_deciding(
            service, session_stream("chat-1"), lambda: agent.record_message("ada", "chat-1", "my PIN is 4411")
        )
        erased = await client.forget_session("ada", "chat-1")
    assert raced and erased.status == "forgotten"
    assert len(erased.forgotten) == 2, "the turn recorded while it decided is erased too"
    left = await client.list_messages("ada", "chat-1", after=erased.token)
    assert left.messages == []


async def test_a_note_saved_while_its_user_is_erased_is_erased_with_it(
    service: RunningService, client: EngramClient
) -> None:
    await client.save("bea", "Bea's first note", advise=False)
    assert (await client.forget_user("bea")).status == "confirmation_required"
    async with EngramClient(service.settings.redis_url, timeout=10) as agent:
        raced = write_while_deciding(service, ACCOUNT, lambda: agent.save("bea", "Bea's PIN is 4411", advise=False))
        erased = await client.forget_user("bea")
    assert raced and erased.status == "forgotten" and len(erased.forgotten) == 2
    left = await client.list_notes("bea", after=erased.token)
    assert left.notes == []
    # a note saved after the erasure is a new one, kept
    kept = await client.save("bea", "a fresh start", advise=False)
    assert [n.id for n in (await client.list_notes("bea", after=kept.token)).notes] == [kept.note_id]
