"""``engram serve``: start a private redis-server when no Redis is configured or reachable,
build the service and run it until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
from pathlib import Path

from engram_ledger.services.adapters.private_files import NotPrivate, check_private, private_dir, write_private
from engram_ledger.services.adapters.redis_conn import redact_url
from engram_ledger.services.adapters.redis_server import RedisServer, answers
from engram_ledger.services.config import Settings
from engram_ledger.services.ops.operator import PASSWORD_FILE, PRIVATE_URL_FILE, has_private_redis

log = logging.getLogger("engram")


def serve(settings: Settings) -> int:
    """Run until stopped; the exit code (1: cannot reach Redis or bad configuration)."""
    private_dir(settings.data_dir)
    try:
        check_private(settings.data_dir)
    except NotPrivate as e:
        log.error("refusing the data dir: %s", e)
        return 1
    log.info("data dir %s (ENGRAM_DATA_DIR to choose another)", settings.data_dir)
    earlier = Path(".engram").absolute()
    if earlier != settings.data_dir and (earlier / "master.key").exists():
        # Earlier releases kept the data dir in the working directory.
        log.warning(
            "%s holds the data of an earlier release; to go on with it, start with ENGRAM_DATA_DIR=%s",
            earlier,
            earlier,
        )
    private = None
    # A data dir whose notes are in a private Redis gets that one again, whatever answers at the
    # default address since: the `engram` commands look for no other (operator.resolve_url).
    kept = has_private_redis(settings)
    if settings.redis_url_configured:
        log.info("using the configured Redis at %s (ENGRAM_REDIS_URL)", redact_url(settings.redis_url))
    elif not kept and answers(settings.redis_url):
        # Whoever runs a Redis there gets every note: worth a line an operator notices.
        log.warning(
            "no Redis configured: using the one that answers at the default %s; set ENGRAM_REDIS_URL to choose",
            redact_url(settings.redis_url),
        )
    else:
        reason = (
            "no Redis configured and this data dir keeps its notes in a private one"
            if kept
            else f"no Redis at {redact_url(settings.redis_url)} and none configured"
        )
        private = start_private_redis(settings)
        log.info(
            "%s: started a private redis-server (AOF, password in %s) at %s under %s",
            reason,
            settings.data_dir / PASSWORD_FILE,
            redact_url(private.url),
            private.directory,
        )
        settings = Settings(**{**settings.__dict__, "redis_url": private.url})
    try:
        return asyncio.run(_run(settings))
    finally:
        if private is not None:
            private.stop()
            (settings.data_dir / PRIVATE_URL_FILE).unlink(missing_ok=True)


def start_private_redis(settings: Settings) -> RedisServer:
    """A redis-server under the data dir that refuses clients without its password. The password
    is generated once and kept beside the data it guards, as the master key is, for an operator
    who opens this Redis by hand; the URL (the port is new each start) goes where the `engram`
    commands look for it (operator.resolve_url)."""
    password_file = settings.data_dir / PASSWORD_FILE
    write_private(password_file, secrets.token_urlsafe(32) + "\n", replace=False)
    password = password_file.read_text().strip()
    if not password:  # never a private Redis open to every local user
        raise RuntimeError(f"{password_file} is empty: delete it, and a new password is generated")
    server = RedisServer(settings.data_dir / "redis", password=password).start()
    write_private(settings.data_dir / PRIVATE_URL_FILE, server.url)
    return server


async def _run(settings: Settings) -> int:
    from engram_ledger.services.bootstrap import ConfigurationError, build  # FastStream and the model: not at import

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
        log.error("cannot reach Redis at %s: %s", redact_url(settings.redis_url), e)
        return 1
    except ConfigurationError as e:
        log.error("%s", e)
        return 1
    return 0
