"""A real Redis Cluster on loopback for tests: three masters started from the installed
redis-server binary, joined with `redis-cli --cluster create`, stopped by the test."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
from pathlib import Path

import redis

from engram_ledger.services.adapters.redis_server import RedisServer
from tests.support import wait_until


def free_cluster_port() -> int:
    """A node listens on its port and on port + 10000 (the cluster bus), so both must be free
    and the port at most 55535."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, 55_535)
        try:
            for p in (port, port + 10_000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class LocalCluster:
    def __init__(self, directory: Path, masters: int = 3, appendfsync: str = "everysec") -> None:
        self.nodes = [
            RedisServer(
                directory / f"node-{i}",
                port=free_cluster_port(),
                appendfsync=appendfsync,
                extra_args=["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"],
            )
            for i in range(masters)
        ]

    @property
    def url(self) -> str:
        """Any node's URL is a way in: the cluster client discovers the others."""
        return self.nodes[0].url

    def start(self, timeout: float = 30.0) -> LocalCluster:
        for node in self.nodes:
            node.start()
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is needed to join a cluster")
        subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        wait_until(lambda: all(self._ok(n) for n in self.nodes), timeout, 0.1, "cluster_state:ok on every node")
        return self

    @staticmethod
    def _ok(node: RedisServer) -> bool:
        with redis.Redis(port=node.port) as client:
            return bool(client.cluster("info").get("cluster_state") == "ok")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
