"""Commands and queries over the real broker: happy paths, isolation, bad input."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
import redis.asyncio as aioredis

from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import LIST_NOTES_MAX
from engram_ledger.contracts.model import NoteStatus
from engram_ledger.services.bus.client import EngramClient, ReadYourWrites
from tests.conftest import RunningService, service_settings
from tests.support import eventually


async def test_save_get_update_history_list_recent(client: EngramClient) -> None:
    alec = await client.save("alice", "Alec is my boss at TechCorp", category="person", subject="Alec")
    sarah = await client.save("alice", "Sarah works on the Platform team", category="person", subject="Sarah")
    friday = await client.save("alice", "I prefer tasks due on Friday", category="preference")
    moved = await client.update("alice", sarah.note_id, content="Sarah works on the Design team")
    assert moved.note_id == sarah.note_id and moved.version == 2

    note = await client.get_note("alice", sarah.note_id, after=moved.token)
    assert note.content == "Sarah works on the Design team" and note.version == 2 and note.subject == "Sarah"
    assert note.created_at < note.updated_at

    history = await client.history("alice", sarah.note_id, after=moved.token)
    assert [(v.version, v.change, v.content) for v in history.versions] == [
        (1, "saved", "Sarah works on the Platform team"),
        (2, "updated", "Sarah works on the Design team"),
    ]

    listing = await client.list_notes("alice", after=moved.token)
    assert [n.id for n in listing.notes] == [alec.note_id, sarah.note_id, friday.note_id]  # category, then created_at
    assert [n.id for n in (await client.list_notes("alice", category="preference")).notes] == [friday.note_id]
    recent = await client.list_recent("alice", limit=2)
    assert [n.id for n in recent.notes] == [friday.note_id, sarah.note_id] and recent.total == 3


async def test_supersede_hides_the_old_note_from_listings_but_not_history(client: EngramClient) -> None:
    seattle = await client.save("alice", "User lives in Seattle")
    austin = await client.save("alice", "User moved to Austin")
    reply = await client.supersede("alice", seattle.note_id, austin.note_id)
    assert reply.superseded_by == austin.note_id and reply.version == 2

    listing = await client.list_notes("alice", after=reply.token)
    assert [n.id for n in listing.notes] == [austin.note_id]
    everything = await client.list_notes("alice", include_superseded=True)
    assert {n.id for n in everything.notes} == {seattle.note_id, austin.note_id}
    assert [n.id for n in (await client.list_recent("alice")).notes] == [austin.note_id]
    old = await client.get_note("alice", seattle.note_id)
    assert old.status is NoteStatus.SUPERSEDED and old.superseded_by == austin.note_id
    assert (await client.get_note("alice", austin.note_id)).supersedes == [seattle.note_id]
    assert [v.change for v in (await client.history("alice", seattle.note_id)).versions] == ["saved", "superseded"]


async def test_category_change_moves_the_note_in_the_listing(client: EngramClient) -> None:
    note = await client.save("alice", "Project X uses Python 3.12", category="context")
    moved = await client.update("alice", note.note_id, category="project")
    assert (await client.list_notes("alice", category="context", after=moved.token)).notes == []
    assert [n.id for n in (await client.list_notes("alice", category="project")).notes] == [note.note_id]
    assert len((await client.list_notes("alice", include_superseded=True)).notes) == 1


async def test_user_isolation_every_query_and_command_answers_not_found(client: EngramClient) -> None:
    mine = await client.save("alice", "Alice's doctor is Dr. Who")
    theirs = await client.save("bob", "Bob's note")
    await client.get_note("alice", mine.note_id, after=theirs.token)
    a, b = mine.note_id, theirs.note_id
    # Each attempt, and the notes its refusal may name: one the caller does not own, never bob's own.
    attempts = [
        (client.get_note("mallory", a), {a}),
        (client.history("mallory", a), {a}),
        (client.update("mallory", a, content="hijacked"), {a}),
        (client.supersede("mallory", a, b), {a, b}),
        (client.supersede("bob", b, a), {a}),
        (client.supersede("bob", a, b), {a}),
    ]
    missing = "ZZZZZZZZ"
    for attempt, named in attempts:
        with pytest.raises(EngramError) as info:
            await attempt
        assert info.value.code is ErrorCode.MEMORY_NOT_FOUND
        # Indistinguishable from a note that never existed: same code, same wording.
        assert info.value.message in {f"Memory with ID {n} not found" for n in named}
    with pytest.raises(EngramError) as never:
        await client.get_note("mallory", missing)
    assert never.value.message == f"Memory with ID {missing} not found"
    assert (await client.list_notes("mallory")).notes == []
    assert (await client.list_recent("mallory")).notes == []
    assert [n.content for n in (await client.list_notes("bob")).notes] == ["Bob's note"]
    assert (await client.get_note("alice", mine.note_id)).content == "Alice's doctor is Dr. Who"


BAD_COMMANDS = [
    (b"{not json", ErrorCode.INVALID_PARAMETER),
    (b"\xff\xfe\x00garbage", ErrorCode.INVALID_PARAMETER),
    (b'{"type": "save_note", "command_id": "c", "user_id": "u", "content": 5}', ErrorCode.INVALID_PARAMETER),
    (b'{"type": "save_note", "command_id": "c", "user_id": "u", "content": ""}', ErrorCode.INVALID_PARAMETER),
    (
        b'{"type": "save_note", "command_id": "c", "user_id": "u", "content": "' + b"x" * 20000 + b'"}',
        ErrorCode.INVALID_PARAMETER,
    ),
    (
        b'{"type": "save_note", "command_id": "c", "user_id": "u", "content": "nul \\u0000 byte"}',
        ErrorCode.INVALID_PARAMETER,
    ),
    (
        b'{"type": "save_note", "command_id": "c", "user_id": "u", "content": "lone \\ud800 surrogate"}',
        ErrorCode.INVALID_PARAMETER,
    ),
    (b'{"type": "save_note", "user_id": "u", "content": "no command id"}', ErrorCode.INVALID_PARAMETER),
    (
        b'{"type": "update_note", "command_id": "c", "user_id": "u", "note_id": "AAAAAAAA", "content": "x"}',
        ErrorCode.MEMORY_NOT_FOUND,
    ),
    (
        b'{"type": "supersede_note", "command_id": "c", "user_id": "u", '
        b'"note_id": "AAAAAAAA", "superseded_by": "BBBBBBBB"}',
        ErrorCode.MEMORY_NOT_FOUND,
    ),
    (
        b'{"type": "get_note", "user_id": "u", "note_id": "AAAAAAAA"}',
        ErrorCode.INVALID_PARAMETER,
    ),  # a query on the command stream
]


async def test_bad_input_gets_a_typed_error_and_the_stream_keeps_flowing(client: EngramClient, redis_url: str) -> None:
    stream = channels.command_stream(0)
    for body, code in BAD_COMMANDS:
        reply = msgspec.json.decode(await client.request_raw(stream, body))
        assert reply["type"] == "error" and reply["code"] == code.value, (body[:60], reply)
        assert reply["message"]
    good = await client.save("u", "still flowing")
    assert (await client.get_note("u", good.note_id, after=good.token)).content == "still flowing"
    r = aioredis.Redis.from_url(redis_url)
    assert (await r.xpending(stream, channels.COMMAND_GROUP))["pending"] == 0
    assert await r.xlen(channels.dead_letter_stream(stream)) == 0
    await r.aclose()


async def test_bad_queries_get_typed_errors(client: EngramClient) -> None:
    stream = channels.query_stream(0)
    for body in (b"nope", b'{"type": "list_recent", "user_id": "u", "limit": 500}', b'{"type": "save_note"}'):
        reply = msgspec.json.decode(await client.request_raw(stream, body))
        assert reply["code"] == "INVALID_PARAMETER"


PLAIN_REFUSALS = [
    (
        channels.command_stream(0),
        b'{"type": "save_note", "command_id": "c", "user_id": "bad user", "content": "x"}',
        "invalid command: user_id may contain only ASCII letters, digits and . _ : @ + / = | - (no spaces); "
        "you gave 'bad user'",
    ),
    (
        channels.command_stream(0),
        b'{"type": "save_note", "command_id": "c", "user_id": "u", "content": " \\n "}',
        "invalid command: content must not be blank",
    ),
    (
        channels.command_stream(0),
        b'{"type": "update_note", "command_id": "c", "user_id": "u", "note_id": "nope", "content": "x"}',
        "invalid command: note_id must be a memory id: 8 letters or digits",
    ),
    (
        channels.query_stream(0),
        b'{"type": "search_notes", "user_id": "u", "query": "x", "top_k": 50}',
        "invalid query: top_k must be a whole number from 1 to 20; you gave 50",
    ),
]


async def test_a_refusal_on_the_bus_names_the_field_and_the_rule_in_plain_words(client: EngramClient) -> None:
    for stream, body, says in PLAIN_REFUSALS:
        reply = msgspec.json.decode(await client.request_raw(stream, body))
        assert reply["code"] == "INVALID_PARAMETER" and reply["message"].startswith(says), reply
        assert "$." not in reply["message"] and "Expected" not in reply["message"]


async def test_read_your_writes_under_concurrent_load(client: EngramClient) -> None:
    async def writer(user: str) -> None:
        session = ReadYourWrites(client, user)
        for i in range(15):
            saved = await session.save(f"{user} fact number {i}")
            assert (await session.get_note(saved.note_id)).content == f"{user} fact number {i}"
            assert saved.note_id in {n.id for n in (await session.list_recent(limit=1)).notes}

    await asyncio.gather(*[writer(f"user{u}") for u in range(8)])


def waits(running: RunningService) -> list[tuple[object, ...]]:
    """The commands the service's client sends from now on that read the history's checkpoint
    or live pointer, or the log's head: what waiting on a token costs."""
    redis = running.engram.redis
    sent = redis.execute_command
    seen: list[tuple[object, ...]] = []

    async def counting(*args: object, **options: object) -> object:
        if args[0] == "XREVRANGE" or ":hist:" in str(args[1:2]):
            seen.append(args)
        return await sent(*args, **options)

    redis.execute_command = counting  # type: ignore[method-assign]
    return seen


