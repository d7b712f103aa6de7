"""The floor for the command round trip: FastStream request/reply over a Redis stream with a
consumer group and a handler that only echoes. Run as a separate process, like `engram serve`."""

from __future__ import annotations

import asyncio
import sys

from faststream import AckPolicy
from faststream.redis import StreamSub

from engram_ledger.services.bootstrap import make_broker


async def main(url: str) -> None:
    broker = make_broker(url)

    @broker.subscriber(
        stream=StreamSub("bench:echo", group="echo", consumer="echo-1", polling_interval=1000),
        ack_policy=AckPolicy.REJECT_ON_ERROR,
    )
    async def echo(body: bytes) -> bytes:  # the body as sent, as engram serve's handlers take it
        return body

    await broker.start()
    print("echo ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
