"""Every route of the HTTP API as data: the contract it sends on the bus and the reply it
answers with. One table serves the routes (``routes.py``) and the OpenAPI document
(``openapi.py``), so the two cannot tell different stories.

What a caller sends is the contract itself, less what the front door fills in: the user (from the
bearer token, or an operator's ``X-Engram-User``), ``command_id`` (the ``Idempotency-Key``
header), ``after`` (the ``Engram-Read-After`` header), and the fields the path names. The rest of
the contract's fields, with their rules, defaults and descriptions, make the request's body (or,
for a GET, its query string): a Struct derived here from the contract, never written by hand.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import msgspec

from engram_ledger.contracts import commands, queries

# Filled in by the front door, never taken from what a request says of itself.
IDENTITY = frozenset({"schema_version", "user_id", "command_id", "after"})
# Deleting without the second call is the operators' stream's alone (``engram forget --yes``).
WITHHELD = frozenset({"confirmed"})
_PATH_FIELD = re.compile(r"{(\w+)(?::\w+)?}")
# A command, query or reply of contracts/.
Contract = type[msgspec.Struct]


@dataclass(frozen=True)
class Operation:
    """One route: ``path`` is under ``/v1``, in Starlette's syntax; each ``{field}`` is one segment,
    percent-encoded (an id's "/" is sent as ``%2F``: ``paths.py``).
    ``takes``: where the contract's other fields come from (a JSON body, the query string, or
    nowhere: the path says it all). ``operator``: an operator's token only, the user named in the
    path."""

    name: str
    method: str
    path: str
    sends: Contract
    answers: Contract
    summary: str
    takes: Literal["body", "query", "nothing"]
    status: int = 200
    operator: bool = False
    # Contract fields the route does not offer (a filter that cannot go in a URL).
    leaves_out: frozenset[str] = field(default_factory=frozenset)
    # Defaults the route gives fields the contract requires, as (field, value) pairs: a read
    # defaults what the matching write defaults, so the two address the same note.
    defaults: tuple[tuple[str, Any], ...] = ()

    @property
    def path_fields(self) -> list[str]:
        return _PATH_FIELD.findall(self.path)

    @property
    def documented_path(self) -> str:
        """The path as OpenAPI writes it."""
        return "/v1" + _PATH_FIELD.sub(r"{\1}", self.path)

    @property
    def is_command(self) -> bool:
        return "command_id" in self.sends.__struct_fields__

    @property
    def reads_after(self) -> bool:
        """Whether the contract waits for a write's token (``Engram-Read-After``)."""
        return "after" in self.sends.__struct_fields__

    @cached_property
    def takes_struct(self) -> Contract | None:
        """The body's (or query string's) Struct: the contract's fields the caller gives."""
        if self.takes == "nothing":
            return None
        suffix = "Request" if self.takes == "body" else "Parameters"
        left_out = IDENTITY | WITHHELD | self.leaves_out | set(self.path_fields)
        if self.takes == "query":
            left_out |= {"origin"}  # an object has no place in a query string
        # A typo in a query string is refused; a body, as on the bus, may carry what a newer
        # client knows and this release does not.
        return derived(
            self.sends,
            _pascal(self.name) + suffix,
            left_out,
            forbid_unknown=self.takes == "query",
            defaults=dict(self.defaults),
        )

    def path_type(self, name: str) -> Any:
        """The contract's type of the path's field ``name``, with its rules."""
        return next(f.type for f in msgspec.structs.fields(self.sends) if f.name == name)


