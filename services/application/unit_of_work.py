"""One command, decided and appended under optimistic concurrency: the loop every writer shares.

A command whose id already has an outcome gets that outcome again (idempotency). Otherwise: load
the states, decide, append with the versions seen; if another writer got there first, decide
again on the new states. The caller's ``Work`` says what to load and decide and how to turn an
outcome into a reply; this module owns the retries, the pauses between them and the replay rules.

The outcome is not looked up before deciding: the append script refuses a command id that has
one and answers with it, atomically, so a first attempt (nearly every command) costs one round
trip less. A retry is recognised wherever it leaves the loop without appending: a refusal, a
reply that writes nothing, a content held by another note; each looks the outcome up first.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import random
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

import msgspec

from engram_ledger.contracts.commands import AnyCommand
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.services.application.ports import Appended, ContentTaken, EventStore, Outcome, OutcomeDetail
from engram_ledger.services.domain.appends import StreamAppend

log = logging.getLogger("engram.unit_of_work")

R = TypeVar("R")

# Writers racing on one note each win a round; a contender retries after a small random pause so
# that many at once (a burst of updates to one note) spread out instead of colliding again.
MAX_ATTEMPTS = 32
PAUSE_STEP_SECONDS = 0.001
PAUSE_STEPS = 10


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What one attempt decided to append, and the detail its outcome keeps for the reply."""

    appends: list[StreamAppend]
    detail: OutcomeDetail = msgspec.field(default_factory=OutcomeDetail)


class Work(ABC, Generic[R]):
    """One command's part in the loop. ``R`` is its reply."""

    @abstractmethod
    async def decide(self) -> Decision | R:
        """Load what the command touches and decide on it. A reply instead of a ``Decision``
        means the command is answered without writing anything. Raise ``EngramError`` to refuse."""

    @abstractmethod
    async def accepted(self, outcome: Outcome, decision: Decision) -> R:
        """The reply to this attempt's append."""

    @abstractmethod
    async def replay(self, first: Outcome) -> R:
        """The reply to a command already accepted (a retry, or a copy that won the race)."""

    async def taken(self, refusal: ContentTaken) -> R | None:
        """Another note holds the content this attempt claimed: a reply, or None to decide again."""
        raise AssertionError(f"{type(self).__name__} claimed a content it does not handle: {refusal}")

    # True for a work that must know a retry before deciding: its ``decide`` may write (a put
    # expiring the note it found), so a retry would write again, or its refusal is costly to
    # build (a forget's "did you mean" reads the user's notes), so a retry would pay it again.
    replay_first = False


async def run(store: EventStore, command: AnyCommand, work: Work[R]) -> R:
    user_id, command_id = command.user_id, command.command_id
    body = request_body(command)
    fingerprint = store.fingerprint(user_id, body)

    async def replay(first: Outcome) -> R:
        if first.detail.request and first.detail.request not in (fingerprint, _unkeyed(first.detail.request, body)):
            raise EngramError(
                ErrorCode.IDEMPOTENCY_CONFLICT,
                f"command_id {command_id!r} was already used for a different request; a retry must repeat "
                "the first request exactly, and a new request needs a new command_id. Nothing was written.",
            )
        return await work.replay(first)

    if work.replay_first and (first := await store.outcome(user_id, command_id)) is not None:
        return await replay(first)
    for attempt in range(MAX_ATTEMPTS):
        try:
            decided = await work.decide()
        except EngramError:
            # A copy of this very command (a client retrying eagerly) may have just won the race
            # and caused the refusal: its outcome is the answer, as for any retry.
            if (first := await store.outcome(user_id, command_id)) is not None:
                return await replay(first)
            raise
        if not isinstance(decided, Decision):
            # Nothing to write, as a retry of an accepted update finds (its values are there):
            # the first reply, not one for the note as it is now.
            if (first := await store.outcome(user_id, command_id)) is not None:
                return await replay(first)
            return decided
        decided = msgspec.structs.replace(decided, detail=msgspec.structs.replace(decided.detail, request=fingerprint))
        result = await store.append(user_id, command_id, decided.appends, decided.detail)
        if isinstance(result, Appended):
            if result.replayed:
                # A copy got there first, deciding on the states before it: this decision (say,
                # a confirmation of the pending deletion the copy made) never happened.
                return await replay(result.outcome)
            return await work.accepted(result.outcome, decided)
        if isinstance(result, ContentTaken):
            if (first := await store.outcome(user_id, command_id)) is not None:
                return await replay(first)  # a copy of it won, as above
            if (reply := await work.taken(result)) is not None:
                return reply
            continue
        log.debug("conflict on %s (now v%d), deciding again", result.note_id, result.actual_version)
        await asyncio.sleep(random.uniform(0, PAUSE_STEP_SECONDS * min(attempt + 1, PAUSE_STEPS)))
    raise EngramError(ErrorCode.VERSION_CONFLICT, "the memory kept changing under this command; retry it")


# Not part of what a command asks: the contract version it was written against, and the token a
# request waits for before reading (a retry may carry a newer one).
_NOT_THE_REQUEST = frozenset({"schema_version", "after"})


def request_body(command: AnyCommand) -> bytes:
    """What the command asks, in one canonical form for the store to fingerprint: its fields that
    differ from their defaults (so a field a later release adds, or a default spelled out, does
    not make a retry look different), in one order, with its wire tag."""
    asked = {
        field.encode_name: getattr(command, field.name)
        for field in _request_fields(type(command))
        if not _is_default(field, getattr(command, field.name))
    }
    return msgspec.json.encode([type(command).__struct_config__.tag, asked], order="sorted")


def _unkeyed(kept: str, body: bytes) -> str | None:
    """Outcomes stored by earlier releases (for up to the idempotency TTL after an upgrade) hold
    an unkeyed hex digest; a retry is still compared with it."""
    if len(kept) != 32 or not all(c in "0123456789abcdef" for c in kept):
        return None
    return hashlib.blake2b(body, digest_size=16).hexdigest()


@functools.cache
def _request_fields(kind: type[AnyCommand]) -> tuple[msgspec.structs.FieldInfo, ...]:
    # msgspec.structs.fields resolves the type hints again on every call: about 0.13 ms, a tenth
    # of what a whole command cost in the handler, for an answer fixed per command type.
    return tuple(f for f in msgspec.structs.fields(kind) if f.name not in _NOT_THE_REQUEST)


def _is_default(field: msgspec.structs.FieldInfo, value: object) -> bool:
    if field.default is not msgspec.NODEFAULT:
        return bool(value == field.default)
    if field.default_factory is not msgspec.NODEFAULT:
        return bool(value == field.default_factory())
    return False
