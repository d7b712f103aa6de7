"""The decider: (states of the notes a command touches, command, now) -> what to append.

It raises ``EngramError`` for every refusal. It never generates randomness or reads a clock:
new note ids come from ``note_ids_for`` and time is the ``now`` argument.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import msgspec

from engram_ledger.contracts.commands import (
    AnyCommand,
    ExpireForget,
    ExpireNote,
    MessageDraft,
    NoteDraft,
    PutNote,
    RecordMessage,
    RecordMessages,
    RenewNote,
    RequestForget,
    RetractMessage,
    RevertNote,
    SaveNote,
    SaveNotes,
    SupersedeNote,
    UpdateNote,
)
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import (
    MessageRecorded,
    MessageRetracted,
    NoteForgotten,
    NoteRenewed,
    NoteReverted,
    NoteSaved,
    NoteSuperseded,
    NoteUpdated,
)
from engram_ledger.contracts.limits import MAX_ITEM_BYTES, MAX_VALUE_BYTES
from engram_ledger.contracts.model import NoteKind, NoteSource, NoteStatus
from engram_ledger.services.domain.appends import (
    StreamAppend,
    check_text,
    check_version,
    content_digest,
    event_header,
    expect_new,
    identity_claim,
    require_active,
)
from engram_ledger.services.domain.forgetting import DEFAULT_FORGET_TTL, expire_forget, request_forget
from engram_ledger.services.domain.ids import new_note_id
from engram_ledger.services.domain.note import NoteState
from engram_ledger.services.domain.values import key_claim, same_value, text_of, value_json


def first_of_each_content(drafts: Sequence[NoteDraft]) -> list[int]:
    """For each draft, the index of the first draft with the same content."""
    seen: dict[str, int] = {}
    return [seen.setdefault(content_digest(d.content), i) for i, d in enumerate(drafts)]


class IdCollision(Exception):
    """A derived new note id is taken by an existing note of the same user: retry with the next
    attempt. Internal; never reaches a caller."""


class Circumstances(msgspec.Struct, frozen=True, kw_only=True):
    """What a decision depends on besides the command and the notes' states."""

    now: datetime
    # Drafts of a batch to leave out: their text is already an existing note.
    skip: frozenset[int] = frozenset()
    # How long a requested deletion waits for its confirmation.
    forget_ttl: timedelta = DEFAULT_FORGET_TTL
    # The user's other notes with a pending deletion, which a RequestForget naming other ids
    # lapses (requirements §1).
    pending_elsewhere: Mapping[str, NoteState] = msgspec.field(default_factory=dict)


class Rule(NamedTuple):
    """How one command type is decided: which notes it needs (``ids(command, attempt)``, stable
    order; ``attempt`` salts derived new ids after an ``IdCollision``) and what it appends given
    their states (``decide(command, states, ids, circumstances)``)."""

    ids: Callable[[Any, int], list[str]]
    decide: Callable[[Any, Mapping[str, NoteState], list[str], Circumstances], list[StreamAppend]]
    # Its ids are new ones derived from the command id (``_creating``): they name no note, save
    # on a retry (whose outcome answers first) or a collision (the append's version check).
    creates: bool = False


def _creating(count: Callable[[Any], int], decide: Callable[..., list[StreamAppend]]) -> Rule:
    """The rule of a command that creates ``count(command)`` notes, under ids derived from its
    command id (a retry derives the same)."""

    def ids(command: Any, attempt: int) -> list[str]:
        return [new_note_id(command.user_id, command.command_id, i, attempt) for i in range(count(command))]

    return Rule(ids=ids, decide=decide, creates=True)


def _decide_save(c: SaveNote, states: Mapping[str, NoteState], ids: list[str], w: Circumstances) -> list[StreamAppend]:
    expect_new(c.expected_version)
    return [_save(c, c.draft(), ids[0], states[ids[0]], w.now)]


def _decide_save_many(
    c: SaveNotes, states: Mapping[str, NoteState], ids: list[str], w: Circumstances
) -> list[StreamAppend]:
    expect_new(c.expected_version)
    # The same text twice in one batch is one note: the first draft's.
    firsts = first_of_each_content(c.notes)
    return [
        _save(c, draft, note_id, states[note_id], w.now)
        for i, (draft, note_id) in enumerate(zip(c.notes, ids, strict=True))
        if firsts[i] == i and i not in w.skip
    ]


