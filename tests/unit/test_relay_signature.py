"""The relay's webhook signature and retries (services/ops/relay.py): what a receiver checks,
and what the relay does with an event the receiver keeps refusing."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from engram_ledger.contracts.events import AnyEvent, NoteForgotten, NoteSaved
from engram_ledger.contracts.model import NoteKind, NoteSource
from engram_ledger.services.ops.relay import RetryPolicy, WebhookRelay, sign, verify

pytestmark = pytest.mark.unit

SECRET = b"relay-test-secret-of-some-length"


def test_a_signature_binds_the_body_the_secret_and_the_time() -> None:
    body = b'{"id":"e1"}'
    header = sign(SECRET, body, 1_000_000)
    assert verify(SECRET, body, header, now=1_000_010)
    assert not verify(SECRET, body + b" ", header, now=1_000_010), "another body"
    assert not verify(b"another-secret-of-some-length!!", body, header, now=1_000_010), "another secret"
    assert not verify(SECRET, body, header, now=1_000_000 + 301), "past the replay window"
    assert not verify(SECRET, body, header.replace("t=1000000", "t=1000100"), now=1_000_100), "a moved time"
    assert not verify(SECRET, body, "v1=abc", now=1_000_000)


def test_the_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(give_up_after=10, first_delay=0.1, max_delay=2.0)
    for attempt in range(1, 12):
        assert 0 <= policy.delay(attempt) <= min(2.0, 0.1 * 2 ** (attempt - 1))


class FakeDelivery:
    def __init__(self, event: AnyEvent) -> None:
        self.partition, self.position, self.event, self.redelivered = 0, "1-0", event, False
        self.acks = 0

    async def ack(self) -> None:
        self.acks += 1


class DeadLetters:
    def __init__(self) -> None:
        self.added: list[dict[str, object]] = []

    async def xadd(self, stream: str, fields: dict[str, object], **_: object) -> None:
        self.added.append(fields)


def event(struct: type[AnyEvent], **fields: object) -> AnyEvent:
    common: dict[str, object] = {"event_id": "e1", "note_id": "n1", "user_id": "alice", "version": 2}
    return struct(**{**common, "command_id": "c1", "at": datetime.now(UTC), **fields})  # type: ignore[arg-type]


async def relay_against(answers: list[int], delivery: FakeDelivery, dead: DeadLetters) -> int:
    """Deliver once against a receiver that answers ``answers`` in turn (then 204s); the posts made."""
    posts = 0

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal posts
        posts += 1
        return httpx.Response(answers[posts - 1] if posts <= len(answers) else 204)

    async def no_wait(_: float) -> None:
        return None

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        relay = WebhookRelay(
            "http://receiver.invalid/hook",
            SECRET,
            "g",
            dead,  # type: ignore[arg-type]
            http,
            retry=RetryPolicy(give_up_after=0.0),
            sleep=no_wait,
        )
        await relay.deliver(delivery)
    return posts


async def test_an_erasure_is_retried_until_delivered_never_dead_lettered() -> None:
    """A copy that missed a forget would keep what the user erased: however long the receiver
    refuses, the erasure is posted again, and acked only once it is taken."""
    erasure, dead = FakeDelivery(event(NoteForgotten, request_count=1)), DeadLetters()
    assert await relay_against([503] * 50, erasure, dead) == 51
    assert erasure.acks == 1 and dead.added == []


async def test_another_event_refused_past_its_time_is_dead_lettered_without_content() -> None:
    saved = FakeDelivery(
        event(
            NoteSaved,
            version=1,
            kind=NoteKind.FACT,
            content="the door code is 4312",
            category="home",
            subject=None,
            confidence=1.0,
            source=NoteSource.EXPLICIT,
            importance=0.5,
        )
    )
    dead = DeadLetters()
    assert await relay_against([500], saved, dead) == 1
    assert saved.acks == 1 and len(dead.added) == 1
    assert dead.added[0]["id"] == "e1" and dead.added[0]["error"] == "HTTP 500"
    assert "4312" not in repr(dead.added[0]) and "receiver.invalid" not in repr(dead.added[0])


def test_the_secret_file_signs_the_same_as_it_is_or_stripped() -> None:
    """A receiver given the relay's secret file uses it as it is: with a trailing newline (as an
    editor leaves it) or without, its text or its bytes, the signature checks."""
    body = b'{"id":"e1"}'
    header = sign(SECRET, body, 1_000_000)
    for as_read in (SECRET + b"\n", SECRET, (SECRET + b"\r\n").decode(), "  " + SECRET.decode() + "\n"):
        assert verify(as_read, body, header, now=1_000_000), as_read
    assert sign(SECRET + b"\n", body, 1_000_000) == header
