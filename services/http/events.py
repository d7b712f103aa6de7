"""``GET /v1/events``: the caller's memory events as server-sent events, as they are appended.

It follows the log as the console's live page does (``Subscription`` without a group, one user's
partition, each event shown as ``LogEvent``: ids, type, times, channel; never content, which the
front door cannot open and a client reads with ``GET /v1/notes/{id}``). Each event's ``id:`` is its
consistency token, so a client that reconnects with ``Last-Event-ID`` resumes right after the last
event it had, and may pass the same token as ``Engram-Read-After`` to read what it announced.

The stream is checked against its token every ``check_seconds``: revoking the token ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import msgspec
from mcp.server.auth.provider import TokenVerifier
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import Token
from engram_ledger.services.agents.tokens import TokensUnreachable
from engram_ledger.services.bus.subscription import Subscription
from engram_ledger.services.console.live import LogEvent
from engram_ledger.services.http.errors import Refusal, error_response, refused
from engram_ledger.services.http.routes import Front

LAST_EVENT_ID = "Last-Event-ID"
PING_SECONDS = 15


def events_endpoint(
    front: Front, verifier: TokenVerifier, *, cluster: bool = False, check_seconds: float = 5.0
) -> Callable[[Request], Awaitable[Response]]:
    async def events(request: Request) -> Response:
        try:
            who = front.caller(request)
            resume = _resume(request.headers.get(LAST_EVENT_ID), who.user, front.client.partitions)
            # The place is given back when the stream ends, not when this function returns.
            place = contextlib.ExitStack()
            place.enter_context(front.shares.stream(who.holder))
        except Refusal as r:
            return refused(r)
        except EngramError as e:
            return error_response(e)
        subscription = Subscription.connect(
            front.client.url,
            None,
            cluster=cluster,
            partition_count=front.client.partitions,
            users=[who.user],
            resume=resume,
        )
        try:
            # Started before the answer: an event appended once the client has the headers is sent.
            await subscription.start()
        except EngramError as e:
            place.close()
            if e.code is ErrorCode.PERMISSION_DENIED:
                # This server's Redis user may not read the log: the deployment's to fix, not the caller's.
                e = EngramError(ErrorCode.UNAVAILABLE, f"the event stream is not served here: {e.message}")
            return error_response(e)

        async def stream() -> AsyncIterator[dict[str, str]]:
            watch = asyncio.create_task(_close_when_revoked(verifier, who.token, subscription, check_seconds))
            try:
                async for delivery in subscription:
                    shown = LogEvent.of(delivery)
                    yield {"id": shown.token, "data": msgspec.json.encode(shown).decode()}
            finally:
                place.close()
                watch.cancel()
                # The response's task group is being cancelled (the client went away): anyio
                # cancels every await in it again unless shielded, and the connection would leak.
                with anyio.CancelScope(shield=True):
                    with contextlib.suppress(asyncio.CancelledError):
                        await watch
                    await subscription.close()

        return EventSourceResponse(stream(), ping=PING_SECONDS, headers={"Cache-Control": "no-store"})

    return events


def _resume(last: str | None, user: str, partitions: int) -> dict[int, str] | None:
    """Where a reconnecting client's stream starts: after ``Last-Event-ID``, a token of its
    user's partition; None: at the log's end."""
    if not last:
        return None
    try:
        partition, _ = channels.parse_token(msgspec.convert(last, Token))
    except (msgspec.ValidationError, ValueError):
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{LAST_EVENT_ID}: {last!r} is not an event's id") from None
    if partition != channels.partition_of(user, partitions):
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"{LAST_EVENT_ID}: {last!r} is not an id of this user's events")
    return {partition: last.split(":", 1)[1]}


async def _close_when_revoked(verifier: TokenVerifier, token: str, subscription: Subscription, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            found = await verifier.verify_token(token)
        except TokensUnreachable:
            continue  # the token may be good: checked again next time
        if found is None or (found.expires_at is not None and found.expires_at <= time.time()):
            await subscription.close()
            return
