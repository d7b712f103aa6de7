"""The requester's view of a lost connection, whatever form redis-py gives it."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from engram_ledger.services.bus.requester import BusRequester


class ClosedTransportRedis:
    """redis-py 8.1 on a connection the server just closed (redis/redis-py#4287)."""

    def __init__(self, error: Exception) -> None:
        self._error = error

    async def rpush(self, *args: Any, **kwargs: Any) -> int:
        raise self._error


@pytest.mark.parametrize(
    "leaked",
    [AttributeError("'NoneType' object has no attribute 'writelines'"), TypeError("'NoneType' object is not callable")],
)
async def test_a_transport_error_on_send_is_a_lost_connection(leaked: Exception) -> None:
    requester = BusRequester(ClosedTransportRedis(leaked))  # type: ignore[arg-type]
    with pytest.raises(RedisConnectionError, match="connection lost while sending"):
        await requester.request("engram:{0}:commands", b"{}", timeout=1.0)
