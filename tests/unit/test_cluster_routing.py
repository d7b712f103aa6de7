"""The cluster client finds the keys of a stream read itself, without a round trip to a node."""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster

from engram_ledger.services.adapters.redis_conn import open_redis, route_stream_reads


class AskingParser:
    """What redis-py's parser does for a command whose keys move: asks a node (recorded)."""

    def __init__(self) -> None:
        self.asked: list[tuple[Any, ...]] = []

    async def get_keys(self, *args: Any) -> Any:
        self.asked.append(args)
        return ("asked",)


async def test_stream_reads_find_their_keys_without_asking_a_node() -> None:
    parser = AskingParser()
    route_stream_reads(parser)
    read = await parser.get_keys("XREAD", "COUNT", 10, "BLOCK", 500, "STREAMS", "engram:{3}:log", "0-0")
    assert read == ("engram:{3}:log",)
    grouped = await parser.get_keys(
        "XREADGROUP", "GROUP", "streams", "STREAMS", "COUNT", 16, "STREAMS", "engram:{1}:commands", ">"
    )
    assert grouped == ("engram:{1}:commands",), "a group or consumer named 'streams' is not the keyword"
    assert await parser.get_keys(b"XREAD", b"STREAMS", b"a{1}", b"b{1}", b"0", b"0") == (b"a{1}", b"b{1}")
    assert parser.asked == []
    # any other command still asks
    assert await parser.get_keys("SORT", "k", "BY", "w_*") == ("asked",)


def test_every_cluster_client_engram_opens_routes_them() -> None:
    client = open_redis("redis://127.0.0.1:1/0", cluster=True)  # constructs, never connects
    assert isinstance(client, RedisCluster)
    assert client.commands_parser.get_keys.__qualname__.startswith("route_stream_reads")


async def test_any_other_command_is_asked_as_before_whatever_its_values() -> None:
    parser = AskingParser()
    route_stream_reads(parser)
    framed = b"\x89BIN" + bytes(range(256))  # a request in FastStream's binary framing
    assert await parser.get_keys("XADD", "engram:{0}:commands", "*", "__data__", framed) == ("asked",)