def _decide_record(
    c: RecordMessage, states: Mapping[str, NoteState], ids: list[str], w: Circumstances
) -> list[StreamAppend]:
    expect_new(c.expected_version)
    return [_record(c, c.session_id, c, ids[0], states[ids[0]], w.now)]


def _decide_record_many(
    c: RecordMessages, states: Mapping[str, NoteState], ids: list[str], w: Circumstances
) -> list[StreamAppend]:
    expect_new(c.expected_version)
    return [
        _record(c, c.session_id, turn, message_id, states[message_id], w.now)
        for turn, message_id in zip(c.messages, ids, strict=True)
    ]


# One row per command the decider handles: what it needs and what it decides, kept together so
# the two cannot drift apart. Erasing a user or a session needs every note of the user, so those
# are decided by ``forgetting.decide_forget_user`` / ``decide_forget_session`` on what the caller loaded.
RULES: dict[type[AnyCommand], Rule] = {
    SaveNote: _creating(lambda c: 1, _decide_save),
    SaveNotes: _creating(lambda c: len(c.notes), _decide_save_many),
    UpdateNote: Rule(ids=lambda c, _: [c.note_id], decide=lambda c, s, ids, w: _update(c, s[c.note_id], w.now)),
    SupersedeNote: Rule(
        ids=lambda c, _: [c.note_id, c.superseded_by],
        decide=lambda c, s, ids, w: _supersede(c, s[c.note_id], s[c.superseded_by], w.now),
    ),
    RecordMessage: _creating(lambda c: 1, _decide_record),
    RecordMessages: _creating(lambda c: len(c.messages), _decide_record_many),
    RetractMessage: Rule(
        ids=lambda c, _: [c.message_id], decide=lambda c, s, ids, w: _retract(c, s[c.message_id], w.now)
    ),
    RevertNote: Rule(ids=lambda c, _: [c.note_id], decide=lambda c, s, ids, w: _revert(c, s[c.note_id], w.now)),
    RenewNote: Rule(ids=lambda c, _: [c.note_id], decide=lambda c, s, ids, w: _renew(c, s[c.note_id], w.now)),
    ExpireNote: Rule(ids=lambda c, _: [c.note_id], decide=lambda c, s, ids, w: _expire(c, s[c.note_id], w.now)),
    RequestForget: Rule(
        ids=lambda c, _: list(dict.fromkeys(c.note_ids)),
        decide=lambda c, s, ids, w: request_forget(c, ids, s, w.now, w.forget_ttl, w.pending_elsewhere),
    ),
    ExpireForget: Rule(ids=lambda c, _: [c.note_id], decide=lambda c, s, ids, w: expire_forget(c, s[c.note_id], w.now)),
}


def _rule(command: AnyCommand) -> Rule:
    try:
        return RULES[type(command)]
    except KeyError:
        raise TypeError(f"the decider has no rule for {type(command).__name__}") from None


def note_ids_for(command: AnyCommand, attempt: int = 0) -> list[str]:
    """The notes whose state ``decide`` needs, in a stable order."""
    return _rule(command).ids(command, attempt)


def creates_notes(command: AnyCommand) -> bool:
    """Whether the notes ``note_ids_for`` names are ones the command creates (see ``Rule.creates``)."""
    return _rule(command).creates


def decide(
    command: AnyCommand,
    states: Mapping[str, NoteState],
    ids: list[str],
    now: datetime,
    skip: frozenset[int] = frozenset(),
    forget_ttl: timedelta = DEFAULT_FORGET_TTL,
    pending_elsewhere: Mapping[str, NoteState] | None = None,
) -> list[StreamAppend]:
    """``ids`` is what ``note_ids_for`` returned and ``states`` their current states; the rest
    are the ``Circumstances``."""
    circumstances = Circumstances(now=now, skip=skip, forget_ttl=forget_ttl, pending_elsewhere=pending_elsewhere or {})
    return _rule(command).decide(command, states, ids, circumstances)


