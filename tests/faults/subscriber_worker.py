"""A subscriber process for the fault tests: reads the log through a consumer group, with the
master key from ENGRAM_MASTER_KEY, and for each delivery appends one JSON line to a file (its
"processing"), then acks it. The line is written with one write(2) on an O_APPEND file, so a
SIGKILL loses nothing written and never leaves half a line.

    python -m tests.faults.subscriber_worker URL GROUP OUT [--delay-ms N] [--cluster]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import msgspec

from engram_ledger.services.adapters.crypto import load_master_key
from engram_ledger.services.bus.subscription import Subscription


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("group")
    parser.add_argument("out")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--cluster", action="store_true")
    args = parser.parse_args()
    key = load_master_key(Path(args.out).parent, os.environ)
    out = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    async with Subscription.connect(args.url, args.group, cluster=args.cluster, from_start=True, key=key) as events:
        print("subscribed", flush=True)
        async for delivery in events:
            event = delivery.event
            record = {
                "token": delivery.token,
                "user": event.user_id,
                "note": event.note_id,
                "version": event.version,
                "type": event.__struct_config__.tag,
                "content_state": delivery.content,
                "content": getattr(event, "content", None),
                "redelivered": delivery.redelivered,
            }
            os.write(out, msgspec.json.encode(record) + b"\n")
            if args.delay_ms:
                await asyncio.sleep(args.delay_ms / 1000)  # a subscriber slower than the writer
            await delivery.ack()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
