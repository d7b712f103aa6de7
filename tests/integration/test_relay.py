"""`engram relay`'s webhooks (docs/guide.md, "Webhooks"), in this process: the real subscription on the real
log, posts over real HTTP to a receiver on loopback that refuses some and is restarted midway."""

from __future__ import annotations

import asyncio
import itertools
import zlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec
import pytest
import redis.asyncio as aioredis
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engram_ledger.contracts import channels
from engram_ledger.services.adapters.crypto import load_master_key
from engram_ledger.services.adapters.redis_conn import group_info
from engram_ledger.services.adapters.redis_server import free_port
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.ops.relay import (
    ATTEMPT_HEADER,
    EVENT_ID_HEADER,
    REDELIVERED_HEADER,
    SIGNATURE_HEADER,
    RelayOptions,
    RetryPolicy,
    run_relay,
    verify,
)
from tests.conftest import RunningService
from tests.support import eventually, serving_task

pytestmark = pytest.mark.integration

SECRET = b"relay-test-secret-of-some-length"


@dataclass
class Receiver:
    """A webhook receiver that answers 500 to every ``fail_every``-th post (and always to the
    events named in ``always_fail``), checking every signature."""

    port: int
    fail_every: int = 10
    always_fail: set[str] = field(default_factory=set)
    delay: float = 0.0  # seconds each post takes to answer
    accepted: list[tuple[str, int]] = field(default_factory=list)  # (event id, attempt)
    seen: list[tuple[str, int, bool]] = field(default_factory=list)  # (event id, attempt, redelivered)
    refused: list[str] = field(default_factory=list)
    bad_signatures: int = 0
    bodies: dict[str, dict[str, object]] = field(default_factory=dict)
    _count: itertools.count[int] = field(default_factory=itertools.count)
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    async def post(self, request: Request) -> Response:
        body = await request.body()
        await asyncio.sleep(self.delay)  # a receiver that takes a while to answer
        if not verify(SECRET, body, request.headers.get(SIGNATURE_HEADER, "")):
            self.bad_signatures += 1
            return Response(status_code=401)
        event_id = request.headers[EVENT_ID_HEADER]
        if self.refuse(event_id):
            self.refused.append(event_id)
            return Response(status_code=500)
        attempt = int(request.headers[ATTEMPT_HEADER])
        self.accepted.append((event_id, attempt))
        self.seen.append((event_id, attempt, request.headers[REDELIVERED_HEADER] == "true"))
        self.bodies[event_id] = msgspec.json.decode(body)
        return Response(status_code=204)

    async def start(self) -> None:
        app = Starlette(routes=[Route("/hook", self.post, methods=["POST"])])
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._task = await serving_task(self._server)

    async def stop(self) -> None:
        assert self._server is not None and self._task is not None
        self._server.should_exit = True
        await self._task

    def refuse(self, event_id: str) -> bool:
        return event_id in self.always_fail or next(self._count) % self.fail_every == self.fail_every - 1

    def first_seen(self, event_id: str) -> tuple[str, int, bool]:
        return next(s for s in self.seen if s[0] == event_id)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


async def log_event_ids(redis_url: str, partitions: int) -> list[str]:
    async with aioredis.Redis.from_url(redis_url) as redis:
        ids = []
        for p in range(partitions):
            for _, fields in await redis.xrange(channels.event_log(p)):
                ids.append(msgspec.json.decode(fields[b"e"])["event_id"])
        return ids


@pytest.fixture
async def service(redis_url: str) -> AsyncIterator[RunningService]:
    from tests.conftest import service_settings

    running = await RunningService(service_settings(redis_url, index_enabled=False, partitions=2)).start()
    yield running
    await running.stop()


async def write_load(redis_url: str, users: int, notes: int, first: int) -> None:
    async with EngramClient(redis_url, timeout=30, operator=True) as client:
        for n in range(first, first + notes):
            for u in range(users):
                user = f"user-{u}"
                written = await client.save(user, f"note {n} of {user}")
                if n % 3 == 0:
                    await client.update(user, written.note_id, content=f"note {n} of {user}, changed")
                if n % 5 == 0:
                    await client.forget(user, note_ids=[written.note_id], confirmed=True)