async def test_a_token_from_the_future_is_refused_at_once_without_polling(redis_url: str) -> None:
    """A forged token used to hold a handler for the whole read wait, reading the checkpoint
    every 2 ms (some 4,000 commands in 5 s); it names no write, so it is refused at once."""
    # A wait far longer than a busy machine takes to answer: "at once" is told from "after it".
    settings = service_settings(redis_url, index_enabled=False, read_wait_seconds=30.0, claim_idle_ms=60_000)
    running = await RunningService(settings).start()
    try:
        async with EngramClient(redis_url) as c:
            await c.save("alice", "a note, so the log is not empty")
            seen = waits(running)
            loop = asyncio.get_running_loop()
            started = loop.time()
            for token in ("0:99999999999999-0", "7:1-0"):  # past the log's head; a partition there is not
                with pytest.raises(EngramError) as info:
                    await c.list_notes("alice", after=token)
                assert info.value.code is ErrorCode.INVALID_PARAMETER, info.value
                assert f"token {token}" in info.value.message and "a write's reply gave" in info.value.message
            assert loop.time() - started < 10, "answered well within the 30 s wait"
            # The checkpoint, the live pointer and the log's head, once each (the scrubber may
            # read the first two meanwhile): not some 4,000 reads over the wait.
            assert len(seen) <= 10, seen
    finally:
        await running.stop()


