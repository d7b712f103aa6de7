"""``DeleteHandled``: a request stream entry is deleted as soon as its reply has been sent.

A request's body is what the caller sent: a ``SaveNote``'s text, a search's query, a key. Acked
and left in its stream, it would stay there in plain text, in Redis's memory, its RDB and its
AOF, until the stream's length cap pushed it out. So once a handler has returned and FastStream
has published its reply, the entry is acked and deleted (``XACK``, ``XDEL``); FastStream's own
ack, which runs after every middleware, then finds it acked already.

Redis frees a stream's memory by whole nodes (up to 100 entries): a deleted entry's bytes go
when every entry of its node is deleted (or trimmed), which, with every request deleted once
answered, is when the last of them is. An append-only file keeps the ``XADD`` until it is
rewritten: that is the scrub after a forget (``services/adapters/scrub.py``), which also trims
what a failed delete left. An entry whose handler failed is not deleted: it stays pending for
the reclaimer to deliver again (``services/bus/reclaimer.py``).

The reply, the ack and the delete travel in one transaction (one round trip), the reply first: a
request is never acked unless its reply is sent. The request's place in flight (the gate's,
``services/bus/admission.py``) is given back in the same transaction. Through a cluster, whose pipelines route
by key and a reply channel is none, the reply goes on its own and the ack and delete after it.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

from faststream import BaseMiddleware
from faststream.message import AckStatus
from faststream.redis.message import RedisStreamMessage
from faststream.redis.response import RedisPublishCommand
from faststream.response.publish_type import PublishType
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError

from engram_ledger.services.bus.admission import place_of

log = logging.getLogger("engram.bus")


class DeleteHandled(BaseMiddleware):
    async def consume_scope(self, call_next: Any, msg: Any) -> Any:
        result = await call_next(msg)
        # Reached only when the handler returned: a failure leaves the entry pending.
        self.handled = msg
        return result

    async def publish_scope(self, call_next: Any, cmd: Any) -> Any:
        message = getattr(self, "handled", None)
        if not (
            isinstance(cmd, RedisPublishCommand)
            and cmd.publish_type is PublishType.REPLY
            and cmd.pipeline is None
            and isinstance(message, RedisStreamMessage)
            and message.group is not None
            and type(message.consumer) is Redis  # not a cluster, nor TestRedisBroker's stand-in
        ):
            return await call_next(cmd)
        redis: Redis = message.consumer
        channel = message.raw_message["channel"]
        # MULTI/EXEC: a reply Redis refuses to queue (an ACL without its channel) aborts the
        # ack and the delete with it and raises here, so the request stays pending, as when the
        # reply is sent on its own. (The middlewares within, tracing's span among them, see the
        # reply queued, not sent: a refusal shows on the consume span.)
        async with redis.pipeline(transaction=True) as pipe:
            cmd.pipeline = pipe
            await call_next(cmd)  # the reply, queued in the pipeline
            published, *done = await _queue_ack_and_delete(pipe, message).execute(raise_on_error=False)
        if isinstance(published, Exception):
            # Refused only when run (an ACL changed between MULTI and EXEC): the ack and delete
            # ran all the same. The caller gets no reply; its retry is answered from the outcome.
            log.warning("a reply to %s could not be sent after it was queued: %r", channel, published)
        if failed := next((r for r in done if isinstance(r, Exception)), None):
            log.warning("a handled request could not be deleted from %s: %r", channel, failed)
        else:
            message.committed = AckStatus.ACKED
        self.deleted = True
        return published

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> bool | None:
        message = getattr(self, "handled", None)
        if (
            exc_type is None
            and not getattr(self, "deleted", False)
            and isinstance(message, RedisStreamMessage)
            and message.group is not None
        ):
            try:
                await _ack_and_delete(message)
            except (RedisError, OSError) as e:
                # Left for the stream's cap and the scrub; the reply is out already.
                log.warning("a handled request could not be deleted from %s: %r", message.raw_message["channel"], e)
        return False


async def _ack_and_delete(message: RedisStreamMessage) -> None:
    """``XACK`` and ``XDEL`` in one round trip (both name the same stream: one slot in a
    cluster); then the message counts as acked, so FastStream's own ack sends nothing."""
    redis = message.consumer
    if not isinstance(redis, Redis | RedisCluster):  # TestRedisBroker's stand-in
        await message.ack()
        await message.delete()
        return
    async with redis.pipeline(transaction=False) as pipe:
        await _queue_ack_and_delete(pipe, message).execute()
    message.committed = AckStatus.ACKED


def _queue_ack_and_delete(pipe: Any, message: RedisStreamMessage) -> Any:
    channel, ids = message.raw_message["channel"], message.raw_message["message_ids"]
    pipe.xack(channel, message.group, *ids).xdel(channel, *ids)
    fields = message.raw_message.get("data")
    # The place's set shares the stream's partition (its hash tag): one slot in a cluster.
    if isinstance(fields, dict) and (held := place_of(fields)) is not None:
        pipe.zrem(*held)
    return pipe