async def test_every_event_reaches_a_flaky_receiver_that_restarts_with_duplicates_only_on_retries(
    service: RunningService, redis_url: str
) -> None:
    receiver = Receiver(free_port())
    await receiver.start()
    stop = asyncio.Event()
    options = RelayOptions(
        url=receiver.url,
        group="audit",
        secret=SECRET,
        from_start=True,
        retry=RetryPolicy(give_up_after=600, first_delay=0.05, max_delay=0.5),
    )
    relaying = asyncio.create_task(run_relay(redis_url, False, options, stop))
    try:
        await write_load(redis_url, users=4, notes=15, first=0)
        # The receiver goes away while events keep coming, and comes back on the same port.
        await receiver.stop()
        await write_load(redis_url, users=4, notes=15, first=15)
        # Away a while longer: the relay's posts meet a closed port, and are retried.
        await asyncio.sleep(0.5)
        await receiver.start()
        expected = await log_event_ids(redis_url, 2)

        def all_in() -> bool:
            assert not relaying.done(), relaying
            return set(expected) <= {i for i, _ in receiver.accepted}

        await eventually(all_in, 60, interval=0.1, what="every event of the log accepted")
    finally:
        stop.set()
        await asyncio.wait_for(relaying, 30)
        await receiver.stop()

    assert receiver.bad_signatures == 0
    assert receiver.refused, "the receiver refused some posts, which were retried"
    # Posts tried while the receiver was away failed to connect, and were retried until it was back.
    assert [i for i, a in receiver.accepted if a > 1 and i not in receiver.refused], receiver.accepted
    copies = Counter(i for i, _ in receiver.accepted)
    assert set(copies) == set(expected), "every event of the log, and nothing else"
    # A second copy of an event is only ever a retry of a post whose answer was lost.
    for event_id, attempt in receiver.accepted:
        if copies[event_id] > 1:
            assert attempt > 1 or any(i == event_id and a > 1 for i, a in receiver.accepted), event_id
    assert sum(copies.values()) - len(copies) <= len(receiver.refused) + 1
    # A post carries the typed event and where it is in the log.
    sample = receiver.bodies[expected[0]]
    assert sample["id"] == expected[0] and sample["type"] == "note_saved"
    assert isinstance(sample["event"], dict) and sample["event"]["event_id"] == expected[0]
    assert str(sample["event"]["content"]).startswith("enc1:") or sample["event"]["content"] in ("", None)


async def test_an_event_that_keeps_failing_is_dead_lettered_and_the_rest_flow(
    service: RunningService, redis_url: str
) -> None:
    async with EngramClient(redis_url, timeout=30, operator=True) as client:
        first = await client.save("alice", "poisoned")
        second = await client.save("alice", "fine")
    ids = await log_event_ids(redis_url, 2)
    receiver = Receiver(free_port(), fail_every=10**9, always_fail={ids[0]})
    await receiver.start()
    stop = asyncio.Event()
    options = RelayOptions(
        url=receiver.url,
        group="crm",
        secret=SECRET,
        from_start=True,
        retry=RetryPolicy(0.3, 0.01, 0.02),
        key=load_master_key(service.settings.data_dir),  # posts carry content: dead letters must not
    )
    relaying = asyncio.create_task(run_relay(redis_url, False, options, stop))
    try:
        await eventually(lambda: ids[1] in {i for i, _ in receiver.accepted}, what="the fine event delivered")
        async with aioredis.Redis.from_url(redis_url) as redis:
            dead_letters = channels.relay_dead_letters("crm")
            ((_, letter),) = await eventually(lambda: redis.xrange(dead_letters), what="the poisoned event's letter")
            assert letter[b"id"].decode() == ids[0] and letter[b"type"] == b"note_saved"
            assert letter[b"error"] == b"HTTP 500" and int(letter[b"attempts"]) >= 2
            assert b"poisoned" not in b"".join(letter.values()), "a dead letter keeps no content"
            # Dead-lettered and delivered are both acknowledged: nothing stays pending.
            pending = sum([(await redis.xpending(channels.event_log(p), "crm"))["pending"] for p in range(2)])
            assert pending == 0
    finally:
        stop.set()
        await asyncio.wait_for(relaying, 30)
        await receiver.stop()
    assert receiver.refused and set(receiver.refused) == {ids[0]}
    fine = receiver.bodies[ids[1]]["event"]
    assert isinstance(fine, dict) and fine["content"] == "fine", "with the key, posts carry the content"
    assert first.note_id != second.note_id


