"""A backend for Claude's memory tool (``memory_20250818``) kept in Engram.

Claude asks the application to ``view``, ``create``, ``str_replace``, ``insert``, ``delete`` and
``rename`` files under ``/memories``; ``EngramMemoryTool`` is the anthropic SDK's
``BetaAsyncAbstractMemoryTool`` over Engram's keyed notes, for ``AsyncAnthropic``'s tool runner:

    memory = EngramMemoryTool(engram_url(), user_id="alice")
    runner = client.beta.messages.tool_runner(model=..., max_tokens=..., messages=..., tools=[memory])
    async for message in runner: ...

Each file is one note of one Engram user, put under its path as key (category ``claude-memory``
by default) with the value ``{"path": ..., "text": ...}``: sealed at rest, searchable, and with a
version per change. So, unlike a directory on disk:

- ``str_replace`` and ``insert`` are updates that name the version they edited: a concurrent
  writer's change is never overwritten (the edit is made again on the new text).
- ``delete`` is Engram's forget: the file's text is crypto-shredded and the note is a tombstone.
- ``rename`` puts the text under the new path and marks the old note superseded by the new
  one: the old path's versions stay in the history, which ``history`` follows across renames.
- ``history(path)`` lists every version of a file; ``view_as_of(path, when)`` answers a
  ``view`` as the memory directory was at an earlier moment.
- Each user's files are theirs alone: another user's tool never sees them.

Paths are as Anthropic's documentation states: ``/memories`` or below it; ``..`` (plain or
percent-encoded), backslashes and NUL characters are refused. Errors reach Claude as the SDK's
``ToolError`` (a tool result with ``is_error``), worded as the SDK's own file-system backend
words them: a missing file, an ambiguous or absent ``old_str``, a line out of range, an escape.
Directories are implied by the files below them, as in the key space of an object store.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from urllib.parse import unquote

from anthropic.lib.tools import BetaAsyncAbstractMemoryTool, ToolError
from anthropic.types.beta import (
    BetaCacheControlEphemeralParam,
    BetaMemoryTool20250818CreateCommand,
    BetaMemoryTool20250818DeleteCommand,
    BetaMemoryTool20250818InsertCommand,
    BetaMemoryTool20250818RenameCommand,
    BetaMemoryTool20250818StrReplaceCommand,
    BetaMemoryTool20250818ViewCommand,
)

from engram_ledger.contracts.errors import EngramError, ErrorCode
from engram_ledger.contracts.limits import LIST_NOTES_MAX, MAX_FORGET_IDS, MAX_KEY_CHARS
from engram_ledger.contracts.model import NoteView
from engram_ledger.services.bus.client import EngramClient
from engram_ledger.services.integrations.connection import AdapterClient

ROOT = "/memories"
CLAUDE_CATEGORY = "claude-memory"
# As the SDK's own backend numbers a file's lines.
MAX_LINES = 999_999
LINE_NUMBER_WIDTH = len(str(MAX_LINES))
# An edit that keeps losing the race to other writers is given up after this many tries.
EDIT_ATTEMPTS = 5


@dataclass(frozen=True)
class FileVersion:
    """One version of a memory file: where it was, what it said, when, and what changed it
    (``saved``, ``updated``, ``superseded`` when renamed away, ``forgotten``)."""

    path: str
    version: int
    change: str
    text: str
    at: datetime
    note_id: str


def memory_path(path: str) -> str:
    """The canonical path (``/memories/a/b.md``) of a path Claude gave, or a ``ToolError``."""
    if not isinstance(path, str) or not (path == ROOT or path.startswith(ROOT + "/")):
        raise ToolError(f"Path must start with {ROOT}, got: {path}")
    decoded = path
    for _ in range(3):  # %252e%252e is %2e%2e is ..
        decoded = unquote(decoded)
    if "\x00" in decoded or "\\" in decoded or ".." in decoded.split("/"):
        raise ToolError(f"Path {path} would escape {ROOT} directory")
    canonical = posixpath.normpath(path)
    if len(canonical) > MAX_KEY_CHARS:
        raise ToolError(f"Path {path} is longer than {MAX_KEY_CHARS} characters")
    return canonical


def format_size(size: int) -> str:
    """A size as the SDK's backend prints it: 0B, 512B, 1.5K, 2M."""
    if size == 0:
        return "0B"
    unit = min((size.bit_length() - 1) // 10, 3)
    scaled = size / (1024**unit)
    return f"{int(scaled) if scaled == int(scaled) else f'{scaled:.1f}'}{'BKMG'[unit]}"


class EngramMemoryTool(BetaAsyncAbstractMemoryTool):
    """Claude's memory tool over one Engram user's keyed notes.

    ``url_or_client``: an ``EngramClient`` (shared, left open by ``close``; an operator's, since
    ``delete`` forgets at once) or a Redis URL (a client of its own, connected on first use and
    closed by ``close``). ``category``: where the files are kept among the user's notes."""

    def __init__(
        self,
        url_or_client: str | EngramClient,
        *,
        user_id: str,
        category: str = CLAUDE_CATEGORY,
        cache_control: BetaCacheControlEphemeralParam | None = None,
    ) -> None:
        super().__init__(cache_control=cache_control)
        self.user_id = user_id
        self.category = category
        # The consistency token of the last write: every read waits for it (read-your-writes).
        self.token: str | None = None
        self._client = AdapterClient(url_or_client)

    async def __aenter__(self) -> EngramMemoryTool:
        await self._client.ready()
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the client this tool opened (a client passed in is the caller's to close)."""
        await self._client.close()

    # The six commands -----------------------------------------------------------------------

    async def view(self, command: BetaMemoryTool20250818ViewCommand) -> str:
        path = memory_path(command.path)
        with _engram_errors(path):
            files = await self._files()
        return render_view(path, files, command.view_range)

    async def create(self, command: BetaMemoryTool20250818CreateCommand) -> str:
        path = memory_path(command.path)
        with _engram_errors(path):
            files = await self._files()
            _check_creatable(path, files)
            try:
                await self._put(path, command.file_text, expected_version=0)
            except EngramError as e:
                if e.code is ErrorCode.VERSION_CONFLICT:  # created meanwhile by another writer
                    raise ToolError(f"File {path} already exists") from None
                raise
        return f"File created successfully at: {path}"

    async def str_replace(self, command: BetaMemoryTool20250818StrReplaceCommand) -> str:
        path = memory_path(command.path)
        changed_line = 0

        def edit(text: str) -> str:
            nonlocal changed_line
            new_text = replaced(path, text, command.old_str, command.new_str)
            changed_line = text[: text.find(command.old_str)].count("\n")
            return new_text

        new_text = await self._edit(path, edit)
        return (
            "The memory file has been edited. Here is the snippet showing the change (with line numbers):\n"
            + snippet(new_text, changed_line)
        )

    async def insert(self, command: BetaMemoryTool20250818InsertCommand) -> str:
        path = memory_path(command.path)
        await self._edit(path, lambda text: inserted(text, command.insert_line, command.insert_text))
        return f"The file {path} has been edited."

    async def delete(self, command: BetaMemoryTool20250818DeleteCommand) -> str:
        path = memory_path(command.path)
        if path == ROOT:
            raise ToolError(f"Cannot delete the {ROOT} directory itself")
        with _engram_errors(path):
            doomed = [note.id for at, note in (await self._files()).items() if _under(at, path)]
            if not doomed:
                raise ToolError(f"The path {path} does not exist")
            await self._forget(doomed)
        return f"Successfully deleted {path}"

    async def rename(self, command: BetaMemoryTool20250818RenameCommand) -> str:
        old, new = memory_path(command.old_path), memory_path(command.new_path)
        if old == ROOT:
            raise ToolError(f"Cannot rename the {ROOT} directory itself")
        with _engram_errors(old):
            files = await self._files()
            moving = {at: note for at, note in files.items() if _under(at, old)}
            if not moving:
                raise ToolError(f"The path {old} does not exist")
            if any(_under(at, new) or _under(new, at) for at in files):
                raise ToolError(f"The destination {new} already exists")
            for at, note in moving.items():
                await self._move(note, new + at[len(old) :])
        return f"Successfully renamed {old} to {new}"

    async def clear_all_memory(self) -> str:
        """Forget every file (each one's text shredded, as ``delete`` does)."""
        with _engram_errors(ROOT):
            await self._forget([note.id for note in (await self._files()).values()])
        return "All memory cleared"

    # Engram's own: history and time travel ----------------------------------------------------

    async def history(self, path: str) -> list[FileVersion]:
        """Every version of the file now at ``path``, oldest first, across its renames."""
        path = memory_path(path)
        client = await self._client.ready()
        with _engram_errors(path):
            note = await client.get_by_key(self.user_id, self.category, path, after=self.token)
            if note is None:
                raise ToolError(f"The path {path} does not exist. Please provide a valid path.")
            return await self._versions(client, note.id)

    async def view_as_of(self, path: str, when: datetime | str, view_range: list[int] | None = None) -> str:
        """What ``view`` answered at ``when`` (a time, or a token a write returned)."""
        path = memory_path(path)
        with _engram_errors(path):
            files = await self._files(as_of=when)
        return render_view(path, files, view_range)

    # Plumbing ---------------------------------------------------------------------------------

    async def _files(self, as_of: datetime | str | None = None) -> dict[str, NoteView]:
        """Every file (path -> note), now or as it was ``as_of``."""
        client = await self._client.ready()
        files: dict[str, NoteView] = {}
        offset = 0
        while True:
            page = await client.list_notes(
                self.user_id,
                category=self.category,
                keyed_only=True,
                offset=offset,
                limit=LIST_NOTES_MAX,
                after=self.token,
                as_of=as_of,
            )
            files.update((note.key, note) for note in page.notes if note.key is not None)
            offset += len(page.notes)
            if not page.notes or offset >= page.total:
                return files

    async def _put(self, path: str, text: str, expected_version: int) -> None:
        client = await self._client.ready()
        written = await client.put(
            self.user_id,
            self.category,
            path,
            {"path": path, "text": text},
            index=["path", "text"],
            expected_version=expected_version,
        )
        self.token = written.token

    async def _edit(self, path: str, change: Callable[[str], str]) -> str:
        """Apply ``change`` (old text -> new text) to the file, as an update naming the version it
        read: when another writer got there first, read again and apply it to their text."""
        client = await self._client.ready()
        with _engram_errors(path):
            for _ in range(EDIT_ATTEMPTS):
                note = await client.get_by_key(self.user_id, self.category, path, after=self.token)
                if note is None:
                    files = await self._files()
                    if any(_under(at, path) for at in files):
                        raise ToolError(f"The path {path} is not a file.")
                    raise ToolError(f"The path {path} does not exist. Please provide a valid path.")
                new_text = change(_text(note))
                try:
                    await self._put(path, new_text, expected_version=note.version)
                except EngramError as e:
                    if e.code is not ErrorCode.VERSION_CONFLICT:
                        raise
                    continue
                return new_text
        raise ToolError(f"The file {path} kept changing while it was being edited; view it and try again.")

    async def _move(self, note: NoteView, new_path: str) -> None:
        """The note's text under ``new_path``, and the old note superseded by the new one (its
        history kept, linked). Should the old one change meanwhile, the copy is forgotten."""
        client = await self._client.ready()
        written = await client.put(
            self.user_id,
            self.category,
            new_path,
            {"path": new_path, "text": _text(note)},
            index=["path", "text"],
            expected_version=0,
        )
        self.token = written.token
        try:
            moved = await client.supersede(self.user_id, note.id, written.note_id, expected_version=note.version)
        except EngramError:
            await self._forget([written.note_id])
            raise
        self.token = moved.token

    async def _forget(self, note_ids: list[str]) -> None:
        client = await self._client.ready()
        for start in range(0, len(note_ids), MAX_FORGET_IDS):
            reply = await client.forget(self.user_id, note_ids=note_ids[start : start + MAX_FORGET_IDS], confirmed=True)
            self.token = reply.token or self.token

    async def _versions(self, client: EngramClient, note_id: str) -> list[FileVersion]:
        """A note's versions, after those of the notes it superseded (the paths it was renamed
        from)."""
        note = await client.get_note(self.user_id, note_id, after=self.token)
        earlier: list[FileVersion] = []
        for old_id in note.supersedes:
            earlier.extend(await self._versions(client, old_id))
        reply = await client.history(self.user_id, note_id, after=self.token)
        own = [
            FileVersion(
                path=str((v.value or {}).get("path", note.key)),
                version=v.version,
                change=v.change,
                text=str((v.value or {}).get("text", "")),
                at=v.created_at,
                note_id=note_id,
            )
            for v in reply.versions
        ]
        return sorted(earlier, key=lambda v: v.at) + own


# What the commands answer (pure) -----------------------------------------------------------------


def render_view(path: str, files: dict[str, NoteView], view_range: list[int] | None) -> str:
    """A file's numbered lines, or a directory's files up to two levels deep, as the SDK's
    backend renders them."""
    if path in files:
        return numbered(path, _text(files[path]), view_range)
    below = {at: note for at, note in files.items() if _under(at, path) and at != path}
    if not below and path != ROOT:
        raise ToolError(f"The path {path} does not exist. Please provide a valid path.")
    sizes: dict[str, int] = {}
    for at, note in below.items():
        parts = at[len(path) + 1 :].split("/")
        if any(part.startswith(".") for part in parts):
            continue  # hidden, as a directory listing leaves them out
        size = len(_text(note).encode())
        for depth in range(1, min(len(parts), 2) + 1):
            entry = "/".join(parts[:depth]) + ("/" if depth < len(parts) else "")
            sizes[entry] = sizes.get(entry, 0) + size
    header = f"Here're the files and directories up to 2 levels deep in {path}, excluding hidden items:"
    lines = [f"{format_size(sum(len(_text(n).encode()) for n in below.values()))}\t{path}"]
    lines.extend(f"{format_size(size)}\t{path}/{entry}" for entry, size in sorted(sizes.items()))
    return header + "\n" + "\n".join(lines)


def numbered(path: str, text: str, view_range: list[int] | None) -> str:
    lines = text.split("\n")
    if len(lines) > MAX_LINES:
        raise ToolError(f"File {path} exceeds maximum line limit of 999,999 lines.")
    start = 1
    if view_range and len(view_range) == 2:
        start = max(1, view_range[0])
        end = len(lines) if view_range[1] == -1 else view_range[1]
        lines = lines[start - 1 : end]
    shown = [f"{str(number).rjust(LINE_NUMBER_WIDTH)}\t{line}" for number, line in enumerate(lines, start)]
    return f"Here's the content of {path} with line numbers:\n" + "\n".join(shown)


def replaced(path: str, text: str, old: str, new: str) -> str:
    count = text.count(old)
    if count == 0:
        raise ToolError(f"No replacement was performed, old_str `{old}` did not appear verbatim in {path}.")
    if count > 1:
        lines = []
        at = text.find(old)
        while at != -1:
            lines.append(text[:at].count("\n") + 1)
            at = text.find(old, at + 1)
        raise ToolError(
            f"No replacement was performed. Multiple occurrences of old_str `{old}` in lines: "
            f"{', '.join(map(str, lines))}. Please ensure it is unique"
        )
    return text.replace(old, new)


def inserted(text: str, insert_line: int, insert_text: str) -> str:
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if insert_line < 0 or insert_line > len(lines):
        raise ToolError(
            f"Invalid `insert_line` parameter: {insert_line}. It should be within the range [0, {len(lines)}]."
        )
    lines.insert(insert_line, insert_text.rstrip("\n"))
    return "\n".join(lines) + "\n"


def snippet(text: str, line: int) -> str:
    """The lines around ``line`` (from 0), numbered: what an edit changed."""
    lines = text.split("\n")
    return "\n".join(
        f"{str(number).rjust(LINE_NUMBER_WIDTH)}\t{lines[number - 1]}"
        for number in range(max(0, line - 2) + 1, min(len(lines), line + 3) + 1)
    )


def _check_creatable(path: str, files: dict[str, NoteView]) -> None:
    if path in files:
        raise ToolError(f"File {path} already exists")
    if path == ROOT or any(_under(at, path) for at in files):
        raise ToolError(f"The path {path} is a directory")
    for at in files:
        if _under(path, at):
            raise ToolError(f"The path {at} is a file, not a directory")


def _under(path: str, directory: str) -> bool:
    """``path`` is ``directory`` or below it."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _text(note: NoteView) -> str:
    return str((note.value or {}).get("text", ""))


@contextmanager
def _engram_errors(path: str) -> Iterator[None]:
    """Engram's refusals as tool errors Claude can read and act on."""
    try:
        yield
    except EngramError as e:
        if e.code is ErrorCode.MEMORY_NOT_FOUND:
            raise ToolError(f"The path {path} does not exist. Please provide a valid path.") from None
        if e.code is ErrorCode.VERSION_CONFLICT:
            raise ToolError(f"The path {path} changed meanwhile; view it and try again.") from None
        raise ToolError(f"The memory could not do that ({e.code.value}): {e.message}") from None
