"""One contract, every adapter of the PastReader port (what readings of the past read): the Redis
read model's ``HistoryReader`` and the in-memory fake of ``tests/fakes.py``, fed one log, answer
every question alike, at every moment of it, by time and by token."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts.commands import (
    PutNote,
    RequestForget,
    RevertNote,
    SaveNote,
    SupersedeNote,
    UpdateNote,
)
from engram_ledger.projections.forget_saga import ForgetSagaProjection
from engram_ledger.projections.history import HistoryProjection
from engram_ledger.projections.history_reader import HistoryReader
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.application.as_of import Listed, Moment, parse_moment
from engram_ledger.services.application.commands import CommandService, command_handlers
from engram_ledger.services.application.forget import ForgetService
from engram_ledger.services.application.ports import PastReader
from tests.fakes import InMemoryHistory, InMemoryPendingDeletions, ManualClock, RecordingScrub
from tests.support import master_key_for_tests

# Later than the log's positions (the wall clock): the events' own times then place each change.
START = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)


@dataclass
class Past:
    """One log, the moments between its steps, and the two readers of it."""

    moments: list[Moment]
    notes: list[str]
    readers: tuple[PastReader, PastReader]


async def _write(commands: CommandService, clock: ManualClock, command: object) -> tuple[str, str]:
    clock.now += timedelta(minutes=1)
    reply = await commands.execute(command)  # type: ignore[arg-type]
    return getattr(reply, "note_id", ""), reply.token or ""  # type: ignore[union-attr]


async def _history(commands: CommandService, clock: ManualClock, moments: list[Moment]) -> list[str]:
    """Saves, an update, a supersede, a put with a time to live, a revert and a forget, with a
    moment (a time, and a token) after each; another user's note beside them."""
    between = lambda: moments.append(Moment(clock.now + timedelta(seconds=30)))  # noqa: E731
    boss, _ = await _write(
        commands,
        clock,
        SaveNote(command_id="s1", user_id="alice", content="Alec is my boss", category="work", subject="Alec"),
    )
    city, token = await _write(
        commands, clock, SaveNote(command_id="s2", user_id="alice", content="I live in Lisbon", category="home")
    )
    between()
    moments.append(parse_moment(token))
    _, token = await _write(
        commands,
        clock,
        UpdateNote(command_id="u1", user_id="alice", note_id=boss, content="Alec is my manager", category="people"),
    )
    moved, _ = await _write(
        commands, clock, SaveNote(command_id="s3", user_id="alice", content="I live in Porto", category="home")
    )
    between()
    _, token = await _write(
        commands, clock, SupersedeNote(command_id="x1", user_id="alice", note_id=city, superseded_by=moved)
    )
    moments.append(parse_moment(token))
    kept, _ = await _write(
        commands,
        clock,
        PutNote(command_id="p1", user_id="alice", category="kv", key="k1", value={"v": 1}, ttl_seconds=90),
    )
    between()
    _, token = await _write(commands, clock, RevertNote(command_id="r1", user_id="alice", note_id=city, to_version=1))
    moments.append(parse_moment(token))
    between()
    await _write(commands, clock, RequestForget(command_id="f1", user_id="alice", note_ids=[boss], confirmed=True))
    other, token = await _write(commands, clock, SaveNote(command_id="s4", user_id="bob", content="bob's note"))
    between()
    moments.append(parse_moment(token))
    return [boss, city, moved, kept, other]


@pytest.fixture
async def past(redis_url: str) -> Past:
    redis = aioredis.Redis.from_url(redis_url)
    store = RedisEventStore(redis, 1, 3600, master_key_for_tests())
    fake = InMemoryHistory(store)
    clock = ManualClock(START)
    forget = ForgetService(
        store,
        fake,
        InMemoryPendingDeletions(store),  # type: ignore[arg-type]
        None,
        RecordingScrub(),
        clock,
        timedelta(minutes=5),
    )
    commands = CommandService(command_handlers(store, clock, forget=forget))
    moments = [Moment(START)]
    notes = await _history(commands, clock, moments)
    log = await store.read_log(0, "0", 10_000)
    await HistoryProjection(redis, 0, 0, master_key_for_tests()).apply(log)
    await ForgetSagaProjection(redis, 0).apply(log)
    return Past(moments, notes, (HistoryReader(redis, 1, master_key_for_tests()), fake))


async def _answers(reader: PastReader, moment: Moment, notes: list[str]) -> list[object]:
    """What a reader answers about ``alice`` as of ``moment``."""
    asked = [*notes, "ZZZZZZZZ"]
    answers: list[object] = [
        reader.partition_of("alice"),
        await reader.notes_at("alice", asked, moment),
        await reader.histories("alice", asked),
        await reader.get_many("alice", asked),
        await reader.changed_since("alice", moment.ms),
        await reader.relisted_since("alice", moment.ms),
        sorted(await reader.expired_by("alice", moment.ms)),
    ]
    for superseded in (False, True):
        places = await reader.listing("alice", superseded)
        answers += [
            places,
            await reader.listing_window("alice", superseded, 1, 3),
            await reader.listing_window("alice", superseded, 2, 2),
            await reader.listing_ranks("alice", superseded, [*places, Listed("kv", 0, "AAAAAAAA")]),
        ]
    return answers


async def test_both_readers_tell_the_same_past_at_every_moment(past: Past) -> None:
    real, fake = past.readers
    assert {m.position is None for m in past.moments} == {True, False}, "by time and by token"
    for moment in past.moments:
        assert await _answers(real, moment, past.notes) == await _answers(fake, moment, past.notes), moment


async def test_the_past_read_is_the_one_each_moment_names(past: Past) -> None:
    """Not only alike: right. As of the second save's token the city note is at its first
    version and the boss note, forgotten since, is its tombstone placed by its category then;
    at the end the city note is back (reverted), and bob's note is never alice's."""
    boss, city, moved, kept, other = past.notes
    for reader in past.readers:
        first = await reader.notes_at("alice", [boss, city, moved, other], past.moments[2])
        assert first[city] is not None and (first[city].version, first[city].content) == (1, "I live in Lisbon")
        assert first[boss] is not None and (first[boss].status.value, first[boss].category) == ("forgotten", "work")
        assert first[moved] is None and first[other] is None
        last = await reader.notes_at("alice", [boss, city], past.moments[-1])
        assert last[boss] is not None and (last[boss].status.value, last[boss].category) == ("forgotten", "people")
        assert last[city] is not None and (last[city].version, last[city].status.value) == (3, "active")
        # Expiries are times: the last moment by time is past the put's time to live.
        assert kept in await reader.expired_by("alice", max(m.ms for m in past.moments))
