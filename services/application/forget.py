"""Forgetting (requirements §1): the two-call ``RequestForget``, and the scrubbing that makes a forget
physical beyond the crypto-shredding.

A query finds candidates and deletes nothing. Ids go through the pure decider: the first request
makes a note pending (``ForgetRequested``, with its deadline), the same id again while pending
forgets it (``NoteForgotten``, which destroys its data key in the same atomic append), and a
request after the deadline starts over. The forget saga (``projections/forget_saga.py``) expires
what nobody confirmed.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

import msgspec

from engram_ledger.contracts import channels
from engram_ledger.contracts.commands import ExpireNote, RequestForget, RequestForgetSession, RequestForgetUser
from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.events import (
    ACCOUNT,
    ForgetExpired,
    ForgetRequested,
    NoteForgotten,
    SessionForgotten,
    UserForgotten,
    is_control_stream,
    session_stream,
)
from engram_ledger.contracts.limits import MAX_ID_CHARS
from engram_ledger.contracts.queries import ForgetCandidate, ForgetReply, NoteWritten, PendingForget, SearchNotes
from engram_ledger.services.application import unit_of_work
from engram_ledger.services.application.decoding import count
from engram_ledger.services.application.ports import (
    AccessStats,
    ErasureStep,
    EventStore,
    NoteForgetStep,
    NoteHistory,
    Outcome,
    OutcomeDetail,
    PendingDeletions,
    Scrub,
)
from engram_ledger.services.application.search import SearchService
from engram_ledger.services.application.unit_of_work import Decision, Work
from engram_ledger.services.domain.appends import StreamAppend
from engram_ledger.services.domain.decider import decide, note_ids_for
from engram_ledger.services.domain.forgetting import (
    decide_forget_session,
    decide_forget_user,
    erasable,
    erase_late,
    forgettable,
    session_messages,
)

log = logging.getLogger("engram.forget")

PREVIEW_CHARS = 120
SCRUB_WAIT_SECONDS = 5.0
# Forget by query lists a note only if it is close to the query: its cosine reaches the floor,
# and is within the margin of the best candidate's (a faint match beside a strong one is noise).
# Measured on the dev set (bench/bench_forget_floor.py, README "Forget by query"): every true
# match is kept (the lowest at 0.211, at most 0.114 below its query's best), and 64% of the other
# hits are dropped. The cosine, not the fused score: the score is scaled over each query's own
# candidates, so it cannot tell a query about nothing from one about something.
FORGET_SIMILARITY_FLOOR = 0.2
FORGET_SIMILARITY_MARGIN = 0.15


def close_enough(similarities: list[float]) -> list[bool]:
    """Which of a forget query's hits (their cosines) are candidates. A cosine of exactly 0 is a
    note the keywords found beyond the nearest by meaning (a user with many notes, a rare word
    such as an order number): its cosine is unknown, and the words it shares make it one."""
    best = max(similarities, default=0.0)
    return [c == 0.0 or (c >= FORGET_SIMILARITY_FLOOR and c >= best - FORGET_SIMILARITY_MARGIN) for c in similarities]


def preview(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


class ForgetService:
    def __init__(
        self,
        store: EventStore,
        history: NoteHistory,
        pending: PendingDeletions,
        search: SearchService | None,
        scrub: Scrub,
        clock: Callable[[], datetime],
        ttl: timedelta,
        confirmation: bool = True,
        access: AccessStats | None = None,
    ) -> None:
        self._access = access
        self._store = store
        self._history = history
        self._pending = pending
        self._search = search
        self._scrub = scrub
        self._clock = clock
        self._ttl = ttl
        self._scrubbing: set[asyncio.Task[None]] = set()
        self._confirmation = confirmation

    async def request(self, command: RequestForget) -> ForgetReply:
        if not self._confirmation and not command.confirmed:
            # ENGRAM_FORGET_CONFIRMATION=off: this deployment asked for one-call deletion.
            command = msgspec.structs.replace(command, confirmed=True)
        if command.query is not None and command.note_ids:
            raise EngramError(ErrorCode.INVALID_PARAMETER, "give either a query or note_ids, not both")
        if command.query is not None:
            return await self._candidates(command)
        if not command.note_ids:
            raise EngramError(ErrorCode.INVALID_PARAMETER, "give a query to find memories, or note_ids to forget")
        return await unit_of_work.run(self._store, command, _ForgetNotes(self, command))

    async def expire(self, command: ExpireNote) -> NoteWritten:
        """Forget a note whose time to live has run out (nothing if it was renewed meanwhile)."""
        return await unit_of_work.run(self._store, command, _Expire(self, command))

    async def request_user(self, command: RequestForgetUser) -> ForgetReply:
        """Erase a whole user: pending on the account stream first, then every note at once.
        (Always two calls, whatever ENGRAM_FORGET_CONFIRMATION says.)"""
        user = command.user_id
        what = lambda n: f"ALL {count(n, 'memory', 'memories')} (notes and conversation messages) of {user}"  # noqa: E731
        erase = _Erase(self, command, ACCOUNT, what)
        return await unit_of_work.run(self._store, command, erase)

    async def request_session(self, command: RequestForgetSession) -> ForgetReply:
        """Erase one conversation: pending on the session's stream first, then every message of
        the session at once, with a receipt. (Always two calls, as for a user.)"""
        user, session = command.user_id, command.session_id
        control = session_stream(session)
        erase = _Erase(
            self, command, control, lambda n: f"all {count(n, 'message')} of conversation {session} of {user}"
        )
        return await unit_of_work.run(self._store, command, erase)

    async def _scrub_after(self, token: str, user_id: str, forgotten: Sequence[str]) -> None:
        # What the forgotten notes' commands asked is fingerprinted with their outcomes: the
        # fingerprints go with them (their outcomes stay, to answer a late retry).
        await self._store.drop_fingerprints(user_id, forgotten)
        await self._scrub.owe()
        task = asyncio.create_task(self._scrub_later(token))
        self._scrubbing.add(task)
        task.add_done_callback(self._scrubbing.discard)

    async def _scrub_later(self, token: str) -> None:
        """After the reply: the read model holds the plaintext until it applies the tombstone,
        and this very request stays pending (sharing a stream node with the handled ones) until
        it is acknowledged; a trim or a rewrite before either would keep old bytes."""
        if not await self._history.wait_for(token, SCRUB_WAIT_SECONDS):
            log.warning("the history had not applied %s after %s s; scrubbing anyway", token, SCRUB_WAIT_SECONDS)
        await self._scrub.wait_until_acknowledged(SCRUB_WAIT_SECONDS)
        await self._scrub.scrub()

    async def _candidates(self, command: RequestForget) -> ForgetReply:
        if self._search is None:
            raise EngramError(ErrorCode.UNAVAILABLE, "search is off (ENGRAM_INDEX=off): forget by id")
        assert command.query is not None
        found = await self._search.search(
            SearchNotes(
                user_id=command.user_id,
                query=command.query,
                top_k=command.top_k,
                after=command.after,
                min_relevance=0.0,  # forget by query has its own floor (below)
            ),
            # Finding what to forget is not an agent's recall: never recorded.
            record=False,
        )
        keep = close_enough([h.similarity for h in found.results])
        candidates = [
            ForgetCandidate(note_id=h.note_id, preview=preview(h.content), similarity=h.similarity)
            for h, kept in zip(found.results, keep, strict=True)
            if kept
        ]
        if not candidates:
            message = f"No memory matched {command.query!r}; nothing was deleted."
        else:
            message = (
                f"Found {count(len(candidates), 'memory', 'memories')}; nothing was deleted. Ask the user which "
                "to delete, then forget it by its id (twice: the first request only asks for confirmation)."
            )
        return ForgetReply(status="candidates", message=message, candidates=candidates)

    async def _not_found_message(self, user_id: str, missing: list[str]) -> str:
        """Requirements §1: an unknown id is 'Memory not found' with suggestions (ids close in spelling,
        else the most recent notes), so the caller can correct a mistyped or made-up id."""
        notes = await self._history.list_notes(user_id, None, True)
        by_id = {n.id: n for n in notes}
        close: list[str] = []
        for note_id in missing:
            close += [i for i in difflib.get_close_matches(note_id, list(by_id), n=3, cutoff=0.5) if i not in close]
        if not close:
            close = [n.id for n in sorted(notes, key=lambda n: n.created_at, reverse=True)[:3]]
        message = f"Memory with ID {', '.join(missing)} not found"
        if close:
            hints = "; ".join(f"{i}: {preview(by_id[i].content)!r}" for i in close)
            message += f". Did you mean: {hints}? Or forget with a query to find the right id."
        return message


class _Expire(Work[NoteWritten]):
    """A note whose time to live ran out (``ExpireNote``, from the saga's timer or a put that
    found its key's note expired): forgotten and scrubbed as a confirmed forget is."""

    def __init__(self, service: ForgetService, command: ExpireNote) -> None:
        self._service = service
        self._command = command
        self._partition = service._store.partition_of(command.user_id)

    async def decide(self) -> Decision | NoteWritten:
        command = self._command
        loaded = (await self._service._store.load(command.user_id, [command.note_id]))[command.note_id]
        appends = decide(command, {command.note_id: loaded.state}, [command.note_id], self._service._clock())
        if appends[0].events:
            return Decision(appends=appends)
        # Renewed, put again or gone meanwhile: nothing to do.
        token = channels.format_token(self._partition, loaded.position or "0-0")
        return NoteWritten(note_id=command.note_id, version=loaded.state.version, token=token)

    async def accepted(self, outcome: Outcome, decision: Decision) -> NoteWritten:
        return await self._forgotten(outcome, replayed=False)

    async def replay(self, first: Outcome) -> NoteWritten:
        return await self._forgotten(first, replayed=True)  # the first may have died before its scrub

    async def _forgotten(self, outcome: Outcome, replayed: bool) -> NoteWritten:
        token = channels.format_token(self._partition, outcome.position)
        if self._service._access is not None:
            await self._service._access.forget(self._command.user_id, [self._command.note_id])
        await self._service._scrub_after(token, self._command.user_id, [self._command.note_id])
        note_id, version = outcome.notes[0]
        return NoteWritten(note_id=note_id, version=version, token=token, replayed=replayed)


class _ForgetNotes(Work[ForgetReply]):
    """A ``RequestForget`` by ids: each note asked about, forgotten, or lapsed and asked again."""

    replay_first = True  # a refusal lists the user's notes (the "did you mean"): a retry skips it

    def __init__(self, service: ForgetService, command: RequestForget) -> None:
        self._service = service
        self._command = command
        self._ids = note_ids_for(command)
        self._partition = service._store.partition_of(command.user_id)
        self._contents: dict[str, str] = {}

    async def decide(self) -> Decision:
        service, command, ids = self._service, self._command, self._ids
        # Other pending deletions of notes of this user, as the saga knows them (they lapse). A
        # pending erasure of the user or of a session is not one: it stays pending. Nor is a
        # confirmed forget (an operator's, an adapter's delete) a second call of the user's
        # conversation: it leaves what the user is about to confirm pending.
        pending = [] if command.confirmed else await service._pending.of(command.user_id)
        others = [i for i in pending if i not in ids and not is_control_stream(i)]
        loaded = await service._store.load(command.user_id, [*ids, *others])
        states = {i: loaded[i].state for i in ids}
        missing = [i for i in ids if not forgettable(states[i])]
        if missing:
            raise EngramError(ErrorCode.MEMORY_NOT_FOUND, await service._not_found_message(command.user_id, missing))
        appends = decide(
            command,
            states,
            ids,
            service._clock(),
            forget_ttl=service._ttl,
            pending_elsewhere={i: loaded[i].state for i in others},
        )
        self._contents = {i: states[i].content for i in ids}
        return Decision(appends=appends, detail=OutcomeDetail(forget=[_step(item) for item in appends]))

    async def accepted(self, outcome: Outcome, decision: Decision) -> ForgetReply:
        token = channels.format_token(self._partition, outcome.position)
        reply = _reply(decision.detail.forget, self._contents, token)
        if reply.forgotten and self._service._access is not None:
            await self._service._access.forget(self._command.user_id, reply.forgotten)
        if reply.forgotten:
            await self._service._scrub_after(token, self._command.user_id, reply.forgotten)
        return reply

    async def replay(self, first: Outcome) -> ForgetReply:
        """The first outcome again. No previews are stored with it (they would outlive a forget):
        a pending note's preview is read from the note as it is now."""
        steps = first.detail.forget
        pending = [step.note_id for step in steps if step.status == "pending"]
        loaded = await self._service._store.load(self._command.user_id, pending) if pending else {}
        contents = {note_id: note.state.content for note_id, note in loaded.items()}
        reply = _reply(steps, contents, channels.format_token(self._partition, first.position))
        if reply.forgotten:
            # The first attempt may have died before its scrub.
            await self._service._scrub_after(reply.token or "", self._command.user_id, reply.forgotten)
        return msgspec.structs.replace(reply, replayed=True)


def _step(append: StreamAppend) -> NoteForgetStep:
    last = append.events[-1]
    if isinstance(last, ForgetExpired):
        return NoteForgetStep(append.note_id, "lapsed", 0, None)
    if isinstance(last, NoteForgotten):
        return NoteForgetStep(append.note_id, "forgotten", last.request_count, None)
    assert isinstance(last, ForgetRequested), last
    return NoteForgetStep(append.note_id, "pending", last.request_count, last.expires_at.isoformat())


class _Erase(Work[ForgetReply]):
    """Erasing a user or a session: pending on a control stream, then everything at once."""

    def __init__(
        self,
        service: ForgetService,
        command: RequestForgetUser | RequestForgetSession,
        control_id: str,
        what: Callable[[int], str],
    ) -> None:
        self._service = service
        self._command = command
        self._control_id = control_id
        self._what = what  # names what is erased, given how many
        self._partition = service._store.partition_of(command.user_id)

    async def decide(self) -> Decision:
        service, command, store = self._service, self._command, self._service._store
        ids = await store.note_ids(command.user_id)
        loaded = await store.load(command.user_id, [self._control_id, *ids])
        notes = {i: loaded[i].state for i in ids}
        control = loaded[self._control_id].state
        if isinstance(command, RequestForgetSession):
            targets = session_messages(command.session_id, notes)
            appends = decide_forget_session(command, control, notes, service._clock(), service._ttl)
        else:
            targets = notes
            appends = decide_forget_user(command, control, notes, service._clock(), service._ttl)
        last = appends[-1].events[-1]
        if isinstance(last, UserForgotten | SessionForgotten):
            step = ErasureStep(status="forgotten", erased=list(last.erased), at=last.at.isoformat())
        else:
            assert isinstance(last, ForgetRequested), last
            step = ErasureStep(
                status="pending",
                count=last.request_count,
                expires=last.expires_at.isoformat(),
                # What it would erase, as the user counts it: notes and messages (recalls aside).
                notes=len([i for i in erasable(targets) if not targets[i].is_recall]),
            )
        return Decision(appends=appends, detail=OutcomeDetail(user=step))

    async def accepted(self, outcome: Outcome, decision: Decision) -> ForgetReply:
        assert decision.detail.user is not None
        return await self._answer(outcome, decision.detail.user, replayed=False)

    async def replay(self, first: Outcome) -> ForgetReply:
        assert first.detail.user is not None, "an erasure's outcome always holds its step"
        return await self._answer(first, first.detail.user, replayed=True)

    async def _answer(self, outcome: Outcome, step: ErasureStep, replayed: bool) -> ForgetReply:
        position = outcome.position
        if step.status == "forgotten":
            # Before the reply: what was written while this erasure decided is erased with it
            # (and the reply's token waits for that too). A replay does it again: the first
            # attempt may have died before it.
            late, at = await _EraseLate(self._service, self._command, outcome.position).run()
            step = msgspec.structs.replace(step, erased=[*step.erased, *late])
            position = at or position
        token = channels.format_token(self._partition, position)
        reply = _erase_reply(self._control_id, self._what, step, token, replayed)
        if reply.status == "forgotten":
            # A replay scrubs again: the first attempt may have died before its scrub.
            if not replayed and self._service._access is not None and self._control_id == ACCOUNT:
                await self._service._access.forget(self._command.user_id)
            await self._service._scrub_after(token, self._command.user_id, [*step.erased, self._control_id])
        return reply


class _EraseLate(Work[tuple[list[str], str | None]]):
    """The notes (or the session's messages) an executed erasure did not see because they were
    written while it decided: those of the user, or of the session, not forgotten and last
    written before the erasure's receipt. A later write is not late: it came after the erasure
    and starts afresh. Run under a command id derived from the erasure's, so that a retry finds
    its outcome."""

    def __init__(self, service: ForgetService, command: RequestForgetUser | RequestForgetSession, at: str) -> None:
        self._service = service
        self._command = msgspec.structs.replace(command, command_id=late_command_id(command.command_id))
        self._at = channels.parse_entry_id(at)

    async def run(self) -> tuple[list[str], str | None]:
        """What it erased, and the log position of its append (None: nothing was late)."""
        return await unit_of_work.run(self._service._store, self._command, self)

    async def decide(self) -> Decision | tuple[list[str], str | None]:
        store, command = self._service._store, self._command
        loaded = await store.load(command.user_id, await store.note_ids(command.user_id))
        states = {i: note.state for i, note in loaded.items()}
        if isinstance(command, RequestForgetSession):
            states = session_messages(command.session_id, states)
        late = {
            i: state
            for i, state in states.items()
            if (at := loaded[i].position) is not None and channels.parse_entry_id(at) < self._at
        }
        appends = erase_late(command, late, self._service._clock())
        return Decision(appends=appends) if appends else ([], None)

    async def accepted(self, outcome: Outcome, decision: Decision) -> tuple[list[str], str | None]:
        erased = [append.note_id for append in decision.appends]
        log.warning("erased %d note(s) written while the erasure %s decided", len(erased), self._command.command_id)
        return erased, outcome.position

    async def replay(self, first: Outcome) -> tuple[list[str], str | None]:
        return [note_id for note_id, _ in first.notes], first.position


def late_command_id(command_id: str) -> str:
    """The command id an erasure's late part runs under (within the id's length limit)."""
    return f"{command_id[: MAX_ID_CHARS - 5]}|late"


def _reply(steps: list[NoteForgetStep], contents: dict[str, str], token: str) -> ForgetReply:
    pending = [
        PendingForget(
            note_id=step.note_id,
            preview=preview(contents.get(step.note_id, "")),
            request_count=step.request_count,
            expires_at=datetime.fromisoformat(step.expires_at or ""),
        )
        for step in steps
        if step.status == "pending"
    ]
    forgotten = [step.note_id for step in steps if step.status == "forgotten"]
    lapsed = [step.note_id for step in steps if step.status == "lapsed"]
    if pending:
        asks = "; ".join(f"Delete {p.preview!r} ({p.note_id})?" for p in pending)
        # Said for every channel (a tool, the HTTP API, the bus): what to send, not which tool to call.
        them = "it" if len(pending) == 1 else "them"
        message = f"Please confirm: {asks} Send the same request again to delete {them}."
        if forgotten:
            message = f"Deleted {', '.join(forgotten)}. " + message
        if lapsed:
            message += f" The earlier request for {', '.join(lapsed)} is withdrawn."
        status = "confirmation_required"
    else:
        message = f"Deleted successfully: {', '.join(forgotten)}. The content cannot be recovered."
        if lapsed:
            message += f" The earlier request for {', '.join(lapsed)} is withdrawn."
        status = "forgotten"
    return ForgetReply(
        status=status,  # type: ignore[arg-type]
        message=message,
        pending=pending,
        forgotten=forgotten,
        withdrawn=lapsed,
        token=token,
    )


def _erase_reply(
    control_id: str, what: Callable[[int], str], step: ErasureStep, token: str, replayed: bool
) -> ForgetReply:
    """The reply to erasing a user or a session: the receipt, or the confirmation to ask for.
    ``what`` names what is erased, given how many."""
    if step.status == "forgotten":
        erased = list(step.erased)
        return ForgetReply(
            status="forgotten",
            message=f"Erased {what(len(erased))}. This cannot be undone.",
            forgotten=erased,
            erased_at=datetime.fromisoformat(step.at or ""),
            token=token,
            replayed=replayed,
        )
    described = what(step.notes)
    pending = PendingForget(
        note_id=control_id,
        preview=described,
        request_count=step.count,
        expires_at=datetime.fromisoformat(step.expires or ""),
    )
    return ForgetReply(
        status="confirmation_required",
        message=(f"Please confirm: erase {described}? Send the same request again to erase them for good."),
        pending=[pending],
        token=token,
        replayed=replayed,
    )