async def test_a_receiver_answering_with_a_huge_body_is_read_no_further_than_a_bound(
    service: RunningService, redis_url: str
) -> None:
    """Only the status of an answer matters: a receiver that sends 512 MiB with its 200 gets the
    post acknowledged, and the relay hangs up after a few KiB instead of reading it all. The
    receiver is raw asyncio, so what it counts is what the socket took (past the kernel's
    buffers, only what the relay read)."""
    total = 512 << 20
    sent = {"bytes": 0, "posts": 0}

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        )
        await reader.readexactly(length)
        sent["posts"] += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        chunk = b"x" * (1 << 20)
        try:
            while sent["bytes"] < total:
                writer.write(chunk)
                await writer.drain()  # waits while the client does not read
                sent["bytes"] += len(chunk)
        except (ConnectionError, OSError):
            pass  # the relay hung up
        finally:
            writer.close()

    receiver = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = receiver.sockets[0].getsockname()[1]
    async with EngramClient(redis_url, timeout=30, operator=True) as client:
        await client.save("alice", "one event")
    stop = asyncio.Event()
    options = RelayOptions(url=f"http://127.0.0.1:{port}/hook", group="huge", secret=SECRET, from_start=True)
    relaying = asyncio.create_task(run_relay(redis_url, False, options, stop))
    try:
        log = channels.event_log(channels.partition_of("alice", 2))
        async with aioredis.Redis.from_url(redis_url) as redis:

            async def acknowledged() -> bool:
                group = await group_info(redis, log, "huge")
                return group is not None and bool(group["entries-read"]) and group["pending"] == 0

            await eventually(acknowledged, what="the event read and acknowledged")
    finally:
        stop.set()
        await asyncio.wait_for(relaying, 30)
        receiver.close()
    assert sent["posts"] == 1, "acknowledged on the first 200: not posted again"
    assert sent["bytes"] < 64 << 20, f"{sent['bytes']} bytes of the answer taken before the relay hung up"


async def test_a_receiver_that_trickles_its_answer_is_cut_off_at_the_post_deadline_and_the_rest_flow(
    service: RunningService, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A receiver that sends one byte a second never trips httpx's timeout (each read is quick):
    the deadline of a whole post abandons it, the post is retried as any failure is, and the
    events of other lanes reach the receiver meanwhile."""
    deadline = 1.0
    async with EngramClient(redis_url, timeout=30, operator=True) as client:
        for n in range(12):
            await client.save("alice", f"note {n}")
    ids = await log_event_ids(redis_url, 2)
    slow = ids[0]
    trickled: list[float] = []  # how long each trickled post lasted before the relay hung up
    accepted: dict[str, tuple[int, float]] = {}  # event id -> (attempt, when)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
        await reader.readexactly(int(headers[b"Content-Length"]))
        event_id, attempt = headers[EVENT_ID_HEADER.encode()].decode(), int(headers[ATTEMPT_HEADER.encode()])
        try:
            if event_id == slow and attempt <= 2:
                began = asyncio.get_running_loop().time()
                for byte in b"HTTP/1.1 204 No Content\r\n\r\n" * 4:  # a minute's worth
                    writer.write(bytes([byte]))
                    await writer.drain()
                    try:  # one byte a second, until the relay hangs up (EOF)
                        if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                            break
                    except TimeoutError:
                        pass
                trickled.append(asyncio.get_running_loop().time() - began)
                return
            accepted.setdefault(event_id, (attempt, asyncio.get_running_loop().time()))
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the relay hung up
        finally:
            writer.close()

    receiver = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = receiver.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    options = RelayOptions(
        url=f"http://127.0.0.1:{port}/hook",
        group="trickle",
        secret=SECRET,
        from_start=True,
        retry=RetryPolicy(give_up_after=60, first_delay=0.05, max_delay=0.1),
        post_seconds=deadline,
    )
    relaying = asyncio.create_task(run_relay(redis_url, False, options, stop))
    try:

        def all_in() -> bool:
            assert not relaying.done(), relaying
            return set(ids) <= set(accepted)

        await eventually(all_in, what="every event accepted")
    finally:
        stop.set()
        await asyncio.wait_for(relaying, 30)
        receiver.close()
    # Abandoned at the deadline both times (not after the minute the receiver would take), then
    # answered on the third attempt.
    assert len(trickled) == 2 and all(deadline - 0.1 <= t < deadline + 1.5 for t in trickled), trickled
    assert accepted[slow][0] == 3
    # Events of the other lanes were delivered while the slow one was being retried.
    lane = {i: zlib.crc32(note.encode()) % 8 for i, note in (await log_event_notes(redis_url, 2)).items()}
    others = [i for i in ids if lane[i] != lane[slow]]
    assert others and all(accepted[i][1] < accepted[slow][1] for i in others)
    assert any("no whole answer within 1 s" in r.getMessage() for r in caplog.records), "the failure is logged"


async def log_event_notes(redis_url: str, partitions: int) -> dict[str, str]:
    """Each event id of the log, with the ``user/note`` its lane is chosen by."""
    async with aioredis.Redis.from_url(redis_url) as redis:
        found = {}
        for p in range(partitions):
            for _, fields in await redis.xrange(channels.event_log(p)):
                event = msgspec.json.decode(fields[b"e"])
                found[event["event_id"]] = f"{event['user_id']}/{event['note_id']}"
        return found
