"""``engram serve``: start a private redis-server when no Redis is configured or reachable,
build the service and run it until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal

from services.adapters.redis_server import RedisServer, answers
from services.config import Settings
from services.ops.operator import PRIVATE_URL_FILE

log = logging.getLogger("engram")


def serve(settings: Settings) -> int:
    """Run until stopped; the exit code (1: cannot reach Redis or bad configuration)."""
    private = None
    if not settings.redis_url_configured and not answers(settings.redis_url):
        private = RedisServer(settings.data_dir / "redis").start()
        (settings.data_dir / PRIVATE_URL_FILE).write_text(private.url)
        log.info(
            "no Redis at %s and none configured: started a private redis-server (AOF) at %s under %s",
            settings.redis_url,
            private.url,
            private.directory,
        )
        settings = Settings(**{**settings.__dict__, "redis_url": private.url})
    try:
        return asyncio.run(_run(settings))
    finally:
        if private is not None:
            private.stop()
            (settings.data_dir / PRIVATE_URL_FILE).unlink(missing_ok=True)


async def _run(settings: Settings) -> int:
    from services.bootstrap import ConfigurationError, build  # FastStream and the model: not at import

    try:
        engram = build(settings)
    except ConfigurationError as e:
        log.error("%s", e)
        return 1
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, engram.stopping.set)
    try:
        await engram.run()
    except (OSError, ConnectionError) as e:
        log.error("cannot reach Redis at %s: %s", settings.redis_url, e)
        return 1
    except ConfigurationError as e:
        log.error("%s", e)
        return 1
    return 0
