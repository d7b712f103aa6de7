"""What acts: command handling, query responders, the CLI, the client and the app's wiring."""

from __future__ import annotations


def engram_url() -> str:
    """The Redis URL of this user's Engram, found as the ``engram`` command finds it:
    ``ENGRAM_REDIS_URL`` if set; else the private redis-server that this user's ``engram serve``
    started (recorded in its data dir), and ``EngramError`` (``UNAVAILABLE``) while it is down, never
    another Redis; else the Redis at the default address. For ``EngramClient(engram_url())`` and
    the framework adapters."""
    from engram_ledger.services.config import Settings  # nothing is imported, nor connected, until asked
    from engram_ledger.services.ops.operator import resolve_url

    return resolve_url(Settings.from_env())
