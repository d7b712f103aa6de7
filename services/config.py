"""Configuration from the environment (documented in README's Configuration table)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engram_ledger.services.adapters.minilm import ENCODER_KINDS
from engram_ledger.services.application.ranking import DEFAULT_POLICY, FUSION_METHODS, RankingPolicy
from engram_ledger.services.application.relevance import DEFAULT_FLOOR
from engram_ledger.services.bus.admission import DEFAULT_USER_IN_FLIGHT

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class SettingError(ValueError):
    """An environment variable the service cannot use; the message names it."""


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    try:
        return default if raw is None else int(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not a whole number") from None


def _at_least(name: str, default: int, least: int) -> int:
    value = _int(name, default)
    if value < least:
        raise SettingError(f"{name}={value} is below {least}")
    return value


def _float_at_least(name: str, default: float, least: float) -> float:
    value = _float(name, default)
    if value < least:
        raise SettingError(f"{name}={value:g} is below {least:g}")
    return value


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    try:
        return default if raw is None else float(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not a number") from None


def _unit(name: str, default: float) -> float:
    value = _float(name, default)
    if not 0 <= value <= 1:
        raise SettingError(f"{name}={value:g} is not between 0 and 1")
    return value


def _positive_or_none(name: str) -> float | None:
    """Seconds; unset or 0: none."""
    value = _float(name, 0.0)
    if not math.isfinite(value) or value < 0:
        raise SettingError(f"{name}={value} is not a number of seconds of 0 or more")
    return value or None


def _choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name, default).strip().lower()
    if raw not in choices:
        raise SettingError(f"{name}={raw!r} is not one of {', '.join(choices)}")
    return raw


def _policy(method: str, weights: str) -> RankingPolicy:
    default = DEFAULT_POLICY
    dense, sparse = (default.dense_weight, default.keyword_weight)
    if weights:
        dense, sparse = (float(x) for x in weights.split(","))
    chosen = method.strip() or default.method
    if chosen not in FUSION_METHODS:
        raise ValueError(f"ENGRAM_SEARCH_FUSION={method!r}: choose from {', '.join(FUSION_METHODS)}")
    return RankingPolicy(method=chosen, dense_weight=dense, keyword_weight=sparse)  # type: ignore[arg-type]


ROLES = ("commands", "queries", "history", "index", "saga")


def parse_roles(text: str) -> frozenset[str]:
    """``all`` or a comma list of ROLES: the workers one `engram serve` process runs."""
    names = {r.strip() for r in text.split(",") if r.strip()}
    if not names or "all" in names:
        return frozenset(ROLES)
    unknown = names - set(ROLES)
    if unknown:
        raise ValueError(f"unknown role(s) {', '.join(sorted(unknown))}: choose from all, {', '.join(ROLES)}")
    return frozenset(names)


def _url_file(name: str) -> str | None:
    """A URL read from the file the variable names: a URL with a password is a secret, which a
    file (a compose secret) keeps out of the process's environment and `docker inspect`."""
    path = os.environ.get(name)
    if not path:
        return None
    try:
        url = Path(path).read_text().strip()
    except OSError as e:
        raise SettingError(f"{name}={path!r}: cannot read it ({e.strerror})") from None
    if not url:
        raise SettingError(f"{name}={path!r} is empty; it should hold a Redis URL")
    return url


def _on(text: str) -> bool:
    return text.strip().lower() in ("on", "1", "true", "yes")


def _triple(text: str) -> tuple[float, float, float]:
    relevance, recency, importance = (float(x) for x in text.split(","))
    return relevance, recency, importance


