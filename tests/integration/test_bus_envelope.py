"""Replies in the request's own format (services/bus/envelope.py), through a running service on
real Redis: a JSON envelope is answered with a JSON envelope, a binary request with a binary
reply; a malformed envelope that names a ``reply_to`` gets a typed error; and the format holds
when a request is redelivered or dead-lettered. The client side here is raw XADD and Pub/Sub
(tests/e2e/test_bus_redis_cli.py does the whole exchange with redis-cli alone)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from faststream.redis.parser import BinaryMessageFormatV1

from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import SaveNote
from engram_ledger.services.bus.envelope import ENVELOPE_ERROR
from tests.conftest import RunningService, service_settings
from tests.support import eventually, log_events, until_none

STREAM = channels.command_stream(0)


class Caller:
    """A caller that writes stream entries itself and reads replies off its own channel."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self.reply_to = channels.reply_channel(f"envelope-{uuid.uuid4().hex}")
        self.pubsub = redis.pubsub(ignore_subscribe_messages=True)

    async def __aenter__(self) -> Caller:
        await self.pubsub.subscribe(self.reply_to)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pubsub.aclose()

    async def send(self, data: bytes, stream: str = STREAM) -> bytes:
        await self.redis.xadd(stream, {"__data__": data})
        return await self.reply()

    async def reply(self, timeout: float = 10.0) -> bytes:
        async with asyncio.timeout(timeout):
            while True:
                message = await self.pubsub.get_message(timeout=timeout)
                if message is not None and message["type"] == "message":
                    return bytes(message["data"])

    def envelope(self, body: dict[str, Any], correlation_id: str = "c-1") -> bytes:
        headers = {"reply_to": self.reply_to, "correlation_id": correlation_id}
        return json.dumps({"data": json.dumps(body), "headers": headers}).encode()


def save(command_id: str, content: str) -> dict[str, Any]:
    return {"type": "save_note", "command_id": command_id, "user_id": "ada", "content": content}


def json_reply(payload: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """The reply's body and headers, checked to be the JSON envelope and nothing else."""
    envelope = json.loads(payload)
    assert set(envelope) == {"data", "headers"} and isinstance(envelope["data"], str), payload
    return json.loads(envelope["data"]), envelope["headers"]


async def answered_and_gone(redis: aioredis.Redis, stream: str = STREAM) -> None:
    """Every request on ``stream`` was acknowledged and deleted (the delete follows the reply)."""
    await until_none(lambda: redis.xlen(stream), what=f"requests left in {stream}")
    assert (await redis.xpending(stream, channels.COMMAND_GROUP))["pending"] == 0
    assert await redis.xlen(channels.dead_letter_stream(stream)) == 0


@pytest.fixture
async def running(redis_url: str) -> AsyncIterator[RunningService]:
    service = await RunningService(service_settings(redis_url, index_enabled=False)).start()
    yield service
    await service.stop()


@pytest.fixture
async def caller(running: RunningService, redis_url: str) -> AsyncIterator[Caller]:
    redis = aioredis.Redis.from_url(redis_url)
    async with Caller(redis) as c:
        yield c
    await redis.aclose()


async def test_a_json_request_gets_a_json_reply_and_a_binary_one_a_binary_reply(caller: Caller) -> None:
    body, headers = json_reply(await caller.send(caller.envelope(save("json-1", "tea"), "from-json")))
    assert body["type"] == "note_written" and body["version"] == 1
    assert headers["correlation_id"] == "from-json"

    binary = await BinaryMessageFormatV1.encode(
        message=json.dumps(save("binary-1", "coffee")).encode(),
        reply_to=caller.reply_to,
        headers={},
        correlation_id="from-binary",
    )
    payload = await caller.send(binary)
    assert payload.startswith(BinaryMessageFormatV1.IDENTITY_HEADER)
    reply, binary_headers = BinaryMessageFormatV1.parse(payload)
    assert json.loads(reply)["type"] == "note_written" and binary_headers["correlation_id"] == "from-binary"

    # Error replies too: each in its request's format.
    body, _ = json_reply(await caller.send(caller.envelope(save("json-2", ""))))
    assert (body["type"], body["code"]) == ("error", "INVALID_PARAMETER")
    bad_binary = await BinaryMessageFormatV1.encode(
        message=b'{"type": "save_note"}', reply_to=caller.reply_to, headers={}, correlation_id="bad-binary"
    )
    payload = await caller.send(bad_binary)
    assert payload.startswith(BinaryMessageFormatV1.IDENTITY_HEADER)
    assert json.loads(BinaryMessageFormatV1.parse(payload)[0])["code"] == "INVALID_PARAMETER"
    await answered_and_gone(caller.redis)


def _with_reply_to(caller: Caller, headers: dict[str, Any]) -> dict[str, Any]:
    return {"reply_to": caller.reply_to, **headers}


MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("no data", {"headers": {"correlation_id": "m"}}, "the request envelope has no `data`"),
    (
        "data an object",
        {"data": save("m-1", "x"), "headers": {"correlation_id": "m"}},
        "`data` must be a string holding the JSON body, not an object",
    ),
    ("data a number", {"data": 7, "headers": {"correlation_id": "m"}}, "`data` must be a string"),
    (
        "a header not a string",
        {"data": json.dumps(save("m-2", "x")), "headers": {"correlation_id": "m", "traceparent": ["x"]}},
        "header `traceparent` must be a string, not an array",
    ),
]


