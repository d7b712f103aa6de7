"""The MCP server's token checks under a burst: a bounded number read the registry at once, the
others wait their turn, and one that waits too long is told the registry is unreachable."""

from __future__ import annotations

import asyncio

import pytest

from engram_ledger.services.agents.tokens import EngramTokenVerifier, TokenRecord, TokensUnreachable


class StalledRegistry:
    """A registry whose reads hang until ``answer`` is set; ``reading`` once ``readers`` are in."""

    def __init__(self, readers: int) -> None:
        self.asked = 0
        self.readers = readers
        self.reading = asyncio.Event()
        self.answer = asyncio.Event()

    async def find(self, token: str) -> TokenRecord | None:
        self.asked += 1
        if self.asked >= self.readers:
            self.reading.set()
        await self.answer.wait()
        return None


async def test_token_checks_take_turns_and_one_kept_waiting_is_unreachable() -> None:
    registry = StalledRegistry(readers=2)
    verifier = EngramTokenVerifier(registry, concurrency=2, wait_seconds=0.2)  # type: ignore[arg-type]
    reading = [asyncio.create_task(verifier.verify_token("engram_a")) for _ in range(2)]
    await asyncio.wait_for(registry.reading.wait(), timeout=5)
    with pytest.raises(TokensUnreachable, match=r"no answer from the token registry within 0\.2 s"):
        await verifier.verify_token("engram_b")
    assert registry.asked == 2, "the third check never reached the registry"
    registry.answer.set()
    assert await asyncio.gather(*reading) == [None, None]
    assert await verifier.verify_token("engram_c") is None, "the turns were given back"
    assert registry.asked == 3
