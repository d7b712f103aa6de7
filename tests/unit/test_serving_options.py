"""The serving process's Redis connections: no per-call socket timeout unless configured (a Redis
behind a proxy), TCP keepalive and TCP_USER_TIMEOUT in its place; ``tests/faults/test_lost_peer.py``
cuts a real network under them."""

from __future__ import annotations

import socket

import pytest

from engram_ledger.services.adapters.redis_conn import UNACKNOWLEDGED_LIMIT_MS, serving_options
from engram_ledger.services.bootstrap import build
from engram_ledger.services.config import SettingError, Settings
from tests.conftest import service_settings

linux_tcp = pytest.mark.skipif(
    not hasattr(socket, "TCP_USER_TIMEOUT") or not hasattr(socket, "TCP_KEEPIDLE"), reason="Linux's TCP options"
)


@linux_tcp
def test_no_socket_timeout_and_tcp_finds_a_silent_peer() -> None:
    options = serving_options("redis://redis.internal:6379/0")
    assert options["socket_timeout"] is None and options["socket_connect_timeout"] == 5.0
    assert options["socket_keepalive"] is True
    assert options["socket_keepalive_options"][socket.TCP_USER_TIMEOUT] == UNACKNOWLEDGED_LIMIT_MS
    assert socket.TCP_KEEPIDLE in options["socket_keepalive_options"]
    assert serving_options("rediss://redis.internal:6380/0", socket_timeout=2.5)["socket_timeout"] == 2.5


@pytest.mark.parametrize("url", ["unix:///run/redis.sock", "UNIX:///run/redis.sock?db=1"])
def test_a_unix_socket_gets_no_tcp_options(url: str) -> None:
    # redis-py's unix connection refuses keepalive arguments (a TypeError on connect).
    assert serving_options(url) == {"socket_timeout": None, "socket_connect_timeout": 5.0}


def test_the_socket_timeout_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGRAM_REDIS_SOCKET_TIMEOUT", raising=False)
    assert Settings.from_env().redis_socket_timeout is None
    monkeypatch.setenv("ENGRAM_REDIS_SOCKET_TIMEOUT", "0")
    assert Settings.from_env().redis_socket_timeout is None
    monkeypatch.setenv("ENGRAM_REDIS_SOCKET_TIMEOUT", "2.5")
    assert Settings.from_env().redis_socket_timeout == 2.5
    for bad, message in (
        ("-1", "ENGRAM_REDIS_SOCKET_TIMEOUT=-1.0 is not a number of seconds of 0 or more"),
        ("nan", "ENGRAM_REDIS_SOCKET_TIMEOUT=nan is not"),
        ("inf", "ENGRAM_REDIS_SOCKET_TIMEOUT=inf is not"),
        ("soon", "is not a number"),
    ):
        monkeypatch.setenv("ENGRAM_REDIS_SOCKET_TIMEOUT", bad)
        with pytest.raises(SettingError, match=message):
            Settings.from_env()


def test_without_tcp_user_timeout_a_socket_timeout_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    # Data sent to a vanished peer would be retried for many minutes (macOS has no such option).
    monkeypatch.delattr(socket, "TCP_USER_TIMEOUT", raising=False)
    assert serving_options("redis://redis.internal:6379/0")["socket_timeout"] == 5.0
    assert serving_options("redis://redis.internal:6379/0", socket_timeout=2.5)["socket_timeout"] == 2.5


@linux_tcp
@pytest.mark.parametrize("configured", [None, 2.5])
def test_the_service_and_its_broker_connect_with_the_serving_options(configured: float | None) -> None:
    engram = build(service_settings("redis://127.0.0.1:1/0", redis_socket_timeout=configured, index_enabled=False))
    own = engram.redis.connection_pool.connection_kwargs
    brokers = engram.broker.config.broker_config.connection._options  # type: ignore[attr-defined]
    for options in (own, brokers):
        assert options["socket_timeout"] == configured
        assert options["socket_keepalive_options"][socket.TCP_USER_TIMEOUT] == UNACKNOWLEDGED_LIMIT_MS
