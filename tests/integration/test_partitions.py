"""Several log partitions: users spread over them, tokens name their partition, and a service
refuses to start with a partition count other than the one the data was written with."""

from __future__ import annotations

import pytest

from engram_ledger.contracts import channels
from engram_ledger.services.bootstrap import ConfigurationError
from engram_ledger.services.bus.client import EngramClient
from tests.conftest import RunningService, service_settings


async def test_users_spread_over_partitions_and_read_their_writes(redis_url: str) -> None:
    running = await RunningService(service_settings(redis_url, partitions=3)).start()
    try:
        async with EngramClient(redis_url) as client:
            assert client.partitions == 3
            tokens = {}
            for i in range(12):
                user = f"user-{i}"
                saved = await client.save(user, f"note of {user}")
                tokens[user] = saved.token
                assert channels.parse_token(saved.token)[0] == channels.partition_of(user, 3)
                assert (await client.get_note(user, saved.note_id, after=saved.token)).content == f"note of {user}"
            assert len({channels.parse_token(t)[0] for t in tokens.values()}) == 3
    finally:
        await running.stop()


async def test_a_different_partition_count_refuses_to_start(redis_url: str) -> None:
    first = await RunningService(service_settings(redis_url, partitions=2)).start()
    await first.stop()
    with pytest.raises(ConfigurationError, match="ENGRAM_PARTITIONS=2"):
        await RunningService(service_settings(redis_url, partitions=4)).start()
