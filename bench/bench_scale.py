"""Scale-out: saves per second with N workers, on one Redis or on a Redis Cluster, none lost.

    .venv/bin/python -m bench.bench_scale [--workers 1,2] [--masters 0,3] [--clients 2]
        [--tasks 16] [--seconds 20] [--partitions 12]

For each backend (``--masters``: 0 is one Redis, M an M-master cluster, each with AOF everysec)
and each worker count, starts the Redis processes, ``--partitions`` partitions and N
``engram serve`` workers (ENGRAM_INDEX=off: the write path, not embedding), then ``--clients``
client processes of ``--tasks`` tasks each, every task saving notes of its own user as fast as
its replies come. Afterwards every acknowledged save is read back with its token (a save
acknowledged and not found is lost). Redis's own command counts (INFO commandstats, summed over
the nodes) are taken over the load, per save acknowledged, with the commands that make them up.
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import redis.asyncio as aioredis

from engram_ledger.contracts.errors import EngramError
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from tests.cluster import LocalCluster
from tests.support import ROOT, ServeProcess, engram_env

# The commands shown per save: the most frequent, enough to see where a backend's cost goes.
SHOWN_COMMANDS = 8


async def client_process(url: str, cluster: bool, seconds: float, tasks: int, name: str) -> dict[str, object]:
    """One client process: ``tasks`` tasks saving for ``seconds``; then every acknowledged save
    read back with its token."""
    acknowledged: list[tuple[str, str, str]] = []
    errors = 0
    async with EngramClient(url, cluster=cluster, timeout=30) as client:
        end = time.monotonic() + seconds

        async def saver(k: int) -> None:
            nonlocal errors
            user, i = f"{name}-u{k}", 0
            while time.monotonic() < end:
                try:
                    content = f"note {i} of {user}: a typical sentence to remember"
                    written = await client.save(user, content, advise=False)
                    acknowledged.append((user, written.note_id, written.token))
                except EngramError:
                    errors += 1
                i += 1

        await asyncio.gather(*(saver(k) for k in range(tasks)))
        print(json.dumps({"phase": "loaded", "saves": len(acknowledged)}), flush=True)
        lost = 0
        for user, note_id, token in acknowledged:
            try:
                await client.get_note(user, note_id, after=token)
            except EngramError:
                lost += 1
    return {"saves": len(acknowledged), "errors": errors, "lost": lost}


async def command_counts(urls: list[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for url in urls:
        async with aioredis.Redis.from_url(url) as redis:
            for name, stats in (await redis.info("commandstats")).items():
                counts[name.removeprefix("cmdstat_")] += int(stats["calls"])
    return counts


async def one_run(masters: int, workers: int, args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        if masters:
            cluster = LocalCluster(Path(tmp) / "cluster", masters=masters).start()
            url, nodes, stop = cluster.url, [n.url for n in cluster.nodes], cluster.stop
        else:
            server = RedisServer(Path(tmp) / "redis", appendfsync="everysec").start()
            url, nodes, stop = server.url, [server.url], server.stop
        env = engram_env(
            ENGRAM_REDIS_URL=url,
            ENGRAM_DATA_DIR=tmp,
            ENGRAM_INDEX="off",
            ENGRAM_PARTITIONS=str(args.partitions),
            ENGRAM_REDIS_CLUSTER="on" if masters else "off",
        )
        serving = [ServeProcess(env).start(timeout=120) for _ in range(workers)]
        try:
            clients = [
                subprocess.Popen(
                    [sys.executable, "-m", "bench.bench_scale", "--client", url, "--name", f"c{k}"]
                    + ["--seconds", str(args.seconds), "--tasks", str(args.tasks)]
                    + (["--cluster-client"] if masters else []),
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for k in range(args.clients)
            ]
            before = await command_counts(nodes)
            started = time.monotonic()
            for c in clients:  # each says when its load is over, before it reads back
                assert c.stdout is not None
                json.loads(c.stdout.readline())
            elapsed = time.monotonic() - started
            after = await command_counts(nodes)
            results = [json.loads(c.communicate(timeout=600)[0].splitlines()[-1]) for c in clients]
        finally:
            for worker in serving:
                worker.stop()
            stop()
    saves = sum(int(r["saves"]) for r in results)
    used = after - before
    per_save = {name: round(n / saves, 2) for name, n in used.most_common(SHOWN_COMMANDS)} if saves else {}
    return {
        "backend": f"cluster of {masters}" if masters else "one redis",
        "workers": workers,
        "saves": saves,
        # The clients start together and end at --seconds; the first ready line ends the clock.
        "saves_per_s": round(saves / min(elapsed, args.seconds), 1),
        "errors": sum(int(r["errors"]) for r in results),
        "lost": sum(int(r["lost"]) for r in results),
        "redis_commands_per_save": round(sum(used.values()) / saves, 2) if saves else None,
        "commands": per_save,
    }


async def run(args: argparse.Namespace) -> None:
    rows = []
    for masters in (int(m) for m in args.masters.split(",")):
        for workers in (int(w) for w in args.workers.split(",")):
            row = await one_run(masters, workers, args)
            rows.append(row)
            print(
                f"{row['backend']:>13}, {workers} worker(s): {row['saves_per_s']} saves/s, "
                f"{row['saves']} acknowledged, {row['lost']} lost, {row['errors']} errors; "
                f"{row['redis_commands_per_save']} Redis commands per save {row['commands']}",
                flush=True,
            )
    print(json.dumps({"clients": args.clients, "tasks": args.tasks, "seconds": args.seconds, "runs": rows}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--masters", default="0,3")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--cluster-client", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        result = asyncio.run(client_process(args.client, args.cluster_client, args.seconds, args.tasks, args.name))
        print(json.dumps(result), flush=True)
        return
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
