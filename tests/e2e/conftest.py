"""Every end-to-end test that takes ``bus`` runs twice: on the single Redis, and on a real Redis
Cluster of three masters (started once for the session) with six partitions spread over its
slots by their hash tags."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from tests.cluster import LocalCluster
from tests.conftest import TEST_REDIS_URL
from tests.support import ServeProcess, cli, engram_env, wait_until

CLUSTER_PARTITIONS = "6"


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(Path(tmp_path_factory.mktemp("cluster"))).start()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["redis", "cluster"])
def bus(request: pytest.FixtureRequest) -> dict[str, str]:
    """The ENGRAM_* variables that point a process at the Redis under test."""
    if request.param == "redis":
        return {"ENGRAM_REDIS_URL": request.getfixturevalue("redis_url")}
    cluster: LocalCluster = request.getfixturevalue("local_cluster")
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as client:
            client.flushall()
    return {"ENGRAM_REDIS_URL": cluster.url, "ENGRAM_REDIS_CLUSTER": "on", "ENGRAM_PARTITIONS": CLUSTER_PARTITIONS}


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(Path(tmp_path_factory.mktemp("shared-cluster"))).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module", params=["redis", "cluster"])
def shared_bus(request: pytest.FixtureRequest) -> dict[str, str]:
    """As ``bus``, for one `engram serve` a whole module shares, each test on users of its own:
    a Redis (or a Cluster) of the session's own, emptied when the module begins. Not ``bus``'s:
    that one is emptied before every test, which would take a shared service's state away."""
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("shared_redis")
        with redis.Redis.from_url(server.url) as client:
            client.flushall()
        return {"ENGRAM_REDIS_URL": server.url}
    cluster: LocalCluster = request.getfixturevalue("shared_cluster")
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as client:
            client.flushall()
    return {"ENGRAM_REDIS_URL": cluster.url, "ENGRAM_REDIS_CLUSTER": "on", "ENGRAM_PARTITIONS": CLUSTER_PARTITIONS}


@pytest.fixture(scope="module")
def engram_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `engram serve` on the test Redis for a whole module (the framework adapters' tests:
    each test works on users of its own). Its URL."""
    flush = redis.Redis.from_url(TEST_REDIS_URL)
    flush.flushdb()
    env = engram_env(ENGRAM_REDIS_URL=TEST_REDIS_URL, ENGRAM_DATA_DIR=str(Path(tmp_path_factory.mktemp("engram"))))
    serve = ServeProcess(env).start()
    # The model loads in the background; the tests search, so they start warm.
    wait_until(lambda: cli(env, "search", "--user", "warm-up", "anything")[0] == 0, timeout=90, interval=0.5)
    yield TEST_REDIS_URL
    assert serve.stop() == 0
    flush.flushdb()
    flush.close()


@pytest.fixture
async def engram(engram_url: str) -> AsyncIterator[EngramClient]:
    """A client of the module's `engram serve`."""
    async with EngramClient(engram_url, timeout=30, operator=True) as client:
        yield client