def _save(
    command: SaveNote | SaveNotes, draft: NoteDraft, note_id: str, state: NoteState, now: datetime
) -> StreamAppend:
    if state.exists:
        raise IdCollision(note_id)
    check_text("content", draft.content)
    for field in ("subject", "summary", "narrative", "trigger", "action"):
        check_text(field, getattr(draft, field))
    if draft.kind is NoteKind.PROCEDURE and not (draft.trigger and draft.action):
        raise EngramError(ErrorCode.INVALID_PARAMETER, "a procedure needs both 'trigger' and 'action'")
    # occurred_at fits any note (when a fact was observed, e.g. the session it came from).
    if draft.kind is not NoteKind.EPISODE and (draft.narrative or draft.summary):
        raise EngramError(ErrorCode.INVALID_PARAMETER, "'summary' and 'narrative' belong to episodes (kind='episode')")
    if draft.kind is not NoteKind.EPISODE and draft.links:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "'links' belong to episodes (kind='episode')")
    if draft.kind is not NoteKind.PROCEDURE and (draft.trigger or draft.action):
        raise EngramError(ErrorCode.INVALID_PARAMETER, "'trigger' and 'action' belong to procedures (kind='procedure')")
    check_validity(draft.valid_from, draft.valid_until)
    event = NoteSaved(
        **event_header(command, note_id, 1, now),
        kind=draft.kind,
        content=draft.content,
        category=draft.category,
        subject=draft.subject,
        confidence=draft.confidence,
        source=draft.source,
        importance=draft.importance,
        summary=draft.summary,
        narrative=draft.narrative,
        occurred_at=draft.occurred_at,
        trigger=draft.trigger,
        action=draft.action,
        links=list(draft.links),
        valid_from=draft.valid_from,
        valid_until=draft.valid_until,
    )
    return StreamAppend(note_id=note_id, expected_version=0, events=[event], claims=[content_digest(draft.content)])


def _record(
    command: AnyCommand,
    session_id: str,
    turn: RecordMessage | MessageDraft,
    message_id: str,
    state: NoteState,
    now: datetime,
) -> StreamAppend:
    if state.exists:
        raise IdCollision(message_id)
    check_text("content", turn.content)
    check_text("speaker", turn.speaker)
    item = value_json(turn.item) if turn.item is not None else None
    if item is not None and len(item.encode()) > MAX_ITEM_BYTES:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER, f"item is {len(item.encode())} bytes as JSON; the limit is {MAX_ITEM_BYTES}"
        )
    event = MessageRecorded(
        **event_header(command, message_id, 1, now),
        session_id=session_id,
        role=turn.role,
        content=turn.content,
        speaker=turn.speaker,
        sent_at=turn.sent_at,
        item=item,
    )
    return StreamAppend(note_id=message_id, expected_version=0, events=[event])


def _retract(command: RetractMessage, state: NoteState, now: datetime) -> list[StreamAppend]:
    if not state.exists or not state.is_message or state.forgotten or state.retracted:
        raise EngramError(ErrorCode.MEMORY_NOT_FOUND, f"Message with ID {command.message_id} not found")
    check_version(command.message_id, command.expected_version, state)
    event = MessageRetracted(
        **event_header(command, command.message_id, state.version + 1, now), session_id=state.session_id or ""
    )
    return [StreamAppend(note_id=command.message_id, expected_version=state.version, events=[event])]


def _renew(command: RenewNote, state: NoteState, now: datetime) -> list[StreamAppend]:
    require_active(command.note_id, state)
    if expired(state, now):  # already read as gone: a renewal must not bring it back
        raise EngramError(ErrorCode.MEMORY_NOT_FOUND, f"Memory with ID {command.note_id} has expired")
    if state.ttl_seconds is None:  # it never expires: nothing to renew
        return [StreamAppend(note_id=command.note_id, expected_version=state.version, events=[])]
    event = NoteRenewed(
        **event_header(command, command.note_id, state.version + 1, now),
        expires_at=now + timedelta(seconds=state.ttl_seconds),
    )
    return [StreamAppend(note_id=command.note_id, expected_version=state.version, events=[event])]


def expired(state: NoteState, now: datetime) -> bool:
    """Whether a note's time to live has run out (it is forgotten soon, and read as gone now)."""
    return state.expires_at is not None and state.expires_at <= now and state.exists and not state.forgotten


def expiry_command_id(note_id: str, state: NoteState) -> str:
    """The id of the ``ExpireNote`` for a note's current expiry: whoever sends it (the saga's
    timer, a put that finds the note expired) sends the same command, applied once."""
    assert state.expires_at is not None
    return f"expire-note-{note_id}-{int(state.expires_at.timestamp() * 1000)}"


def _expire(command: ExpireNote, state: NoteState, now: datetime) -> list[StreamAppend]:
    """The note's time to live ran out: forgotten as a confirmed forget is, its key destroyed
    and its key or content given back; renewed or put again meanwhile, nothing happens."""
    if not expired(state, now) or state.is_message:
        return [StreamAppend(note_id=command.note_id, expected_version=state.version, events=[])]
    header = event_header(command, command.note_id, state.version + 1, now)
    return [
        StreamAppend(
            note_id=command.note_id,
            expected_version=state.version,
            events=[NoteForgotten(request_count=0, reason="expired", **header)],
            releases=[identity_claim(state)],
            shred=True,
        )
    ]


