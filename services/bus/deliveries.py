"""What a subscriber of the log is handed: ``Delivery`` (one entry, its typed event and its
ack), the ``Erasure`` a forget asks of a downstream copy, whether the content was opened
(``ContentState``), and the checks of a subscription's filters. No I/O but the ack."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import msgspec
from cryptography.exceptions import InvalidTag

from engram_ledger.contracts import channels
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import (
    AnyEvent,
    Event,
    MemoryRecalled,
    NoteForgotten,
    SessionForgotten,
    UserForgotten,
)
from engram_ledger.contracts.limits import UserId
from engram_ledger.services.adapters.crypto import (
    MasterKey,
    MasterKeyError,
    NoteCipher,
    is_sealed,
    needs_key,
    recall_key,
    recall_key_notes,
    shredded,
)

if TYPE_CHECKING:
    from engram_ledger.services.bus.subscription import Subscription


EVENT_TYPES: dict[str, type[Event]] = {str(cls.__struct_config__.tag): cls for cls in get_args(AnyEvent)}
# What a downstream copy must act on. A ``kinds`` filter never holds them back: a subscriber that
# keeps copies must hear of every erasure.
ERASURES = frozenset({"note_forgotten", "user_forgotten", "session_forgotten"})

event_decoder = msgspec.json.Decoder(AnyEvent)


class ContentState(enum.StrEnum):
    """What a delivery's content fields (content, subject, summary, narrative, trigger, action,
    speaker, key, value, item) hold."""

    OPEN = "open"
    """The plaintext: the subscription has the key and the note still had its data key."""
    WITHHELD = "withheld"
    """Nothing: the subscription was opened without a key (metadata only)."""
    ERASED = "erased"
    """Nothing: the note (for a recall, it or a note it names) was forgotten before this entry was
    read; its key, and so its content, is gone."""
    NONE = "none"
    """The event carries no content (a supersede, a forget, a receipt...)."""


@dataclass(frozen=True, slots=True)
class Erasure:
    """What a subscriber holding copies must erase, and ack only once it has."""

    scope: Literal["note", "user", "session"]
    user_id: str
    # The notes and messages forgotten: their every copy goes (for a user or a session, each also
    # had its own ``note_forgotten`` earlier in the log).
    note_ids: tuple[str, ...]
    session_id: str | None = None

    def __str__(self) -> str:
        derived = "and everything derived from it (embeddings, summaries, index entries, caches)"
        if self.scope == "note":
            return f"erase every copy of note {self.note_ids[0]} of user {self.user_id}, {derived}"
        if self.scope == "session":
            return (
                f"erase conversation {self.session_id} of user {self.user_id}: its {len(self.note_ids)} "
                f"message(s) {', '.join(self.note_ids)}, {derived}"
            )
        return (
            f"erase everything held about user {self.user_id}: every note and message "
            f"({len(self.note_ids)} listed), {derived}"
        )


def erasure_of(event: AnyEvent) -> Erasure | None:
    """The erasure an event asks of downstream copies, if it asks one."""
    if isinstance(event, NoteForgotten):
        return Erasure("note", event.user_id, (event.note_id,))
    if isinstance(event, UserForgotten):
        return Erasure("user", event.user_id, tuple(event.erased))
    if isinstance(event, SessionForgotten):
        return Erasure("session", event.user_id, tuple(event.erased), event.session_id)
    return None


def event_kinds(kinds: Iterable[str | type[Event]] | None) -> frozenset[str] | None:
    """Event type tags (``note_saved``) or Structs (``NoteSaved``) as the set of tags; None: all."""
    if kinds is None:
        return None
    tags: set[str] = set()
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        tag = kind if isinstance(kind, str) else getattr(getattr(kind, "__struct_config__", None), "tag", None)
        if tag not in EVENT_TYPES:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER,
                f"kinds: {kind!r} is not an event type; use any of {', '.join(sorted(EVENT_TYPES))}",
            )
        tags.add(tag)
    if not tags:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "kinds: give at least one event type, or None for all")
    return frozenset(tags)


def checked_users(users: Iterable[str] | None) -> frozenset[str] | None:
    if users is None:
        return None
    chosen = [users] if isinstance(users, str) else list(users)
    if not chosen:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "users: give at least one user id, or None for all")
    for user in chosen:
        check_id("users", user, UserId)
    return frozenset(chosen)


def check_id(what: str, value: object, shape: Any) -> None:
    try:
        msgspec.convert(value, shape)
    except msgspec.ValidationError:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"{what}: {value!r} is not a valid name (1-128 characters of A-Za-z0-9 and ._:@+/=|-)",
        ) from None


class UnopenableEvent(EngramError):
    """An event whose sealed content does not open under the keys it names (altered in the log):
    a subscription passes it over, says so once, and goes on."""

    def __init__(self, event: AnyEvent) -> None:
        super().__init__(
            ErrorCode.STORAGE_ERROR,
            f"event {event.event_id} of {event.user_id}/{event.note_id} does not open under the data key(s) it "
            "was sealed with: its sealed content was altered",
        )


def data_keys_needed(event: AnyEvent) -> list[str]:
    """The notes (of the event's user) whose data keys open the event's content: its own note's;
    for a recall, also every note its query's key is drawn from."""
    if not needs_key(event):
        return []
    if isinstance(event, MemoryRecalled):
        return [event.note_id, *recall_key_notes(event)] if is_sealed(event) else []
    return [event.note_id]


def reveal(
    event: AnyEvent, key: MasterKey | None, wrapped: bytes | None, drawn_from: Mapping[str, bytes | None] | None = None
) -> tuple[AnyEvent, ContentState]:
    """The event as a subscriber may see it: content opened with the note's data key (``wrapped``,
    as read from Redis just before) when the subscription has the master key and the key still
    exists; else its content fields emptied. A recall's query opens with the key drawn from its
    own and those of the notes it names (``drawn_from``: their wrapped keys, by note id), and
    only while every one of them exists. Raises ``UnopenableEvent`` for content that does not
    open under keys that do exist."""
    if not needs_key(event) or (isinstance(event, MemoryRecalled) and not event.query):
        return event, ContentState.NONE
    if key is None:
        return shredded(event), ContentState.WITHHELD
    if wrapped is None:
        return shredded(event), ContentState.ERASED
    try:
        if isinstance(event, MemoryRecalled) and is_sealed(event):
            named = [(n, (drawn_from or {}).get(n)) for n in recall_key_notes(event)]
            if any(w is None for _, w in named):
                return shredded(event), ContentState.ERASED  # a note it names was forgotten
            own = key.unwrap(wrapped, f"{event.user_id}/{event.note_id}")
            others = [key.unwrap(w, f"{event.user_id}/{n}") for n, w in named if w is not None]
            cipher = NoteCipher(recall_key(own, others))
        else:
            cipher = NoteCipher(key.unwrap(wrapped, f"{event.user_id}/{event.note_id}"))
        return cipher.open_event(event), ContentState.OPEN
    except MasterKeyError as e:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"the key given cannot open this store's data keys ({e}); give the master key the service uses",
        ) from None
    except (InvalidTag, ValueError):
        raise UnopenableEvent(event) from None


