"""The master key's generations as Redis records them, for every process that holds a keyring
(``crypto.MasterKey``): which generation wraps new data keys, a rotation in progress, and the
derivation root wrapped by each live generation. The keys themselves never go to Redis.

One hash, ``engram:keyring``: ``active`` (absent: 1, a store from before generations),
``target``/``from``/``phase`` while a rotation runs (services/ops/keys.py), ``root:<g>`` (the
root wrapped under generation g), and when the last rotation started, switched and completed.

A running service follows it (``KeyringWatcher``): a generation it is told about and does not
hold is read again from its keyring's file, and once a rotation switches, new data keys are
wrapped under the new generation, with no restart."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.adapters.crypto import KEYS_VARIABLE, MasterKey, MasterKeyError
from engram_ledger.services.common.periodic import every

log = logging.getLogger("engram.keyring")

KEYRING_KEY = f"{channels.PREFIX}:keyring"
WATCH_SECONDS = 1.0  # how often a running service looks for a new generation


def root_field(generation: int) -> str:
    return f"root:{generation}"


@dataclass(frozen=True)
class KeyringState:
    active: int = 1
    target: int | None = None
    source: int | None = None  # the generation a rotation replaces
    phase: str | None = None
    roots: dict[int, bytes] = field(default_factory=dict)
    times: dict[str, int] = field(default_factory=dict)  # ms, Redis's clock
    previous: int | None = None  # what the last completed rotation replaced
    # `engram keys retire` re-wrapped every data key under this generation: the older are retired.
    retired_below: int | None = None

    @property
    def rotating(self) -> bool:
        return self.target is not None

    def summary(self) -> dict[str, Any]:
        """What `engram health` and `engram keys status` show."""
        rotation = None
        if self.target is not None:
            rotation = {"from": self.source, "to": self.target, "phase": self.phase}
            rotation.update({k: _iso(v) for k, v in self.times.items() if k in ("started_at", "switched_at")})
        report: dict[str, Any] = {"generation": self.active, "rotation": rotation}
        if self.previous is not None:
            completed = self.times.get("completed_at")
            report["last_rotation"] = {"from": self.previous, "completed_at": _iso(completed) if completed else None}
        return report


def _iso(ms: int) -> str:
    """A time Redis gave in milliseconds, as a person reads it (UTC, to the second)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


async def read_state(redis: Redis) -> KeyringState:
    raw = {k.decode(): v for k, v in (await redis.hgetall(KEYRING_KEY)).items()}  # type: ignore[misc]

    def number(name: str) -> int | None:
        return int(raw[name]) if name in raw else None

    return KeyringState(
        active=number("active") or 1,
        target=number("target"),
        source=number("from"),
        phase=raw["phase"].decode() if "phase" in raw else None,
        roots={int(k[len("root:") :]): v for k, v in raw.items() if k.startswith("root:")},
        times={k: int(v) for k, v in raw.items() if k.endswith("_at")},
        previous=number("previous"),
        retired_below=number("retired_below"),
    )


def adopt_root(master: MasterKey, state: KeyringState) -> None:
    """Give ``master`` the derivation root from Redis (checked against its generation 1, if it
    holds it). Without generation 1, the root must come from Redis, wrapped by a generation
    ``master`` holds."""
    usable = [g for g in sorted(state.roots, reverse=True) if master.holds(g)]
    if usable:
        master.adopt_root(state.roots[usable[0]])
        return
    if master.has_root:
        return  # generation 1 is the root; a store never rotated keeps none in Redis
    if state.roots:
        raise MasterKeyError(
            f"this keyring ({master.source}) holds generation(s) {_list(master.generations)}, but this store's "
            f"derivation root is wrapped under generation(s) {_list(state.roots)} only: add the store's current "
            f"master key (generation {state.active}) to the keyring"
        )
    raise MasterKeyError(
        f"this keyring ({master.source}) holds no generation 1 key and this store records no other "
        f"generation: give it the key this store was created with as generation 1 (a bare key, or 1:<key> "
        f"in {KEYS_VARIABLE})"
    )


async def attach_keyring(redis: Redis, master: MasterKey) -> KeyringState:
    """Before a process wraps or derives anything: the root, and the generation that wraps new
    data keys, as this store records them. A keyring without that generation is refused."""
    state = await read_state(redis)
    for wanted in (state.active, *state.roots):
        if not master.holds(wanted):
            master.reload()
            break
    adopt_root(master, state)
    if not master.holds(state.active):
        raise MasterKeyError(
            f"this store wraps its data keys under master-key generation {state.active}, which this keyring "
            f"({master.source}) does not hold (it holds {_list(master.generations)}): add it"
        )
    master.use(state.active)
    return state


async def attach_for_operator(redis: Redis, master: MasterKey) -> KeyringState:
    """``attach_keyring`` for an operator's command: a keyring that does not fit is a typed error."""
    try:
        return await attach_keyring(redis, master)
    except MasterKeyError as e:
        raise EngramError(ErrorCode.INVALID_PARAMETER, str(e)) from None


def _list(generations: Any) -> str:
    return ", ".join(map(str, sorted(generations))) or "none"


class KeyringWatcher:
    """Keeps a running process's keyring in step with Redis: reads its source again when told of
    a generation it lacks, and wraps under the active one once it holds it. ``changed`` is
    awaited after each change (the worker's report, which a rotation waits on)."""

    def __init__(
        self, redis: Redis, master: MasterKey, changed: Callable[[], Awaitable[None]], interval: float = WATCH_SECONDS
    ) -> None:
        self._redis = redis
        self._master = master
        self._changed = changed
        self._interval = interval
        self._missing: set[int] = set()

    async def check(self) -> None:
        state = await read_state(self._redis)
        master = self._master
        wanted = {state.active} | ({state.target} if state.target is not None else set())
        changed = False
        if not all(master.holds(g) for g in wanted):
            # A small file, read on the loop (only while a generation is missing): a thread
            # would change the keyring under the loop's readers.
            changed = bool(master.reload())
            missing = {g for g in wanted if not master.holds(g)}
            if missing - self._missing:
                log.error(
                    "this store uses master-key generation(s) %s, which this worker's keyring (%s) does not "
                    "hold: add them there (the file is read again every %g s)",
                    _list(missing),
                    master.source,
                    self._interval,
                )
            self._missing = missing
        if not master.has_root and state.roots:
            adopt_root(master, state)
        if state.active != master.active_generation and master.holds(state.active):
            master.use(state.active)
            log.info("wrapping new data keys under master-key generation %d", state.active)
            changed = True
        # `engram keys retire` re-wrapped every data key under the active generation and took the
        # older ones out of the key file: a running worker lets go of them too, so a retired key
        # opens nothing it holds.
        below = state.retired_below or 0
        retired = [g for g in master.generations if g < below and g != master.active_generation]
        if retired and not state.rotating:
            master.forget_generations(retired)
            log.info("let go of retired master-key generation(s) %s", _list(set(retired)))
            changed = True
        if changed:
            await self._changed()

    async def run(self, stop: asyncio.Event) -> None:
        await every(self._interval, stop, self.check, "key generation watch", log)
