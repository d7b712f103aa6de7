"""What operator commands share: finding the bus, and opening Redis for a command and closing it
however the command ends (following the event log is services/bus/subscription.py's)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError as RedisConnectionError

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.private_files import NotPrivate, check_private
from engram_ledger.services.adapters.redis_conn import close_redis, open_redis, redact_url
from engram_ledger.services.adapters.redis_server import answers
from engram_ledger.services.config import Settings

if TYPE_CHECKING:
    from engram_ledger.services.adapters.crypto import MasterKey

# `engram serve` leaves the URL of the private redis-server it started here, in the data dir
# (0600: the URL holds the password, kept in PASSWORD_FILE for the next start).
PRIVATE_URL_FILE = "redis.url"
PASSWORD_FILE = "redis.password"


def resolve_url(settings: Settings) -> str:
    """The configured URL; else, when `engram serve` keeps this user's notes in a private
    redis-server (recorded in the data dir), that one, and ``UNAVAILABLE`` when it does not answer;
    else the default address. A user with a private Redis never falls back to the default address:
    whoever listens there is not necessarily the service, and would receive the caller's notes in
    the clear (or hold a store of its own that the caller takes for theirs)."""
    if settings.redis_url_configured:
        return settings.redis_url
    private = recorded_private_url(settings)
    if private is not None and answers(private):
        return private
    if private is not None or has_private_redis(settings):
        raise EngramError(ErrorCode.UNAVAILABLE, _private_redis_down(settings, private))
    return settings.redis_url


def has_private_redis(settings: Settings) -> bool:
    """Whether `engram serve` ever started a private redis-server for this data dir: its password
    stays there for good, its URL only while it runs (or after a crash)."""
    return (settings.data_dir / PASSWORD_FILE).exists() or (settings.data_dir / PRIVATE_URL_FILE).exists()


def _private_redis_down(settings: Settings, private: str | None) -> str:
    where = f", last at {redact_url(private)}" if private else ""
    return (
        f"the private Redis that keeps this user's notes (under {settings.data_dir / 'redis'}{where}) is not "
        f"running: start it with `engram serve` (in the repository: `bash scripts/serve.sh`). Nothing was sent "
        f"to the Redis at the default address {redact_url(settings.redis_url)} nor to any other; set "
        f"ENGRAM_REDIS_URL to use another Redis"
    )


def recorded_private_url(settings: Settings) -> str | None:
    """The URL `engram serve` recorded for its private redis-server, or None. Read only from a data
    dir and a file that are this user's alone (``NotPrivate`` otherwise, as an ``EngramError``)."""
    recorded = settings.data_dir / PRIVATE_URL_FILE
    if not recorded.exists():
        return None
    try:
        check_private(settings.data_dir)
        check_private(recorded)
    except NotPrivate as e:
        raise EngramError(ErrorCode.PERMISSION_DENIED, f"refusing the data dir: {e}") from None
    return recorded.read_text().strip() or None


def connect(settings: Settings, url: str | None = None, **options: Any) -> Any:
    """A Redis client for direct reads (one server or a cluster, as configured)."""
    return open_redis(url or resolve_url(settings), settings.redis_cluster, **options)


@contextlib.asynccontextmanager
async def operator_redis(settings: Settings, **options: Any) -> AsyncIterator[tuple[Any, int]]:
    """Redis as configured, and the log's partitions (as the service recorded them); closed
    however the command ends."""
    url = resolve_url(settings)
    redis = connect(settings, url, **options)
    try:
        try:
            partitions = int(await redis.get(channels.PARTITIONS_KEY) or settings.partitions)
        except (OSError, RedisConnectionError) as e:  # redis-py's ConnectionError is not an OSError
            raise EngramError(ErrorCode.UNAVAILABLE, f"cannot reach the Engram bus at {redact_url(url)}: {e}") from None
        yield redis, partitions
    finally:
        await close_redis(redis)


def subscriber_key(settings: Settings, key_file: str | None, content: bool) -> MasterKey | None:
    """The master key a reader of the log opens content with: the one in ``key_file``, else (for
    ``content``) the one `engram serve` finds, never a generated one; None: metadata only."""
    from engram_ledger.services.adapters.crypto import MasterKeyError, load_master_key

    try:
        if key_file:
            return load_master_key(settings.data_dir, {"ENGRAM_MASTER_KEY_FILE": key_file})
        if not content:
            return None
        configured = any(v for k, v in os.environ.items() if k.startswith("ENGRAM_MASTER_KEY"))
        if not configured and not (settings.data_dir / "master.key").exists():
            raise EngramError(
                ErrorCode.INVALID_PARAMETER,
                f"--content: no master key here (ENGRAM_MASTER_KEY, ENGRAM_MASTER_KEY_FILE or "
                f"{settings.data_dir / 'master.key'}); give the service's with --key-file",
            )
        return load_master_key(settings.data_dir)
    except MasterKeyError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, f"the master key: {e}") from None
