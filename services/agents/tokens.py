"""Who may call the MCP server over HTTP: bearer tokens, each bound to one user or to the
operator role, issued and revoked with ``engram tokens``.

A token is 256 random bits shown once, when it is made; Redis keeps only its SHA-256 (a slow
password hash buys nothing against a random secret of that size, and the check runs on every
request). The records live in one hash, ``engram:tokens`` (digest -> record), so every front
door that reaches the service's Redis sees a revocation on its next request.

The MCP SDK checks the ``Authorization: Bearer`` header (``mcp.server.auth``: the server acts as
an OAuth resource server whose tokens come from this registry rather than from an authorization
server's flow); ``EngramTokenVerifier`` is the verifier it calls. A gateway that authenticates
people itself may instead present one shared secret and name the user in ``X-Engram-User``,
only when the server is started with that secret (``GatewayVerifier``).

Every request's check reads Redis, through a client whose connection pool is bounded (redis-py:
100, past which a call fails at once): ``EngramTokenVerifier`` lets ``concurrency`` checks read
at a time and the others wait their turn, so a burst of requests is slowed, not failed. A check
that cannot read the registry (Redis unreachable, or no turn within ``wait_seconds``) raises
``TokensUnreachable``: the token may be good, and the HTTP front answers 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import msgspec
from mcp.server.auth.provider import AccessToken
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.authentication import AuthenticationError

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.application.decoding import check_user_id

log = logging.getLogger("engram.mcp")

Role = Literal["user", "operator"]

# What a token lets its bearer do, as the SDK's scopes: a user's token acts as its user only;
# an operator's, and the gateway's secret, act as the user each request names.
USER_SCOPE = "engram:user"
OPERATOR_SCOPE = "engram:operator"
GATEWAY_SCOPE = "engram:gateway"

TOKEN_PREFIX = "engram_"
# Enough of the digest to name a token in a listing and to revoke it, and nothing that helps
# anyone guess the token.
ID_CHARS = 12
MAX_LABEL_CHARS = 200


class TokenRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What Redis keeps of a token: never the token itself."""

    id: str
    role: Role
    user_id: str | None
    label: str = ""
    created_at: datetime
    expires_at: datetime | None = None


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenRegistry:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def create(
        self,
        *,
        user_id: str | None,
        label: str = "",
        expires_in: timedelta | None = None,
        now: datetime | None = None,
    ) -> tuple[str, TokenRecord]:
        """A new token for ``user_id`` (None: the operator role), and its record. The token is
        returned here only."""
        if user_id is not None:
            check_user_id(user_id, "--user")
        if len(label) > MAX_LABEL_CHARS:
            raise EngramError(ErrorCode.INVALID_PARAMETER, f"a label has at most {MAX_LABEL_CHARS} characters")
        if expires_in is not None and expires_in <= timedelta(0):
            raise EngramError(ErrorCode.INVALID_PARAMETER, "a token's lifetime must be positive")
        created = now or datetime.now(UTC)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        key = digest(token)
        record = TokenRecord(
            id=key[:ID_CHARS],
            role="user" if user_id is not None else "operator",
            user_id=user_id,
            label=label,
            created_at=created,
            expires_at=created + expires_in if expires_in is not None else None,
        )
        await self._redis.hset(channels.TOKENS_KEY, key, msgspec.json.encode(record))
        await self._live(created)
        return token, record

    async def records(self, now: datetime | None = None) -> list[TokenRecord]:
        """Every token's record, oldest first (an expired token is removed, not listed)."""
        found = list((await self._live(now or datetime.now(UTC))).values())
        return sorted(found, key=lambda r: (r.created_at, r.id))

    async def revoke(self, token_id: str) -> TokenRecord | None:
        """Forget the token named by ``token_id`` (its listed id); None when there is none. The
        next request that presents it is refused."""
        for key, record in (await self._live(datetime.now(UTC))).items():
            if record.id == token_id:
                await self._redis.hdel(channels.TOKENS_KEY, key)
                return record
        return None

    async def _live(self, now: datetime) -> dict[bytes, TokenRecord]:
        """The tokens not expired, by their hash; the expired ones are deleted (every command
        that manages tokens removes them: the MCP server may only read this hash)."""
        stored = await self._redis.hgetall(channels.TOKENS_KEY)
        records = {key: msgspec.json.decode(raw, type=TokenRecord) for key, raw in stored.items()}
        expired = [key for key, r in records.items() if r.expires_at is not None and r.expires_at <= now]
        if expired:
            await self._redis.hdel(channels.TOKENS_KEY, *expired)
        return {key: r for key, r in records.items() if key not in expired}

    async def find(self, token: str) -> TokenRecord | None:
        raw = await self._redis.hget(channels.TOKENS_KEY, digest(token))
        return msgspec.json.decode(raw, type=TokenRecord) if raw is not None else None


class TokensUnreachable(AuthenticationError):
    """A token could not be checked: the registry in Redis did not answer. Raised as the SDK's
    authentication error, so its middleware hands it to the answer the server chose (503)."""