class Delivery:
    """One log entry for a subscriber: where it is, the typed event, and the ack."""

    __slots__ = ("_acked", "_subscription", "content", "event", "partition", "position", "redelivered")

    def __init__(
        self,
        subscription: Subscription,
        partition: int,
        position: str,
        event: AnyEvent,
        content: ContentState,
        redelivered: bool,
    ) -> None:
        self._subscription = subscription
        self._acked = False
        self.partition = partition
        self.position = position
        self.event = event
        self.content = content
        # Read before by this group (a restart, a claim from a dead consumer, a delivery left
        # unacknowledged): processing must be idempotent (the event's note id and version say
        # whether a copy has it already).
        self.redelivered = redelivered

    @property
    def log(self) -> str:
        return channels.event_log(self.partition)

    @property
    def token(self) -> str:
        """The entry's consistency token: a query given it reads at least this far."""
        return channels.format_token(self.partition, self.position)

    @property
    def erasure(self) -> Erasure | None:
        """For ``note_forgotten``, ``user_forgotten`` and ``session_forgotten``: what must go."""
        return erasure_of(self.event)

    @property
    def acked(self) -> bool:
        return self._acked

    async def ack(self) -> None:
        """Done with it: the group will not deliver it again. Ack after processing (after erasing,
        for an erasure): what is not acked comes back after a crash."""
        if not self._acked:
            await self._subscription.ack(self)

    def __repr__(self) -> str:
        return f"<Delivery {self.token} {self.event.__struct_config__.tag} {self.event.user_id}/{self.event.note_id}>"