def default_data_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``ENGRAM_DATA_DIR``, else the user's state directory (XDG's ``$XDG_STATE_HOME/engram``,
    by default ``~/.local/state/engram``); always absolute, so that it means the same from any
    working directory (and to the redis-server started there, which changes its own)."""
    given = env.get("ENGRAM_DATA_DIR")
    if given:
        return Path(given).expanduser().absolute()
    state = env.get("XDG_STATE_HOME", "")
    # XDG: a relative XDG_STATE_HOME is invalid and is ignored.
    base = Path(state) if state and Path(state).is_absolute() else Path.home() / ".local" / "state"
    return base / "engram"


def default_model_cache(env: Mapping[str, str] = os.environ) -> Path:
    """Where the embedding model's ONNX export is kept when ``ENGRAM_MODEL_CACHE`` is not set: the
    user's cache directory (XDG's ``$XDG_CACHE_HOME/engram/models``, by default
    ``~/.cache/engram/models``), shared by every data dir of the user, so the export is made once
    per machine and model (its file names carry a digest of the weights)."""
    cache = env.get("XDG_CACHE_HOME", "")
    base = Path(cache) if cache and Path(cache).is_absolute() else Path.home() / ".cache"
    return base / "engram" / "models"


@dataclass(frozen=True)
class Settings:
    redis_url: str = DEFAULT_REDIS_URL
    # False when no URL was given: `engram serve` may then start a private redis-server.
    redis_url_configured: bool = False
    # The URL names one node of a Redis Cluster; the partitions spread over its slots.
    redis_cluster: bool = False
    # A per-call time limit on the serving process's Redis connections; None: none, and TCP
    # finds a Redis that went silent (see redis_conn.serving_options). For a Redis behind
    # something that answers TCP for it (a TLS terminator, a proxy, a sidecar).
    redis_socket_timeout: float | None = None
    # Where the service keeps its state (the master key, the index, the private Redis); one place
    # per user, found by every command of that user from any directory.
    data_dir: Path = field(default_factory=lambda: default_data_dir())
    partitions: int = 1
    idempotency_ttl_seconds: int = 7 * 24 * 3600
    read_wait_seconds: float = 5.0
    request_timeout_seconds: float = 10.0
    claim_idle_ms: int = 30_000
    max_deliveries: int = 5
    request_stream_maxlen: int = 100_000
    # Messages handled at once per request stream: commands of different notes proceed in
    # parallel; two on the same note are serialised by the optimistic append.
    handler_concurrency: int = 16
    # How many requests one user may hold on a worker's request stream (running, or waiting
    # its turn) before the next is refused RATE_LIMITED; 0: a quarter of handler_concurrency.
    user_share: int = 0
    # A client's bound on one user's requests waiting for replies, across every client of the
    # Redis (services/bus/admission.py); 0: none.
    user_in_flight: int = DEFAULT_USER_IN_FLIGHT

    @property
    def share_per_user(self) -> int:
        return self.user_share or max(1, self.handler_concurrency // 4)

    # How long a dead worker's projection lease blocks a successor: the failover time.
    lease_ms: int = 3_000
    # The vector index: on by default (Qdrant Edge under the data dir, or a Qdrant server).
    index_enabled: bool = True
    qdrant_url: str | None = None
    qdrant_api_key: str | None = None
    # Forgotten points leave the embedded index's files within this many seconds (plus the time
    # to rewrite the shard): the first delete is compacted away at once, later ones at most this
    # often (projections/qdrant_edge.py).
    index_purge_seconds: float = 60.0
    # How MiniLM runs: onnx (ONNX Runtime, the default), onnx-int8 (8-bit weights: faster, other
    # vectors, so `engram rebuild index` on a change) or torch (sentence-transformers).
    encoder: str = "onnx"
    # Where the ONNX export of the model is kept (None: the user's cache, default_model_cache).
    model_cache: Path | None = None
    # ONNX Runtime threads per encode; 0: one per core.
    encoder_threads: int = 0
    # How dense and BM25 candidates are fused, and their weights; see services/application/ranking.py.
    search_policy: RankingPolicy = DEFAULT_POLICY
    # Cosine from which an active note is reported as similar to one just saved.
    similar_threshold: float = 0.5
    # The relevance below which a search's hits are not returned, when the search gives no
    # min_relevance of its own (0: every hit); see services/application/relevance.py.
    min_relevance: float = DEFAULT_FLOOR
    # How long a requested deletion waits for its confirmation (requirements §1: 5 minutes).
    forget_ttl_seconds: float = 300.0
    # Whose searches and memory blocks are recorded as recalls: "off", "all", or user ids,
    # comma-separated (services/application/recalls.py).
    recall_audit: str = "off"
    # Prometheus metrics on this port; 0: off.
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    # OpenTelemetry spans for every request handled (FastStream's middleware).
    tracing: bool = False
    # ranking="blended": weights of (relevance, recency, importance) and recency's half-life.
    ranking_weights: tuple[float, float, float] = (0.7, 0.15, 0.15)
    recency_half_life_days: float = 30.0
    # Off: a deployment where forget requests by id execute at once (no second call).
    forget_confirmation: bool = True
    # Which workers this process runs (`engram serve --role`); several processes share the groups.
    roles: frozenset[str] = frozenset(ROLES)
    # `engram mcp --http`: a session with no request for this long is closed (the SDK's default
    # is 30 minutes; an open session holds memory until then).
    mcp_session_idle_seconds: float = 300.0
    # Open MCP sessions over HTTP one token may hold (the gateway's: per user it names).
    mcp_sessions_per_token: int = 16
    consumer_name: str = field(default_factory=lambda: f"{os.uname().nodename}-{os.getpid()}")

    @property
    def model_cache_dir(self) -> Path:
        return self.model_cache if self.model_cache is not None else default_model_cache()

    @classmethod
    def from_env(cls) -> Settings:
        """Settings from ``ENGRAM_*`` variables; a bad value is a ``ValueError`` naming it."""
        try:
            return cls._from_env()
        except SettingError:
            raise
        except ValueError as e:  # a list setting that does not parse (weights, roles, fusion)
            raise SettingError(str(e)) from None

    @classmethod
    def _from_env(cls) -> Settings:
        url = os.environ.get("ENGRAM_REDIS_URL") or os.environ.get("REDIS_URL") or _url_file("ENGRAM_REDIS_URL_FILE")
        return cls(
            # With no URL configured, this address is tried first (then a private redis-server).
            redis_url=url or os.environ.get("ENGRAM_DEFAULT_REDIS_URL", DEFAULT_REDIS_URL),
            redis_url_configured=url is not None,
            redis_cluster=_on(os.environ.get("ENGRAM_REDIS_CLUSTER", "off")),
            redis_socket_timeout=_positive_or_none("ENGRAM_REDIS_SOCKET_TIMEOUT"),
            data_dir=default_data_dir(),
            partitions=_int("ENGRAM_PARTITIONS", 1),
            idempotency_ttl_seconds=_int("ENGRAM_IDEMPOTENCY_TTL_SECONDS", 7 * 24 * 3600),
            read_wait_seconds=_float("ENGRAM_READ_WAIT_SECONDS", 5.0),
            request_timeout_seconds=_float("ENGRAM_REQUEST_TIMEOUT_SECONDS", 10.0),
            claim_idle_ms=_int("ENGRAM_CLAIM_IDLE_MS", 30_000),
            max_deliveries=_int("ENGRAM_MAX_DELIVERIES", 5),
            request_stream_maxlen=_int("ENGRAM_REQUEST_STREAM_MAXLEN", 100_000),
            lease_ms=_int("ENGRAM_LEASE_MS", 3_000),
            handler_concurrency=_int("ENGRAM_HANDLER_CONCURRENCY", 16),
            user_share=_at_least("ENGRAM_USER_SHARE", 0, 0),
            user_in_flight=_at_least("ENGRAM_USER_IN_FLIGHT", DEFAULT_USER_IN_FLIGHT, 0),
            index_enabled=os.environ.get("ENGRAM_INDEX", "on").lower() not in ("off", "0", "false", "no"),
            qdrant_url=os.environ.get("ENGRAM_QDRANT_URL") or None,
            qdrant_api_key=os.environ.get("ENGRAM_QDRANT_API_KEY") or None,
            index_purge_seconds=_float_at_least("ENGRAM_INDEX_PURGE_SECONDS", 60.0, 0.0),
            encoder=_choice("ENGRAM_ENCODER", "onnx", ENCODER_KINDS),
            model_cache=Path(os.environ["ENGRAM_MODEL_CACHE"]) if os.environ.get("ENGRAM_MODEL_CACHE") else None,
            encoder_threads=_at_least("ENGRAM_ENCODER_THREADS", 0, 0),
            search_policy=_policy(
                os.environ.get("ENGRAM_SEARCH_FUSION", ""), os.environ.get("ENGRAM_SEARCH_WEIGHTS", "")
            ),
            similar_threshold=_float("ENGRAM_SIMILAR_THRESHOLD", 0.5),
            min_relevance=_unit("ENGRAM_MIN_RELEVANCE", DEFAULT_FLOOR),
            forget_ttl_seconds=_float("ENGRAM_FORGET_TTL_SECONDS", 300.0),
            recall_audit=os.environ.get("ENGRAM_RECALL_AUDIT", "off"),
            ranking_weights=_triple(os.environ.get("ENGRAM_RANKING_WEIGHTS", "0.7,0.15,0.15")),
            recency_half_life_days=_float("ENGRAM_RECENCY_HALF_LIFE_DAYS", 30.0),
            metrics_port=_int("ENGRAM_METRICS_PORT", 0),
            metrics_host=os.environ.get("ENGRAM_METRICS_HOST", "127.0.0.1"),
            tracing=os.environ.get("ENGRAM_TRACING", "off").lower() in ("on", "1", "true", "yes"),
            roles=parse_roles(os.environ.get("ENGRAM_ROLES", "all")),
            forget_confirmation=os.environ.get("ENGRAM_FORGET_CONFIRMATION", "on").lower()
            not in ("off", "0", "false", "no"),
            mcp_session_idle_seconds=_float_at_least("ENGRAM_MCP_SESSION_IDLE_SECONDS", 300.0, 1.0),
            mcp_sessions_per_token=_at_least("ENGRAM_MCP_SESSIONS_PER_TOKEN", 16, 1),
        )