# Checks reading Redis at once: well under redis-py's default pool of 100 connections, so the
# registry's other callers on the same client find one free too.
VERIFY_CONCURRENCY = 32
# How long a check waits for its turn before the caller is told to come back (503).
VERIFY_WAIT_SECONDS = 10.0


class EngramTokenVerifier:
    """The SDK's ``TokenVerifier`` over the registry (and, when given, the gateway's secret)."""

    def __init__(
        self,
        registry: TokenRegistry,
        gateway: GatewayVerifier | None = None,
        concurrency: int = VERIFY_CONCURRENCY,
        wait_seconds: float = VERIFY_WAIT_SECONDS,
    ) -> None:
        self._registry = registry
        self._gateway = gateway
        self._turns = asyncio.Semaphore(concurrency)
        self._wait_seconds = wait_seconds

    async def verify_token(self, token: str) -> AccessToken | None:
        if self._gateway is not None and self._gateway.matches(token):
            return AccessToken(token=token, client_id="gateway", scopes=[GATEWAY_SCOPE])
        if not token.startswith(TOKEN_PREFIX):
            return None
        record = await self._find(token)
        if record is None:
            return None
        # The SDK refuses a token past expires_at before any route runs.
        expires = int(record.expires_at.timestamp()) if record.expires_at is not None else None
        if record.role == "user":
            return AccessToken(
                token=token, client_id=record.id, scopes=[USER_SCOPE], subject=record.user_id, expires_at=expires
            )
        return AccessToken(token=token, client_id=record.id, scopes=[OPERATOR_SCOPE], expires_at=expires)

    async def _find(self, token: str) -> TokenRecord | None:
        try:
            # Only the wait for a turn is timed: a Redis call cancelled halfway would cost its
            # connection; the call itself ends by the client's own socket timeouts.
            async with asyncio.timeout(self._wait_seconds):
                await self._turns.acquire()
        except TimeoutError:
            raise TokensUnreachable(
                f"the token could not be checked: no answer from the token registry within {self._wait_seconds:g} s"
            ) from None
        try:
            return await self._registry.find(token)
        except (RedisConnectionError, RedisTimeoutError, OSError) as e:  # redis-py's errors are not OSErrors
            # Where Redis is stays in the server's log: the caller may not even hold a token.
            log.warning("a bearer token could not be checked: %s", e)
            raise TokensUnreachable("the token could not be checked: the token registry is unreachable") from None
        finally:
            self._turns.release()


# A shared secret shorter than this is refused: the gateway's secret is the key to every user.
MIN_GATEWAY_SECRET_CHARS = 32


class GatewayVerifier:
    def __init__(self, secret: str) -> None:
        secret = secret.strip()
        if len(secret) < MIN_GATEWAY_SECRET_CHARS:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER,
                f"the gateway's secret must be at least {MIN_GATEWAY_SECRET_CHARS} characters "
                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)",
            )
        self._secret = secret.encode()

    def matches(self, presented: str) -> bool:
        return hmac.compare_digest(presented.encode(), self._secret)


async def manage_tokens(
    registry: TokenRegistry,
    action: str,
    *,
    user_id: str | None = None,
    operator: bool = False,
    label: str = "",
    expires_in_days: float | None = None,
    token_id: str | None = None,
) -> dict[str, Any]:
    """`engram tokens create|list|revoke`: a new token (shown once), every token's record, or the
    record of the one revoked."""
    if action == "create":
        check_create(user_id, operator, expires_in_days)
        lifetime = timedelta(days=expires_in_days) if expires_in_days is not None else None
        token, record = await registry.create(user_id=user_id, label=label, expires_in=lifetime)
        return {"token": token, **msgspec.to_builtins(record)}
    if action == "revoke":
        revoked = await registry.revoke(token_id or "")
        if revoked is None:
            raise EngramError(ErrorCode.MEMORY_NOT_FOUND, f"no token has the id {token_id!r}")
        return {"revoked": msgspec.to_builtins(revoked)}
    return {"tokens": [msgspec.to_builtins(r) for r in await registry.records()]}


def check_create(user_id: str | None, operator: bool, expires_in_days: float | None) -> None:
    """What a new token names: one user, or the operator role; and a positive lifetime if any."""
    if bool(user_id) == operator:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "give --user USER, or --operator for the operator role")
    if expires_in_days is not None and expires_in_days <= 0:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "--expires-in-days must be positive")


def token_verifier(redis: Redis, gateway_secret_file: str | None) -> EngramTokenVerifier:
    """The MCP server's check of bearer tokens: the registry in Redis, and the gateway's shared
    secret when one is given (read from a file: a secret on the command line shows in ps)."""
    gateway = None
    if gateway_secret_file:
        try:
            gateway = GatewayVerifier(Path(gateway_secret_file).read_text())
        except OSError as e:
            raise EngramError(ErrorCode.INVALID_PARAMETER, f"--gateway-secret-file: {e.strerror}") from None
    return EngramTokenVerifier(TokenRegistry(redis), gateway)
