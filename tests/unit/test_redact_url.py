"""``redact_url``: what a message or a log line shows of a Redis URL."""

from __future__ import annotations

import pytest

from engram_ledger.services.adapters.redis_conn import redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://engram:S3CRETPW@redis:6379/0", "redis://engram:***@redis:6379/0"),
        ("redis://:S3CRETPW@127.0.0.1:6379/2", "redis://:***@127.0.0.1:6379/2"),
        (
            "rediss://engram:S3CRETPW@10.0.0.5:6380/0?ssl_ca_certs=/etc/engram/ca.crt",
            "rediss://engram:***@10.0.0.5:6380/0?ssl_ca_certs=/etc/engram/ca.crt",
        ),
        ("unix://:S3CRETPW@/run/redis/redis.sock?db=1", "unix://:***@/run/redis/redis.sock?db=1"),
        ("unix:///run/redis/redis.sock?password=S3CRETPW&db=1", "unix:///run/redis/redis.sock?password=***&db=1"),
        ("redis://redis:6379/0?ssl_password=S3CRETPW", "redis://redis:6379/0?ssl_password=***"),
        # A password without its colon lands in the user part: hidden all the same.
        ("redis://S3CRETPW@redis:6379/0", "redis://***@redis:6379/0"),
        # Unencoded '@' or '?' in a password: everything up to the last '@' is credentials.
        ("redis://engram:S3C@RE?TPW@redis:6379/0", "redis://engram:***@redis:6379/0"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("unix:///run/redis/redis.sock", "unix:///run/redis/redis.sock"),
    ],
)
def test_the_password_is_hidden_and_the_rest_shown(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "S3C" not in redact_url(url)
