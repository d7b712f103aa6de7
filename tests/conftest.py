"""Shared fixtures. Integration, e2e and fault tests talk to a real Redis: the one at
ENGRAM_TEST_REDIS_URL (default: database 9 of the local Redis, flushed before each test), or a
private redis-server the test starts itself."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import pytest_asyncio
import redis

from engram_ledger.services.adapters.redis_server import RedisServer
from engram_ledger.services.bootstrap import Engram, build
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.config import Settings
from tests.support import TEST_MASTER_KEY_B64, TEST_MODEL_CACHE


def _worker_database(url: str) -> str:
    """Under pytest-xdist each worker (gw0, gw1, ...) flushes a database of its own: the URL's
    database number plus the worker's."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    parts = urlsplit(url)
    database = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{database + worker}"))


TEST_REDIS_URL = _worker_database(os.environ.get("ENGRAM_TEST_REDIS_URL", "redis://127.0.0.1:6379/9"))
# In-process services and stores share one master key (subprocesses get their own, generated
# under their data dir: tests/support.engram_env leaves ENGRAM_* variables out).
os.environ["ENGRAM_MASTER_KEY"] = TEST_MASTER_KEY_B64
os.environ["ENGRAM_MODEL_CACHE"] = str(TEST_MODEL_CACHE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The layer is the folder: tests/unit -> unit, and so on. A test on a Redis Cluster (the
    # "cluster" variant of a bus fixture, or one that starts the session's cluster) is marked
    # cluster, so that a quick local run can leave those out: -m "not cluster and not slow".
    for item in items:
        layer = Path(str(item.fspath)).parent.name
        if layer in {"unit", "integration", "e2e", "faults"}:
            item.add_marker(getattr(pytest.mark, layer))
        callspec = getattr(item, "callspec", None)
        on_cluster = callspec is not None and "cluster" in callspec.params.values()
        if on_cluster or "local_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture
def redis_url() -> Iterator[str]:
    client = redis.Redis.from_url(TEST_REDIS_URL)
    client.flushdb()
    yield TEST_REDIS_URL
    client.flushdb()
    client.close()


# Every in-process service's data dir is made under one folder, removed when the session ends
# (a test that fails before it stops its service leaves nothing behind).
_DATA_ROOT: Path | None = None


def _service_data_dir() -> Path:
    global _DATA_ROOT
    if _DATA_ROOT is None:
        _DATA_ROOT = Path(tempfile.mkdtemp(prefix="engram-tests-"))
    return Path(tempfile.mkdtemp(prefix="service-", dir=_DATA_ROOT))


@pytest.fixture(scope="session", autouse=True)
def _remove_service_data_dirs() -> Iterator[None]:
    yield
    if _DATA_ROOT is not None:
        shutil.rmtree(_DATA_ROOT, ignore_errors=True)


def service_settings(url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "redis_url": url,
        "data_dir": _service_data_dir(),
        "redis_url_configured": True,
        # A request pending this long is taken for its dead worker's and sent again: longer than a
        # busy machine's slowest handler, or a reply could come from the copy, "replayed". The
        # tests of re-delivery set their own.
        "claim_idle_ms": 30_000,
        "max_deliveries": 3,
        # How long a read waits for a token's write: a bound for a busy machine (the index
        # embeds a batch first), within the clients' own timeouts below.
        "read_wait_seconds": 20.0,
        "model_cache": TEST_MODEL_CACHE,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


class RunningService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engram: Engram = build(settings)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> RunningService:
        ready = asyncio.Event()
        self._task = asyncio.create_task(self.engram.run(ready))
        waiter = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait({waiter, self._task}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if self._task in done:
            self._task.result()
        assert waiter in done, "service did not start"
        if self.engram.index is not None:
            # Tests begin with the model loaded: from a cold disk cache, torch's import in the
            # embedder's thread can take longer than a request's timeout.
            await asyncio.wait_for(self.engram.index.embedder.start(), 120)
        return self

    async def stop(self) -> None:
        self.engram.stopping.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 60)
        if _DATA_ROOT is not None and self.settings.data_dir.parent == _DATA_ROOT:
            shutil.rmtree(self.settings.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of the session's own, for the services a whole module shares (``shared_service``,
    and ``shared_bus`` in tests/e2e): each module empties it when it begins. Not the test database
    of ``redis_url``, which is emptied before every test that asks for it."""
    server = RedisServer(Path(tmp_path_factory.mktemp("shared-redis"))).start()
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_service(shared_redis: RedisServer) -> AsyncIterator[RunningService]:
    """One service for a whole module whose tests each work on users of their own (``user``),
    where what a test checks is that user's memory, not the whole store's. The module's tests run
    in its event loop: ``pytestmark = pytest.mark.asyncio(loop_scope="module")``."""
    with redis.Redis.from_url(shared_redis.url) as r:
        r.flushall()
    running = await RunningService(service_settings(shared_redis.url)).start()
    yield running
    await running.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def shared_client(shared_service: RunningService) -> AsyncIterator[EngramClient]:
    async with EngramClient(shared_service.settings.redis_url, timeout=30, operator=True) as c:
        yield c


@pytest.fixture
def user(request: pytest.FixtureRequest) -> str:
    """A user id of the test's own, named after the test (a shared service's other tests write
    under theirs)."""
    return f"{request.node.originalname[5:25].strip('_')}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def service(redis_url: str) -> AsyncIterator[RunningService]:
    running = await RunningService(service_settings(redis_url)).start()
    yield running
    await running.stop()


@pytest.fixture
async def client(service: RunningService) -> AsyncIterator[EngramClient]:
    # Tests act as the operator too (confirmed forgets); test_operator_only.py sends as an agent.
    async with EngramClient(service.settings.redis_url, timeout=30, operator=True) as c:
        yield c