async def test_a_token_the_read_model_has_not_reached_times_out_waiting_without_polling(redis_url: str) -> None:
    # No history role: the read model never applies the save.
    settings = service_settings(
        redis_url,
        index_enabled=False,
        read_wait_seconds=1.0,
        claim_idle_ms=60_000,
        roles=frozenset({"commands", "queries"}),
    )
    running = await RunningService(settings).start()
    try:
        async with EngramClient(redis_url) as c:
            saved = await c.save("alice", "never applied")
            seen = waits(running)
            with pytest.raises(EngramError) as info:
                await c.list_notes("alice", after=saved.token)
            assert info.value.code is ErrorCode.TIMEOUT
            # The checkpoint and the live pointer read at the start, after subscribing and every
            # RECHECK_SECONDS, the log's head once (and the scrubber's own reads, every second):
            # not a read every 2 ms (some 800 in this second).
            assert len(seen) <= 30, seen
    finally:
        await running.stop()


async def test_a_waiting_read_is_woken_by_the_projections_notice(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the re-check put out of reach, only the notice the history publishes with its
    checkpoint can end the wait in time."""
    from engram_ledger.projections import tracking

    monkeypatch.setattr(tracking, "RECHECK_SECONDS", 60.0)
    front = service_settings(
        redis_url, index_enabled=False, claim_idle_ms=60_000, roles=frozenset({"commands", "queries"})
    )
    running = await RunningService(front).start()
    projections = None
    try:
        async with EngramClient(redis_url) as c:
            saved = await c.save("alice", "applied later")
            listing = asyncio.create_task(c.list_notes("alice", after=saved.token))
            await asyncio.sleep(0.3)  # time for a wrong answer to come: none may
            assert not listing.done(), "waiting: nothing has applied the save yet"
            history = service_settings(redis_url, index_enabled=False, roles=frozenset({"history"}))
            projections = await RunningService(history).start()
            assert [n.id for n in (await listing).notes] == [saved.note_id]
    finally:
        if projections is not None:
            await projections.stop()
        await running.stop()


async def test_a_listing_without_a_limit_is_one_page_of_the_largest_size(redis_url: str) -> None:
    """A ListNotes without ``limit`` answered the whole memory; it now answers LIST_NOTES_MAX
    notes and says how many there are."""
    running = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    try:
        async with EngramClient(redis_url, timeout=30) as c:
            for start in range(0, LIST_NOTES_MAX + 5, 100):
                count = min(100, LIST_NOTES_MAX + 5 - start)
                written = await c.save_many("alice", [NoteDraft(content=f"fact {start + i}") for i in range(count)])
            listed = await c.list_notes("alice", after=written.token)
            assert len(listed.notes) == LIST_NOTES_MAX and listed.total == LIST_NOTES_MAX + 5
            rest = await c.list_notes("alice", offset=LIST_NOTES_MAX)
            assert len(rest.notes) == 5 and not {n.id for n in rest.notes} & {n.id for n in listed.notes}
    finally:
        await running.stop()


async def test_a_request_stream_keeps_big_requests_within_its_byte_budget(redis_url: str) -> None:
    """Request streams were capped by count only: 100,000 requests of up to 8 MiB each. The gate
    adds each request with MAXLEN ~ the byte budget over its own size. (No service answers here,
    so nothing else trims the stream.)"""
    from engram_ledger.services.bus.gate import Lane, RequestGate

    redis = aioredis.Redis.from_url(redis_url)
    budget = 4 * 1024 * 1024
    stream = channels.query_stream(0)
    lane = Lane(channels.inbox(stream), stream)
    gate = RequestGate(redis, 0, lane, per_user=0, maxlen=100_000, budget=budget)

    async def admit(entry: bytes) -> None:
        await redis.rpush(lane.inbox, entry)
        assert await gate.admit_head() == 0

    try:
        for i in range(50):
            await admit(b'{"a small request": %d}' % i)
        assert await redis.xlen(stream) == 50, "small requests keep the count cap's backlog"
        for _ in range(10):
            await admit(b"x" * (1024 * 1024))
        kept = sum(len(v) for _, fields in await redis.xrange(stream) for v in fields.values())
        assert 3 * 1024 * 1024 < kept <= budget, kept
    finally:
        await redis.aclose()


async def test_health_reports_lag_groups_and_pending_deletions(client: EngramClient, redis_url: str) -> None:
    import redis.asyncio as aioredis

    from engram_ledger.services.observability.health import health

    written = await client.save("alice", "health check note")
    await client.get_note("alice", written.note_id, after=written.token)
    await client.forget("alice", note_ids=[written.note_id])
    redis = aioredis.Redis.from_url(redis_url)
    try:
        # The worker reports "starting" until its model is loaded: that can take a while on a busy machine.
        async def settled() -> dict[str, Any] | None:
            report = await health(redis)
            part = report["partitions"][0]
            applied = part["forget_saga"]["pending_deletions"] == 1 and part["history"]["lag_entries"] == 0
            return report if applied and report["status"] == "ok" else None

        report = await eventually(settled, what="a health report of a settled worker")
        part = report["partitions"][0]
        assert part["history"]["lag_entries"] == 0 and part["log_length"] == 2
        assert part["commands"]["group"] and part["commands"]["dead_letters"] == 0
        assert part["forget_saga"]["pending_deletions"] == 1 and part["forget_saga"]["overdue"] == 0
        # A projection that stops shows as lag: rewind the history checkpoint.
        live = await redis.get("engram:{0}:hist:live")
        await redis.set(f"engram:{{0}}:hist:{int(live or 0)}:checkpoint", "0-0")
        assert (await health(redis))["partitions"][0]["history"]["lag_entries"] >= 1
    finally:
        await redis.aclose()
    down = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    assert (await health(down))["status"] == "down"
    await down.aclose()


async def test_prometheus_metrics_cover_the_bus_and_the_projections(redis_url: str) -> None:
    import urllib.request

    from engram_ledger.services.adapters.redis_server import free_port

    port = free_port()
    running = await RunningService(service_settings(redis_url, metrics_port=port, index_enabled=False)).start()
    try:
        async with EngramClient(redis_url) as client:
            written = await client.save("alice", "measured note")
            await client.get_note("alice", written.note_id, after=written.token)
            await client.forget("alice", note_ids=[written.note_id])
        await running.engram.gauges.refresh()  # type: ignore[union-attr]

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return response.read().decode()

        text = await asyncio.to_thread(scrape)
    finally:
        await running.stop()
    assert 'faststream_received_messages_total{app_name="engram"' in text, text[:2000]
    assert 'engram_projection_lag_entries{partition="0",projection="history"}' in text
    assert 'engram_forget_pending_deletions{partition="0"}' in text
    assert "engram_bus_up 1.0" in text


async def test_a_command_is_traced_through_the_bus(redis_url: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # once per process; this is the only test that sets it
    running = await RunningService(service_settings(redis_url, tracing=True, index_enabled=False)).start()
    try:
        async with EngramClient(redis_url) as client:
            with provider.get_tracer("agent").start_as_current_span("agent turn") as turn:
                await client.save("alice", "traced note", advise=False)
    finally:
        await running.stop()
    caller = turn.get_span_context().trace_id
    handled = [s for s in exporter.get_finished_spans() if s.context.trace_id == caller and s.name != "agent turn"]
    assert handled, [s.name for s in exporter.get_finished_spans()]
    assert any("commands" in s.name for s in handled), [s.name for s in handled]
