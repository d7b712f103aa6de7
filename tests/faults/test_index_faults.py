"""Promise 3 for the vector index under faults: `engram serve` with the embedded Qdrant Edge
index is SIGKILLed in the middle of a load of saves, updates and forgets, and again while its
index projection is catching up after the restart. Afterwards the live index equals one rebuilt
from the log (same notes, chunks, versions and filter fields; one point per chunk), and search
finds what the last write said."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import redis.asyncio as aioredis

from engram_ledger.contracts.commands import RequestForget, SaveNote, UpdateNote
from engram_ledger.contracts.queries import ForgetReply, NoteWritten
from engram_ledger.projections.index import IndexProjection, live_index_generation
from engram_ledger.projections.index_runtime import edge_directory
from engram_ledger.projections.qdrant_edge import QdrantEdgeIndex
from engram_ledger.services.adapters.crypto import SubjectMatcher, load_master_key
from engram_ledger.services.adapters.embedder import MiniLMEmbedder
from engram_ledger.services.adapters.event_store import RedisEventStore
from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bus.client import EngramClient
from tests.faults.workload import answered
from tests.support import ServeProcess, engram_env, shape

TOPICS = ["sailing", "chess openings", "sourdough", "tax forms", "piano scales", "hiking boots", "tomato plants"]


async def until_replied(client: EngramClient, command: SaveNote | UpdateNote | RequestForget) -> object:
    """The command's reply, sent again after every silence, as a caller must."""
    expect = ForgetReply if isinstance(command, RequestForget) else NoteWritten
    deadline = asyncio.get_running_loop().time() + 120
    return await answered(lambda: client.execute(command, expect), deadline, f"a reply to {command.command_id}")  # type: ignore[arg-type]


async def test_index_killed_mid_load_and_mid_catch_up_equals_a_rebuild(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", appendfsync="always").start()
    data_dir = tmp_path / "data"
    env = engram_env(
        ENGRAM_REDIS_URL=server.url,
        ENGRAM_DATA_DIR=str(data_dir),
        ENGRAM_CLAIM_IDLE_MS="1000",
        ENGRAM_READ_WAIT_SECONDS="50",
    )
    serve = ServeProcess(env).start(timeout=60)
    rng = random.Random(6)
    notes: dict[tuple[str, str], str] = {}  # (user, note id) -> its text now
    token = ""
    try:
        async with EngramClient(server.url, timeout=3, operator=True) as client:
            for step in range(160):
                if step == 60:
                    serve.kill()  # mid-load: some writes are not yet in the index
                    serve = ServeProcess(env).start(timeout=60)
                if step == 100:
                    # While the restarted index is catching up (the model loads for seconds first).
                    serve.kill()
                    serve = ServeProcess(env).start(timeout=60)
                user = f"user-{step % 4}"
                mine = sorted(note_id for owner, note_id in notes if owner == user)
                roll, cid = rng.random(), f"c{step}"
                text = f"{user} notes about {rng.choice(TOPICS)} number {step}"
                command: SaveNote | UpdateNote | RequestForget
                if mine and roll < 0.25:
                    command = UpdateNote(command_id=cid, user_id=user, note_id=rng.choice(mine), content=text)
                elif mine and roll < 0.32:
                    command = RequestForget(command_id=cid, user_id=user, note_ids=[rng.choice(mine)], confirmed=True)
                else:
                    command = SaveNote(command_id=cid, user_id=user, content=text, advise=False)
                reply = await until_replied(client, command)
                token = reply.token  # type: ignore[attr-defined]
                if isinstance(command, RequestForget):
                    del notes[(user, command.note_ids[0])]
                else:
                    notes[(user, reply.note_id)] = text  # type: ignore[attr-defined]
            # Caught up: the last write is searchable.
            client.timeout = 60
            (last_user, last_id), last_text = next(reversed(notes.items()))
            hits = await client.search(last_user, last_text, after=token, top_k=20)
            assert last_id in [h.note_id for h in hits.results]
        assert serve.stop() == 0  # a clean stop closes the shard; the live one is read below

        redis = aioredis.Redis.from_url(server.url)
        try:
            generation = await live_index_generation(redis, 0)
            live_index = QdrantEdgeIndex(edge_directory(data_dir, generation))
            await live_index.ensure(MiniLMEmbedder.dimension)
            live = await live_index.payloads()
            await live_index.close()
            assert {(p["user_id"], p["note_id"]) for p in live} == set(notes)
            assert len(live) == len({(p["user_id"], p["note_id"], p["chunk"]) for p in live}), "one point a chunk"

            embedder = MiniLMEmbedder()
            await embedder.start()
            rebuilt = QdrantEdgeIndex(tmp_path / "rebuilt")
            await rebuilt.ensure(embedder.dimension)
            master = load_master_key(data_dir, env={})
            store = RedisEventStore(redis, 1, 3600, master)
            subjects = SubjectMatcher.from_master(master)
            rebuilding = IndexProjection(
                redis, rebuilt, embedder, 0, generation=generation + 100, store=store, subjects=subjects
            )
            await rebuilding.rebuild(store)
            assert shape(await rebuilt.payloads()) == shape(live)
            await rebuilt.close()
        finally:
            await redis.aclose()
    finally:
        serve.kill()
        server.stop()