@pytest.mark.parametrize(("case", "envelope", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
async def test_a_malformed_envelope_that_names_a_reply_to_gets_a_typed_error(
    caller: Caller, redis_url: str, case: str, envelope: dict[str, Any], message: str
) -> None:
    envelope = {**envelope, "headers": _with_reply_to(caller, envelope["headers"])}
    body, headers = json_reply(await caller.send(json.dumps(envelope).encode()))
    assert (body["type"], body["code"]) == ("error", "INVALID_PARAMETER")
    assert message in body["message"]
    assert headers["correlation_id"] == "m"
    assert await log_events(redis_url) == [], "nothing of a malformed request is executed"
    await answered_and_gone(caller.redis)


async def test_a_correlation_id_that_is_not_a_string_is_refused_and_echoed_as_sent(caller: Caller) -> None:
    headers = {"reply_to": caller.reply_to, "correlation_id": 42}
    body, reply_headers = json_reply(
        await caller.send(json.dumps({"data": json.dumps(save("n-1", "x")), "headers": headers}).encode())
    )
    assert (
        body["code"] == "INVALID_PARAMETER"
        and "header `correlation_id` must be a string, not a number" in (body["message"])
    )
    assert reply_headers["correlation_id"] == 42


async def test_a_caller_cannot_forge_the_envelope_error_header(caller: Caller) -> None:
    """The marker is the parser's own: sent by a caller, it is dropped and the request runs."""
    headers = {"reply_to": caller.reply_to, "correlation_id": "json", ENVELOPE_ERROR: "forged"}
    as_json = json.dumps({"data": json.dumps(save("forge-1", "tea")), "headers": headers}).encode()
    body, _ = json_reply(await caller.send(as_json))
    assert body["type"] == "note_written"

    as_binary = await BinaryMessageFormatV1.encode(
        message=json.dumps(save("forge-2", "tea")).encode(),
        reply_to=caller.reply_to,
        headers={ENVELOPE_ERROR: "forged"},
        correlation_id="binary",
    )
    payload = await caller.send(as_binary)
    assert payload.startswith(BinaryMessageFormatV1.IDENTITY_HEADER)
    assert json.loads(BinaryMessageFormatV1.parse(payload)[0])["type"] == "note_written"


@pytest.mark.parametrize(
    "data",
    [
        b"not json at all",
        b'{"data": {"type": "save_note"}, "headers": {}}',
        b'{"data": "{}", "headers": 5}',
        b'{"data": "{}", "headers": {"reply_to": 5}}',
    ],
    ids=["not json", "no reply_to", "headers not an object", "reply_to not a string"],
)
async def test_a_request_that_names_no_reply_to_is_taken_off_the_stream(caller: Caller, data: bytes) -> None:
    """Nowhere to answer: refused all the same, acknowledged and deleted, never stuck pending."""
    await caller.redis.xadd(STREAM, {"__data__": data})
    # A request after it is answered: the stream keeps flowing.
    body, _ = json_reply(await caller.send(caller.envelope(save("after-1", "tea"))))
    assert body["type"] == "note_written"
    await answered_and_gone(caller.redis)


async def test_a_redelivered_json_request_is_answered_in_json(redis_url: str) -> None:
    service = await RunningService(service_settings(redis_url, index_enabled=False, claim_idle_ms=200)).start()
    calls = 0
    original = service.engram.commands.execute

    async def fail_once(command: Any) -> Any:
        nonlocal calls
        if isinstance(command, SaveNote) and command.content == "flaky":
            calls += 1
            if calls == 1:
                raise RuntimeError("simulated infrastructure failure")
        return await original(command)

    service.engram.commands.execute = fail_once  # type: ignore[method-assign]
    redis = aioredis.Redis.from_url(redis_url)
    try:
        async with Caller(redis) as caller:
            body, headers = json_reply(await caller.send(caller.envelope(save("flaky-1", "flaky"), "again")))
            assert body["type"] == "note_written" and headers["correlation_id"] == "again"
            assert calls == 2, "answered by the re-queued copy, after the first delivery failed"
            await answered_and_gone(redis)
    finally:
        await redis.aclose()
        await service.stop()


async def test_a_json_request_that_keeps_failing_is_dead_lettered_without_its_body(redis_url: str) -> None:
    service = await RunningService(
        service_settings(redis_url, index_enabled=False, claim_idle_ms=200, max_deliveries=2)
    ).start()
    original = service.engram.commands.execute

    async def poisoned(command: Any) -> Any:
        if isinstance(command, SaveNote) and command.content == "poison":
            raise RuntimeError("simulated infrastructure bug")
        return await original(command)

    service.engram.commands.execute = poisoned  # type: ignore[method-assign]
    redis = aioredis.Redis.from_url(redis_url)
    dead_letters = channels.dead_letter_stream(STREAM)
    try:
        async with Caller(redis) as caller:
            poison = caller.envelope(save("poison-1", "poison"))
            assert b"poison" in poison
            await redis.xadd(STREAM, {"__data__": poison})
            await eventually(lambda: redis.xlen(dead_letters), what="the poison request in the dead letters")
            [(_, fields)] = await redis.xrange(dead_letters)
            # The letter names the request for an operator, but keeps none of what it asked: a
            # body can hold a user's text, and no forget reaches a dead letter.
            assert b"__data__" not in fields
            assert not any(b"poison" in value for value in fields.values() if value != b"poison-1")
            assert fields[b"type"] == b"save_note" and fields[b"command_id"] == b"poison-1"
            assert fields[b"user_id"] == b"ada" and int(fields[b"bytes"]) == len(poison)
            assert fields[b"engram-attempt"] == b"2"
            # No reply on the way: a caller gave up long before (max_deliveries * claim_idle_ms).
            assert await caller.pubsub.get_message(timeout=0.2) is None
            body, _ = json_reply(await caller.send(caller.envelope(save("healthy-1", "healthy"))))
            assert body["type"] == "note_written"
            assert [e.command_id for e in await log_events(redis_url)] == ["healthy-1"]
    finally:
        await redis.aclose()
        await service.stop()


DEEP = b"[" * 1000 + b"]" * 1000  # past msgspec's depth limit, which raises RecursionError


async def test_a_body_nested_too_deeply_gets_a_typed_error_at_once(caller: Caller) -> None:
    headers = {"reply_to": caller.reply_to, "correlation_id": "deep-body"}
    body = b'{"type": "save_note", "command_id": "deep", "user_id": "ada", "content": "x", "links": ' + DEEP + b"}"
    reply, answered = json_reply(await caller.send(json.dumps({"data": body.decode(), "headers": headers}).encode()))
    assert reply["type"] == "error" and reply["code"] == "INVALID_PARAMETER", reply
    assert "nested too deeply" in reply["message"] and answered["correlation_id"] == "deep-body"
    await answered_and_gone(caller.redis)


@pytest.mark.parametrize(
    ("unreadable", "problem"),
    [
        (b'"z": ' + DEEP, "nested too deeply"),
        (b'"z": "caf\xe9"', "not valid UTF-8"),
    ],
    ids=["nested too deeply", "not utf-8"],
)
async def test_an_envelope_no_parser_reads_is_answered_where_its_bytes_say(
    caller: Caller, unreadable: bytes, problem: str
) -> None:
    """FastStream's own parser raises on these; the request would sit pending, then be
    dead-lettered whole. It is answered at once on the reply_to its bytes name."""
    envelope = b'{"data": "{}", "headers": {"reply_to": "%s", "correlation_id": "c-9"}, %s}' % (
        caller.reply_to.encode(),
        unreadable,
    )
    reply, answered = json_reply(await caller.send(envelope))
    assert reply["code"] == "INVALID_PARAMETER" and problem in reply["message"], reply
    assert answered["correlation_id"] == "c-9"
    # Naming no reply_to: nowhere to answer, taken off the stream all the same, never dead-lettered.
    await caller.redis.xadd(STREAM, {"__data__": b'{"z": ' + DEEP + b"}"})
    await caller.redis.xadd(STREAM, {"__data__": b'{"data": "caf\xe9"}'})
    body, _ = json_reply(await caller.send(caller.envelope(save("after-unreadable", "tea"))))
    assert body["type"] == "note_written"
    await answered_and_gone(caller.redis)


async def test_a_body_that_names_a_field_twice_is_refused_and_writes_nothing(caller: Caller, redis_url: str) -> None:
    """Most JSON readers keep the last of two equal keys: ``"user_id":"fz","user_id":"ada"`` would
    save to ada. Ambiguous, so refused."""
    body = '{"type": "save_note", "command_id": "twice", "user_id": "fz", "user_id": "ada", "content": "x"}'
    headers = {"reply_to": caller.reply_to, "correlation_id": "twice"}
    reply, _ = json_reply(await caller.send(json.dumps({"data": body, "headers": headers}).encode()))
    assert reply["code"] == "INVALID_PARAMETER" and "'user_id' is given twice" in reply["message"], reply
    assert await log_events(redis_url) == []
    await answered_and_gone(caller.redis)