def derived(
    contract: Contract,
    name: str,
    leave_out: set[str] | frozenset[str],
    forbid_unknown: bool,
    defaults: dict[str, Any] | None = None,
) -> Any:
    """A Struct of ``contract``'s fields but ``leave_out``, with their types (rules included),
    defaults (``defaults`` over the contract's) and the contract's docstring."""
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    defaults = defaults or {}
    for f in msgspec.structs.fields(contract):
        if f.name in leave_out:
            continue
        if f.name in defaults:
            fields.append((f.name, f.type, defaults[f.name]))
        elif f.default is not msgspec.NODEFAULT:
            fields.append((f.name, f.type, f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            fields.append((f.name, f.type, msgspec.field(default_factory=f.default_factory)))
        else:
            fields.append((f.name, f.type))
    return msgspec.defstruct(
        name,
        fields,
        kw_only=True,
        frozen=True,
        forbid_unknown_fields=forbid_unknown,
        module=__name__,
        namespace={"__doc__": inspect.cleandoc(contract.__doc__ or "")},
    )


def _pascal(name: str) -> str:
    return name[:1].upper() + name[1:]


def _put_default(name: str) -> Any:
    """``PutNote``'s default for its field ``name``."""
    return next(f.default for f in msgspec.structs.fields(commands.PutNote) if f.name == name)


def _op(name: str, method: str, path: str, sends: Contract, answers: Contract, summary: str, **kw: Any) -> Operation:
    takes = kw.pop("takes", "body" if method in ("POST", "PUT", "PATCH") else "query")
    return Operation(name, method, path, sends, answers, summary, takes, **kw)


OPERATIONS: list[Operation] = [
    _op("saveNote", "POST", "/notes", commands.SaveNote, queries.NoteWritten, "Save a note", status=201),
    _op(
        "saveNotes", "POST", "/notes/batch", commands.SaveNotes, queries.NotesWritten, "Save notes at once", status=201
    ),
    _op(
        "listNotes",
        "GET",
        "/notes",
        queries.ListNotes,
        queries.NotesReply,
        "List notes (a page; as of a moment; valid at a time)",
        leaves_out=frozenset({"where"}),
    ),
    _op("getNote", "GET", "/notes/{note_id}", queries.GetNote, queries.NoteReply, "Get a note (as of a moment)"),
    _op("updateNote", "PATCH", "/notes/{note_id}", commands.UpdateNote, queries.NoteWritten, "Update a note"),
    _op(
        "supersedeNote",
        "POST",
        "/notes/{note_id}/supersede",
        commands.SupersedeNote,
        queries.NoteWritten,
        "Mark a note replaced by another",
    ),
    _op("revertNote", "POST", "/notes/{note_id}/revert", commands.RevertNote, queries.NoteWritten, "Revert a note"),
    _op(
        "getHistory",
        "GET",
        "/notes/{note_id}/history",
        queries.GetHistory,
        queries.HistoryReply,
        "Every version of a note",
        takes="nothing",
    ),
    _op("diffNotes", "GET", "/diff", queries.DiffNotes, queries.DiffReply, "What changed between two moments"),
    _op("searchNotes", "POST", "/search", queries.SearchNotes, queries.SearchReply, "Search the memory"),
    _op("buildContext", "POST", "/context", queries.BuildContext, queries.ContextReply, "The memory block"),
    _op(
        "recordMessages",
        "POST",
        "/conversations/{session_id}/messages",
        commands.RecordMessages,
        queries.NotesWritten,
        "Record turns of a conversation",
        status=201,
    ),
    _op(
        "listMessages",
        "GET",
        "/conversations/{session_id}/messages",
        queries.ListMessages,
        queries.MessagesReply,
        "A conversation's turns",
    ),
    _op("putKey", "PUT", "/keys/{key}", commands.PutNote, queries.NoteWritten, "Put a value under a key"),
    _op(
        "getKey",
        "GET",
        "/keys/{key}",
        queries.GetNoteByKey,
        queries.NoteReply,
        "The note put under a key",
        defaults=(("category", _put_default("category")),),
    ),
    _op("forget", "POST", "/forget", commands.RequestForget, queries.ForgetReply, "Forget, in two calls"),
    _op(
        "eraseUser",
        "DELETE",
        "/users/{user_id}",
        commands.RequestForgetUser,
        queries.ForgetReply,
        "Erase a user's memory, in two calls (operator)",
        takes="nothing",
        operator=True,
    ),
    _op(
        "eraseConversation",
        "DELETE",
        "/users/{user_id}/conversations/{session_id}",
        commands.RequestForgetSession,
        queries.ForgetReply,
        "Erase a conversation, in two calls (operator)",
        takes="nothing",
        operator=True,
    ),
]
