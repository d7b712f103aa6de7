"""The memory console: a Starlette app that shows a person what an agent remembers, through
``EngramClient`` (the bus) for everything about memories and the public event log for what no
query answers (users, activity, pending deletions). See the guide, "Memory console".

Memory content never goes into a URL (searches, memory blocks and forms are POSTed) nor into a
log line (no access log; the console logs its own failures only, never what a page showed).

A module per page holds its routes: ``users``, ``search``, ``notes``, ``erase``, ``context``,
``events`` (the live stream) and ``sessions`` (log in and out); ``web`` what they share and
``security`` the token check in front of them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.console import context, erase, events, notes, search, sessions, users
from engram_ledger.services.console.auth import ConsoleAuth
from engram_ledger.services.console.live import LogWatch
from engram_ledger.services.console.security import RequireToken
from engram_ledger.services.console.web import HERE, MAX_STREAMS, Console, Pages
from engram_ledger.services.ops.listening import check_port, http_url

log = logging.getLogger("engram.console")

LOOPBACK = ("127.0.0.1", "localhost", "::1")
PAGE_MODULES = (users, search, context, erase, notes, events, sessions)


def create_app(
    url: str,
    token: str,
    *,
    cluster: bool = False,
    timeout: float = 10.0,
    max_streams: int = MAX_STREAMS,
    ended_sessions: Path | None = None,
) -> Starlette:
    """The console for the Engram bus at ``url``, opened to whoever holds ``token``.
    ``ended_sessions``: where the sessions logged out of are kept across restarts."""
    auth = ConsoleAuth(token, ended_sessions)
    console = Console(url, auth, cluster, timeout, max_streams, streams=asyncio.Semaphore(max_streams))
    pages = Pages()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with EngramClient(url, timeout=timeout, cluster=cluster, operator=True) as client:
            console.client = client
            watch = LogWatch.connect(url, cluster=cluster, partitions=client.partitions)
            await watch.start()
            console.watch = watch
            try:
                yield
            finally:
                await watch.close()

    routes = [route for module in PAGE_MODULES for route in module.routes(console, pages)]
    routes.append(Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"))
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=sessions.error_handlers(pages))
    app.state.console = console
    app.add_middleware(RequireToken, auth=console.auth, login=pages.login, policy=pages.policy)
    return app


def http_server(app: Starlette, host: str, port: int) -> Any:
    """uvicorn as the console runs it: no access log (paths name users and notes; the console
    keeps to itself what people looked at), warnings and errors only."""
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=3
    )
    return uvicorn.Server(config)


async def serve_console(
    url: str,
    token: str,
    host: str,
    port: int,
    *,
    cluster: bool = False,
    timeout: float = 10.0,
    announce: Callable[[str], None] | None = None,
    ended_sessions: Path | None = None,
) -> None:
    """Runs the console with uvicorn until SIGINT/SIGTERM. The bus and the port are tried first,
    so that either failing is one typed error."""
    async with EngramClient(url, timeout=timeout, cluster=cluster):
        pass  # UNAVAILABLE now, in words, rather than as a failed lifespan later
    check_port(host, port)
    if host not in LOOPBACK:
        log.warning(
            "the console listens on %s without TLS: its token and every memory shown cross the network in clear; "
            "put a TLS proxy in front or keep it on loopback",
            host,
        )
    app = create_app(url, token, cluster=cluster, timeout=timeout, ended_sessions=ended_sessions)
    server = http_server(app, host, port)
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.05)
    if server.started and announce is not None:
        announce(http_url(host, port))
    await serving
