"""The HTTP API's cost over the bus, and 200 concurrent HTTP clients.

    .venv/bin/python -m bench.bench_http [--searches 1000] [--clients 200] [--each 5]

Starts a private redis-server, one `engram serve` (Qdrant Edge, MiniLM) and one `engram http`, as
separate processes, saves ``--notes`` notes for one user, then from this process:

1. the same search (top_k 5, the query embedded each time) ``--searches`` times over the bus
   (``EngramClient.search``) and over HTTP (``POST /v1/search``, httpx with keep-alive), in
   alternating rounds of 50 so that neither gets the quieter moments: p50/p99 of each and the
   difference of the p50s;
2. ``--clients`` HTTP clients at once, each with a token of its own user, each doing ``--each``
   rounds of a save and a search: every answer that is not a 2xx counts as an error (there must
   be none), and the p50/p99 of all the requests.

Then the raw floor of an HTTP request: the same client against a route that does nothing (uvicorn,
Starlette) in a process of its own. Prints them, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis.asyncio as aioredis

from bench.bench_core import summary
from engram_ledger.contracts.commands import NoteDraft
from engram_ledger.contracts.errors import EngramError
from engram_ledger.services.adapters.redis_server import RedisServer, free_port
from engram_ledger.services.agents.tokens import TokenRegistry
from engram_ledger.services.bus.client import EngramClient
from tests.support import ENGRAM_CLI, ROOT, ServeProcess, die_with_parent, engram_env

USER = "bench-user"
QUERY = "what does my manager think of the quarterly report?"
ROUND = 50


def start_http(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*ENGRAM_CLI, "http", "--port", str(port), "--requests-per-token", "64"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )


async def wait_for_http(base: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base) as http:
        while True:
            try:
                if (await http.get("/v1/openapi.json")).status_code == 200:
                    return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.1)


async def seed(client: EngramClient, notes: int) -> str:
    """``notes`` notes for USER; the last write's token, once the search sees them."""
    topics = ["the quarterly report", "my manager Alec", "the Lisbon trip", "oat milk", "window seats"]
    token = ""
    for start in range(0, notes, 100):
        batch = [
            NoteDraft(content=f"Note {i} about {topics[i % len(topics)]}")
            for i in range(start, min(notes, start + 100))
        ]
        written = await client.save_many(USER, batch)
        token = written.token
    for _ in range(12):  # the first search waits for the model to load
        try:
            await client.search(USER, "warm up", after=token)
            break
        except EngramError:
            await asyncio.sleep(1)
    return token


async def bus_against_http(client: EngramClient, base: str, bearer: str, searches: int) -> dict[str, object]:
    """The same search, alternately over the bus and over HTTP; the latencies of each in ms."""
    over_bus: list[float] = []
    over_http: list[float] = []
    body = {"query": QUERY, "top_k": 5}
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {bearer}"}) as http:
        for _ in range(3):  # warm both paths
            await client.search(USER, QUERY)
            (await http.post("/v1/search", json=body)).raise_for_status()
        while len(over_bus) < searches:
            for _ in range(min(ROUND, searches - len(over_bus))):
                began = time.perf_counter()
                await client.search(USER, QUERY)
                over_bus.append((time.perf_counter() - began) * 1000)
            for _ in range(min(ROUND, searches - len(over_http))):
                began = time.perf_counter()
                (await http.post("/v1/search", json=body)).raise_for_status()
                over_http.append((time.perf_counter() - began) * 1000)
    bus, web = summary(over_bus), summary(over_http)
    return {"bus": bus, "http": web, "p50_difference_ms": round(web["p50_ms"] - bus["p50_ms"], 3)}


# The raw floor of an HTTP request on this machine: the same client, uvicorn and Starlette, a route
# that reads the body and answers a fixed reply, in a process of its own.
_FLOOR_APP = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
async def answer(request):
    await request.body()
    return Response(b'{"results": []}', media_type="application/json")
