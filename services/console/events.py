"""The live page's event stream: the log as server-sent events, for one user or all."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.bus.subscription import Subscription
from engram_ledger.services.console.live import LogEvent
from engram_ledger.services.console.web import Console, Pages, text_of, user_of


def routes(console: Console, pages: Pages) -> list[Route]:
    async def events(request: Request) -> Response:
        q = request.query_params
        user = user_of(text_of(q, "u")) if text_of(q, "u") else None
        if console.streams.locked():
            raise EngramError(
                ErrorCode.UNAVAILABLE, f"{console.max_streams} event streams are open already: close a console tab"
            )

        async def stream() -> AsyncIterator[dict[str, str]]:
            # The slot is taken here, beside where it is given back: a response that never starts
            # its body (a HEAD, a client gone at once) must not keep one.
            if console.streams.locked():
                yield {"event": "busy", "data": "{}"}
                return
            await console.streams.acquire()
            subscription: Subscription | None = None
            try:
                subscription = Subscription.connect(
                    console.url,
                    None,
                    cluster=console.cluster,
                    partition_count=console.bus.partitions,
                    users=[user] if user else None,
                )
                await subscription.start()
                yield {"event": "ready", "data": "{}"}
                async for delivery in subscription:
                    shown = LogEvent.of(delivery)
                    yield {"event": "engram", "id": shown.token, "data": json.dumps(shown.public())}
            finally:
                console.streams.release()
                # The response's task group is being cancelled (the browser went away): anyio
                # cancels every await in it again unless shielded, and the connection would leak.
                if subscription is not None:
                    with anyio.CancelScope(shield=True):
                        await subscription.close()

        return EventSourceResponse(stream(), ping=15, headers={"Cache-Control": "no-store"})

    return [Route("/events", events)]
