"""The relay's webhook signature (services/ops/relay.py): what a receiver checks."""

from __future__ import annotations

import pytest

from services.ops.relay import RetryPolicy, sign, verify

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
    policy = RetryPolicy(attempts=10, first_delay=0.1, max_delay=2.0)
    for attempt in range(1, 12):
        assert 0 <= policy.delay(attempt) <= min(2.0, 0.1 * 2 ** (attempt - 1))