def decide_put(command: PutNote, note_id: str, state: NoteState, now: datetime) -> list[StreamAppend]:
    """A put by key: ``note_id`` is the active note holding the key (``state``), or the id for a
    new one (``state`` absent). A new note claims the key; the same value again appends nothing."""
    value = value_json(command.value)
    if len(value.encode()) > MAX_VALUE_BYTES:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER, f"value is {len(value.encode())} bytes as JSON; the limit is {MAX_VALUE_BYTES}"
        )
    text = text_of(command.value, command.index)
    # Each put with a time to live starts it again; one without clears it.
    expires_at = now + timedelta(seconds=command.ttl_seconds) if command.ttl_seconds is not None else None
    check_text("key", command.key)
    check_text("content", text)
    check_validity(command.valid_from or state.valid_from, command.valid_until or state.valid_until)
    if not state.exists:
        if command.expected_version not in (None, 0):
            raise EngramError(
                ErrorCode.VERSION_CONFLICT,
                f"no memory holds key {command.key!r} in {command.category}, not version {command.expected_version}",
            )
        event = NoteSaved(
            **event_header(command, note_id, 1, now),
            kind=NoteKind.FACT,
            content=text,
            category=command.category,
            subject=None,
            confidence=1.0,
            source=NoteSource.EXPLICIT,
            importance=0.5,
            key=command.key,
            value=value,
            expires_at=expires_at,
            ttl_seconds=command.ttl_seconds,
            valid_from=command.valid_from,
            valid_until=command.valid_until,
        )
        return [StreamAppend(note_id=note_id, expected_version=0, events=[event], claims=[identity_claim_of(event)])]
    if state.key != command.key or state.category != command.category or state.status is not NoteStatus.ACTIVE:
        raise AssertionError(f"{note_id} does not hold key {command.key!r} in {command.category}")
    check_version(note_id, command.expected_version, state)
    cleared = expires_at is None and state.expires_at is not None
    unchanged = same_value(state.value, command.value)
    valid_from = command.valid_from if command.valid_from not in (None, state.valid_from) else None
    valid_until = command.valid_until if command.valid_until not in (None, state.valid_until) else None
    same_validity = valid_from is None and valid_until is None
    if text == state.content and unchanged and expires_at is None and not cleared and same_validity:
        return [StreamAppend(note_id=note_id, expected_version=state.version, events=[])]
    event_ = NoteUpdated(
        **event_header(command, note_id, state.version + 1, now),
        content=text if text != state.content else None,
        value=None if unchanged else value,
        expires_at=expires_at,
        ttl_seconds=command.ttl_seconds,
        expiry_cleared=cleared,
        valid_from=valid_from,
        valid_until=valid_until,
    )
    return [StreamAppend(note_id=note_id, expected_version=state.version, events=[event_])]


def identity_claim_of(event: NoteSaved) -> str:
    return key_claim(event.category, event.key) if event.key is not None else content_digest(event.content)


def _update(command: UpdateNote, state: NoteState, now: datetime) -> list[StreamAppend]:
    require_active(command.note_id, state)
    check_version(command.note_id, command.expected_version, state)
    check_text("content", command.content)
    check_text("subject", command.subject)
    if state.key is not None and command.category is not None and command.category != state.category:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"Memory {command.note_id} is kept under key {state.key!r} in {state.category}; its category is part of "
            "that key and cannot change (put the value under the other category instead)",
        )
    fields = ("content", "category", "subject", "confidence", "importance", "valid_from", "valid_until")
    changes = {
        field: value
        for field in fields
        if (value := getattr(command, field)) is not None and value != getattr(state, field)
    }
    check_validity(changes.get("valid_from", state.valid_from), changes.get("valid_until", state.valid_until))
    if not changes:
        given = [f for f in fields if getattr(command, f) is not None]
        if not given:
            raise EngramError(
                ErrorCode.INVALID_PARAMETER,
                "an update needs at least one of content, category, subject, confidence, importance, "
                "valid_from, valid_until",
            )
        # Same values again: nothing happens, and the reply names the current version.
        return [StreamAppend(note_id=command.note_id, expected_version=state.version, events=[])]
    version = state.version + 1
    event = NoteUpdated(**event_header(command, command.note_id, version, now), **changes)
    content_moves: dict[str, Any] = {}
    if "content" in changes and state.key is None:  # a keyed note is held by its key, not its text
        content_moves = {"claims": [content_digest(changes["content"])], "releases": [content_digest(state.content)]}
    return [StreamAppend(note_id=command.note_id, expected_version=state.version, events=[event], **content_moves)]


