"""One worker's handlers taken in turns by the users waiting, and a user's share bounded."""

from __future__ import annotations

import asyncio

import pytest

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.application.fair_share import FairShare


async def test_a_free_handler_goes_to_the_user_whose_turn_it_is_not_to_the_oldest_request() -> None:
    share = FairShare(handlers=1, per_user=10)
    order: list[str] = []
    gate = asyncio.Event()

    async def request(user: str, name: str) -> None:
        async with share.turn(user):
            order.append(name)
            await gate.wait()

    # given the one handler busy with a flooding user, who has three more waiting
    tasks = [asyncio.create_task(request("flood", f"flood-{i}")) for i in range(4)]
    await asyncio.sleep(0)
    # when another user's request arrives after them
    tasks.append(asyncio.create_task(request("bob", "bob")))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*tasks)
    # then it runs after the flood's next turn, not after the whole flood
    assert order == ["flood-0", "flood-1", "bob", "flood-2", "flood-3"]


async def test_a_user_over_its_share_is_refused_at_once_with_a_retry_hint() -> None:
    share = FairShare(handlers=2, per_user=3, retry_after_ms=750)
    gate = asyncio.Event()
    ran: list[int] = []

    async def request(i: int, user: str = "flood") -> None:
        async with share.turn(user):
            ran.append(i)
            await gate.wait()

    held = [asyncio.create_task(request(i)) for i in range(3)]
    await asyncio.sleep(0)
    assert share.held("flood") == 3
    with pytest.raises(EngramError) as refused:
        async with share.turn("flood"):
            ran.append(99)
    assert refused.value.code is ErrorCode.RATE_LIMITED and refused.value.retry_after_ms == 750
    assert "send this request again in 0.75 s" in refused.value.message
    assert refused.value.reply().retry_after_ms == 750
    # another user is not refused, and waits its turn for a handler
    other = asyncio.create_task(request(7, user="bob"))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*held, other)
    assert 99 not in ran and sorted(ran) == [0, 1, 2, 7]
    assert share.held("flood") == 0


async def test_a_request_cancelled_while_waiting_gives_back_its_place_and_its_turn() -> None:
    share = FairShare(handlers=1, per_user=5)
    gate = asyncio.Event()

    async def request(user: str) -> None:
        async with share.turn(user):
            await gate.wait()

    running = asyncio.create_task(request("a"))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(request("b"))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert share.held("b") == 0
    gate.set()
    await running
    # the handler is free again: a new request runs at once
    async with share.turn("c"):
        pass


async def test_one_user_runs_one_request_at_a_time_while_others_run_beside_it() -> None:
    share = FairShare(handlers=4, per_user=10)
    gate = asyncio.Event()
    running: list[str] = []

    async def request(user: str, name: str) -> None:
        async with share.turn(user):
            running.append(name)
            await gate.wait()

    tasks = [asyncio.create_task(request("flood", f"flood-{i}")) for i in range(3)]
    tasks.append(asyncio.create_task(request("bob", "bob")))
    await asyncio.sleep(0)
    # free handlers are not taken by the flood's second and third: they wait for its first
    assert running == ["flood-0", "bob"]
    gate.set()
    await asyncio.gather(*tasks)
    assert running == ["flood-0", "bob", "flood-1", "flood-2"]
