"""What ``EngramClient`` writes: one method per command, each a typed call that builds the
command (a fresh ``command_id`` unless one is given, so a retry names the same one) and sends
it through ``execute``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

from engram_ledger.contracts import commands
from engram_ledger.contracts.model import NoteKind, NoteSource, Origin
from engram_ledger.contracts.queries import ForgetReply, NotesWritten, NoteWritten

R = TypeVar("R")


def new_command_id() -> str:
    return uuid.uuid4().hex


class Writes:
    """The commands; ``execute`` is the client's (``EngramClient``)."""

    async def execute(self, command: commands.AnyCommand, expect: type[R]) -> R:
        raise NotImplementedError

    async def _send(self, kind: type[commands.AnyCommand], expect: type[R], fields: dict[str, Any]) -> R:
        """``kind`` made of ``fields``, the calling method's parameters (its ``locals()``): each
        parameter is the command's field of that name, and ``command_id`` a fresh one unless the
        caller gave one (a retry names the same)."""
        given = {name: value for name, value in fields.items() if name != "self"}
        given["command_id"] = given.get("command_id") or new_command_id()
        return await self.execute(kind(**given), expect)

    async def save(
        self,
        user_id: str,
        content: str,
        *,
        kind: NoteKind | None = None,
        category: str | None = None,
        subject: str | None = None,
        confidence: float | None = None,
        source: NoteSource | None = None,
        importance: float | None = None,
        command_id: str | None = None,
        origin: Origin | None = None,
        advise: bool = True,
        valid_from: datetime | None = None,
        valid_until: datetime | None = None,
        **episode_or_procedure: Any,
    ) -> NoteWritten:
        """Save a note. A field left at None takes the contract's default (``commands.NoteDraft``).
        ``valid_from``/``valid_until``: when what it says held in the world."""
        given: dict[str, Any] = {
            "kind": kind,
            "category": category,
            "confidence": confidence,
            "source": source,
            "importance": importance,
            "valid_from": valid_from,
            "valid_until": valid_until,
        }
        command = commands.SaveNote(
            advise=advise,
            command_id=command_id or new_command_id(),
            user_id=user_id,
            content=content,
            subject=subject,
            origin=origin,
            **{field: value for field, value in given.items() if value is not None},
            **episode_or_procedure,
        )
        return await self.execute(command, NoteWritten)

    async def save_many(
        self,
        user_id: str,
        notes: list[commands.NoteDraft],
        *,
        command_id: str | None = None,
        origin: Origin | None = None,
    ) -> NotesWritten:
        return await self._send(commands.SaveNotes, NotesWritten, locals())

    async def put(
        self,
        user_id: str,
        category: str,
        key: str,
        value: dict[str, Any],
        *,
        index: list[str] | None = None,
        ttl_seconds: float | None = None,
        expected_version: int | None = None,
        command_id: str | None = None,
        origin: Origin | None = None,
        valid_from: datetime | None = None,
        valid_until: datetime | None = None,
    ) -> NoteWritten:
        """Put ``value`` under ``key`` in ``category``: a new note the first time, an update of
        it after (the same value again changes nothing). ``index``: the fields whose text is
        searched (dotted paths), the whole value by default. ``ttl_seconds``: forget it this
        long after (renewed by ``renew``); None: it never expires."""
        return await self._send(commands.PutNote, NoteWritten, locals())

    async def update(
        self,
        user_id: str,
        note_id: str,
        *,
        content: str | None = None,
        category: str | None = None,
        subject: str | None = None,
        confidence: float | None = None,
        importance: float | None = None,
        expected_version: int | None = None,
        command_id: str | None = None,
        origin: Origin | None = None,
        valid_from: datetime | None = None,
        valid_until: datetime | None = None,
    ) -> NoteWritten:
        return await self._send(commands.UpdateNote, NoteWritten, locals())

    async def supersede(
        self,
        user_id: str,
        note_id: str,
        superseded_by: str,
        *,
        expected_version: int | None = None,
        command_id: str | None = None,
        origin: Origin | None = None,
        close_validity: bool = True,
    ) -> NoteWritten:
        """``close_validity``: what the old note says stops holding where the new one begins."""
        return await self._send(commands.SupersedeNote, NoteWritten, locals())

    async def revert(
        self,
        user_id: str,
        note_id: str,
        to_version: int,
        *,
        expected_version: int | None = None,
        command_id: str | None = None,
        origin: Origin | None = None,
    ) -> NoteWritten:
        """A new version of the note with the content and fields it had at ``to_version``."""
        return await self._send(commands.RevertNote, NoteWritten, locals())

    async def record_message(
        self,
        user_id: str,
        session_id: str,
        content: str,
        *,
        role: str = "user",
        speaker: str | None = None,
        sent_at: datetime | None = None,
        item: dict[str, Any] | None = None,
        command_id: str | None = None,
        origin: Origin | None = None,
    ) -> NoteWritten:
        return await self._send(commands.RecordMessage, NoteWritten, locals())

    async def record_messages(
        self,
        user_id: str,
        session_id: str,
        messages: Sequence[commands.MessageDraft],
        *,
        command_id: str | None = None,
        origin: Origin | None = None,
    ) -> NotesWritten:
        """Import a transcript of up to 100 turns; the reply's ``notes`` are the new message ids
        in the order given."""
        messages = list(messages)
        return await self._send(commands.RecordMessages, NotesWritten, locals())

    async def renew(self, user_id: str, note_id: str, *, command_id: str | None = None) -> NoteWritten:
        """Start a note's time to live again from now (nothing for a note without one)."""
        return await self._send(commands.RenewNote, NoteWritten, locals())

    async def retract_message(self, user_id: str, message_id: str, *, command_id: str | None = None) -> NoteWritten:
        """Take back a recorded turn: it leaves its conversation's listing and searches."""
        return await self._send(commands.RetractMessage, NoteWritten, locals())

    async def forget(
        self,
        user_id: str,
        *,
        query: str | None = None,
        note_ids: Sequence[str] = (),
        confirmed: bool = False,
        top_k: int = 5,
        command_id: str | None = None,
        after: str | None = None,
    ) -> ForgetReply:
        """Requirements §1's two calls: a query answers candidates; ids answer ``confirmation_required``
        the first time and ``forgotten`` the second (or at once with ``confirmed``)."""
        note_ids = list(note_ids)
        return await self._send(commands.RequestForget, ForgetReply, locals())

    async def forget_user(self, user_id: str, *, confirmed: bool = False, command_id: str | None = None) -> ForgetReply:
        """Erase all of a user's memory: ``confirmation_required`` first, then ``forgotten``
        with the receipt (``forgotten`` ids, ``erased_at``)."""
        return await self._send(commands.RequestForgetUser, ForgetReply, locals())

    async def forget_session(
        self, user_id: str, session_id: str, *, confirmed: bool = False, command_id: str | None = None
    ) -> ForgetReply:
        """Erase one conversation (every message of ``session_id``): ``confirmation_required``
        first, then ``forgotten`` with the erased message ids."""
        return await self._send(commands.RequestForgetSession, ForgetReply, locals())