def _supersede(command: SupersedeNote, old: NoteState, new: NoteState, now: datetime) -> list[StreamAppend]:
    if command.note_id == command.superseded_by:
        raise EngramError(ErrorCode.INVALID_PARAMETER, "a memory cannot supersede itself")
    require_active(command.note_id, old)
    require_active(command.superseded_by, new)
    check_version(command.note_id, command.expected_version, old)
    version = old.version + 1
    # What the old note says stops holding where the new one begins, unless it ended earlier.
    begins = new.valid_from or new.saved_at
    closes = (
        command.close_validity
        and begins is not None
        and (old.valid_until is None or old.valid_until > begins)
        and (old.valid_from is None or old.valid_from < begins)
    )
    event = NoteSuperseded(
        **event_header(command, command.note_id, version, now),
        superseded_by=command.superseded_by,
        valid_until=begins if closes else None,
    )
    return [
        StreamAppend(
            note_id=command.note_id,
            expected_version=old.version,
            events=[event],
            releases=[identity_claim(old)],
        ),
        # The replacement must still be active when the supersede commits.
        StreamAppend(note_id=command.superseded_by, expected_version=new.version, events=[]),
    ]


def _revert(command: RevertNote, state: NoteState, now: datetime) -> list[StreamAppend]:
    """A new version with the content and fields of ``to_version``; a superseded note comes
    back to the active set, holding its content (or key) again."""
    if state.forgotten and not state.is_message:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"Memory {command.note_id} was forgotten: its content went with its key, so no version of it can come back",
        )
    if not state.exists or state.is_message or state.is_recall or state.forgotten:
        raise EngramError(ErrorCode.MEMORY_NOT_FOUND, f"Memory with ID {command.note_id} not found")
    check_version(command.note_id, command.expected_version, state)
    target = state.at_version(command.to_version)
    if target is None:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"Memory {command.note_id} has versions 1 to {state.version}: version {command.to_version} is not one",
        )
    if command.to_version == state.version:
        # It holds what its current version holds: nothing happens.
        return [StreamAppend(note_id=command.note_id, expected_version=state.version, events=[])]
    if target.status is NoteStatus.SUPERSEDED:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"Memory {command.note_id} was superseded at version {command.to_version}: revert to a version "
            "before it to bring it back, or supersede it again",
        )
    reactivated = state.status is NoteStatus.SUPERSEDED
    fields = ("content", "category", "subject", "confidence", "importance", "value", "valid_from", "valid_until")
    if not reactivated and all(getattr(target, f) == getattr(state, f) for f in fields):
        # It already holds what that version held: nothing happens.
        return [StreamAppend(note_id=command.note_id, expected_version=state.version, events=[])]
    if state.key is not None and target.category != state.category:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"Memory {command.note_id} is kept under key {state.key!r} in {state.category}; version "
            f"{command.to_version} was in {target.category}, and a key's category cannot change",
        )
    event = NoteReverted(
        **event_header(command, command.note_id, state.version + 1, now),
        to_version=command.to_version,
        content=target.content,
        category=target.category,
        subject=target.subject,
        confidence=target.confidence,
        importance=target.importance,
        value=target.value if state.key is not None else None,
        reactivated=reactivated,
        replaced_by=state.superseded_by if reactivated else None,
        valid_from=target.valid_from,
        valid_until=target.valid_until,
    )
    reverted = msgspec.structs.replace(state, content=target.content, category=target.category)
    claims: dict[str, Any] = {}
    if reactivated:
        # The supersede gave back what it held; active again, it holds it once more.
        claims = {"claims": [identity_claim(reverted)]}
    elif state.key is None and target.content != state.content:
        claims = {"claims": [content_digest(target.content)], "releases": [content_digest(state.content)]}
    return [StreamAppend(note_id=command.note_id, expected_version=state.version, events=[event], **claims)]


def check_validity(valid_from: datetime | None, valid_until: datetime | None) -> None:
    """A time something held in the world ends after it begins."""
    if valid_from is not None and valid_until is not None and valid_until <= valid_from:
        raise EngramError(
            ErrorCode.INVALID_PARAMETER,
            f"valid_until ({valid_until.isoformat()}) must be after valid_from ({valid_from.isoformat()})",
        )