app = Starlette(routes=[Route("/v1/search", answer, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


async def http_floor(requests: int) -> dict[str, float]:
    """The p50/p99 of a POST answered by a route that does nothing, in ms."""
    port = free_port()
    app = subprocess.Popen([sys.executable, "-c", _FLOOR_APP, str(port)], preexec_fn=die_with_parent)
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base) as http:
            for _ in range(600):
                try:
                    await http.post("/v1/search", json={})
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
            took = []
            for _ in range(requests):
                began = time.perf_counter()
                (await http.post("/v1/search", json={"query": QUERY, "top_k": 5})).raise_for_status()
                took.append((time.perf_counter() - began) * 1000)
        return summary(took)
    finally:
        app.terminate()
        app.wait(timeout=20)


async def concurrent_clients(base: str, tokens: list[str], each: int) -> dict[str, object]:
    """Every token's client at once, each doing ``each`` rounds of a save then a search."""
    latencies: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=len(tokens), max_keepalive_connections=len(tokens))

    async def one(http: httpx.AsyncClient, token: str, n: int) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        for i in range(each):
            for path, body in (
                ("/v1/notes", {"content": f"Client {n} says hello, round {i}", "advise": False}),
                ("/v1/search", {"query": f"what did client {n} say?", "top_k": 5}),
            ):
                began = time.perf_counter()
                try:
                    answer = await http.post(path, json=body, headers=headers)
                    if answer.status_code >= 300:
                        errors.append(f"{answer.status_code} {answer.text[:200]}")
                except httpx.HTTPError as e:
                    errors.append(f"{type(e).__name__}: {e}")
                latencies.append((time.perf_counter() - began) * 1000)

    began = time.perf_counter()
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as http:
        await asyncio.gather(*(one(http, token, n) for n, token in enumerate(tokens)))
    elapsed = time.perf_counter() - began
    return {
        "clients": len(tokens),
        "requests": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:5],
        "requests_per_s": round(len(latencies) / elapsed, 1),
        **summary(latencies),
    }


async def run(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        env = engram_env(ENGRAM_REDIS_URL=server.url, ENGRAM_DATA_DIR=tmp)
        worker = ServeProcess(env).start(timeout=120)
        port = free_port()
        web = start_http(env, port)
        base = f"http://127.0.0.1:{port}"
        try:
            await wait_for_http(base)
            async with EngramClient(server.url, timeout=60) as client, aioredis.Redis.from_url(server.url) as redis:
                registry = TokenRegistry(redis)
                await seed(client, args.notes)
                bearer, _ = await registry.create(user_id=USER)
                compared = await bus_against_http(client, base, bearer, args.searches)
                tokens = [(await registry.create(user_id=f"client-{n}"))[0] for n in range(args.clients)]
                crowd = await concurrent_clients(base, tokens, args.each)
        finally:
            web.terminate()
            web.wait(timeout=20)
            worker.stop()
            server.stop()
    floor = await http_floor(args.searches)
    return {"cores": os.cpu_count(), "notes": args.notes, "search": compared, "http_floor": floor, "concurrent": crowd}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--notes", type=int, default=1_000)
    parser.add_argument("--searches", type=int, default=1_000)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--each", type=int, default=5)
    results = asyncio.run(run(parser.parse_args()))
    search, crowd = results["search"], results["concurrent"]
    assert isinstance(search, dict) and isinstance(crowd, dict)
    print(f"search over the bus:  p50 {search['bus']['p50_ms']} ms, p99 {search['bus']['p99_ms']} ms")
    print(f"search over HTTP:     p50 {search['http']['p50_ms']} ms, p99 {search['http']['p99_ms']} ms")
    print(f"HTTP's p50 over the bus's: {search['p50_difference_ms']} ms")
    floor = results["http_floor"]
    assert isinstance(floor, dict)
    print(f"raw floor, a POST to a route that does nothing (httpx, uvicorn, Starlette): p50 {floor['p50_ms']} ms")
    print(
        f"{crowd['clients']} concurrent HTTP clients: {crowd['requests']} requests, {crowd['errors']} errors, "
        f"p50 {crowd['p50_ms']} ms, p99 {crowd['p99_ms']} ms, {crowd['requests_per_s']} requests/s"
    )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
