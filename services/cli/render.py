"""What ``engram`` prints for a person (without ``--json``): every reply in words, compact. Each
function takes a reply (``contracts/queries.py``) and answers a ``rich`` ``Text``; ``show`` prints
it, in colour only when stdout is a terminal. Long text is cut with a marker that says how long it
was; ``--json`` always has all of it. Content is the user's (or an LLM's) text: it is never read
as markup, and control characters are shown escaped, not sent to the terminal."""

from __future__ import annotations

import shlex
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from engram_ledger.contracts import events
from engram_ledger.contracts.model import NoteChange, NoteStatus, NoteView, VersionView
from engram_ledger.contracts.queries import (
    DiffReply,
    ForgetReply,
    HistoryReply,
    NoteWritten,
    RecallsReply,
    SearchHit,
    SearchReply,
)

if TYPE_CHECKING:
    from engram_ledger.services.bus.deliveries import Delivery

# A note's text on one line of a listing (list, search, history, similar notes), and in full view (get).
LINE_CHARS = 160
NOTE_CHARS = 1_000

ID = "cyan"
DIM = "dim"
SUPERSEDED = "yellow"
GONE = "red"
HEADING = "bold"


def show(renderable: Text | str) -> None:
    """Print one reply on stdout: colour only on a terminal, lines never wrapped or cropped by us."""
    text = renderable if isinstance(renderable, Text) else Text(renderable)
    Console(highlight=False, soft_wrap=True, emoji=False, markup=False).print(text)


# text -------------------------------------------------------------------------------------------


def cut(text: str, limit: int, *, one_line: bool = False) -> str:
    """``text`` as it is safe to print: control characters escaped, on one line if asked (every
    run of whitespace one space), and at most ``limit`` characters before a marker that gives the
    full length."""
    shown = " ".join(text.split()) if one_line else text
    shown = "".join(_visible(c) for c in shown)
    if len(shown) <= limit:
        return shown
    return f"{shown[:limit].rstrip()}… ({len(text):,} characters; --json for all)"


def _visible(char: str) -> str:
    # Format characters are escaped too (a bidi override can make text read otherwise), except
    # the joiners that emoji and some scripts need.
    if char in "\n\t\u200c\u200d" or unicodedata.category(char) not in ("Cc", "Cf"):
        return char
    return char.encode("unicode_escape").decode("ascii")


def when(moment: datetime | None) -> str:
    if moment is None:
        return "unknown time"
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


def _lines(*parts: Text | None) -> Text:
    return Text("\n").join(p for p in parts if p is not None)


def _id(note_id: str) -> Text:
    return Text(note_id, style=ID)


# writes -----------------------------------------------------------------------------------------


def _written(reply: NoteWritten) -> Text:
    text = Text.assemble(" token ", (reply.token, DIM))
    if reply.replayed:
        text.append(" (replayed: this command id was applied before; nothing new written)")
    return text


def saved(reply: NoteWritten, user: str = "USER") -> Text:
    """A ``SaveNote`` reply: the note made, or the one that already held the text; then the
    advice, as commands a person types (``action_required`` is the same advice for a model)."""
    if reply.duplicate:
        return Text.assemble(
            "already saved as ", _id(reply.note_id), f" (version {reply.version}): nothing new written"
        )
    parts: list[Text | None] = [
        Text.assemble("saved ", _id(reply.note_id), f" (version {reply.version})", _written(reply))
    ]
    if reply.similar:
        parts.append(Text("similar notes (the new one may make them outdated):", style=HEADING))
        parts += [
            Text.assemble(
                "  ",
                _id(s.note_id),
                f"  {s.similarity:.2f}  ",
                f"[{cut(s.subject, LINE_CHARS, one_line=True)}] " if s.subject else "",
                cut(s.content, LINE_CHARS, one_line=True),
            )
            for s in reply.similar
        ]
    if reply.same_subject:
        parts.append(
            Text.assemble(("same subject: ", HEADING), Text(", ", style="").join(map(_id, reply.same_subject)))
        )
    if reply.similar:
        parts.append(
            Text.assemble(
                ("if it makes one outdated: ", HEADING),
                f"engram supersede --user {user} <outdated id> {reply.note_id}",
            )
        )
    if reply.same_subject:
        parts.append(
            Text.assemble(
                ("to change the existing note instead: ", HEADING),
                f"engram update --user {user} {reply.same_subject[0]} TEXT",
                f", then engram forget --user {user} --yes {reply.note_id}",
            )
        )
    return _lines(*parts)


def updated(reply: NoteWritten) -> Text:
    return Text.assemble("updated ", _id(reply.note_id), f" to version {reply.version}", _written(reply))


def reverted(reply: NoteWritten, to_version: int, changed: bool = True) -> Text:
    if not changed:
        held = f" already holds what version {to_version} held (version {reply.version}): nothing new written"
        return Text.assemble(_id(reply.note_id), held)
    return Text.assemble(
        "reverted ",
        _id(reply.note_id),
        f" to what version {to_version} held: now version {reply.version}",
        _written(reply),
    )


def as_of(moment: str | None, shown: Text) -> Text:
    """A reading of the past says which moment it shows."""
    if moment is None:
        return shown
    return _lines(Text(f"as of {moment}:", style=HEADING), shown)


def diff(reply: DiffReply) -> Text:
    """``DiffNotes``: one line a change, oldest first; an update shows before and after."""
    if not reply.changes:
        return Text("nothing changed in that time")
    parts: list[Text | None] = [_change(c) for c in reply.changes]
    if reply.truncated:
        parts.append(Text("… more changes follow: narrow the time or raise --limit", style=DIM))
    return _lines(*parts)


def _change(change: NoteChange) -> Text:
    head = Text.assemble(f"{when(change.at)}  ", _id(change.note_id), f"  v{change.version}  {change.change:<10}  ")
    after, before = change.after, change.before
    if after is None:
        return Text.assemble(head, ("its content is gone", GONE))
    if change.change == "superseded":
        return Text.assemble(head, ("by ", SUPERSEDED), _id(after.superseded_by or "?"))
    text = cut(after.content, LINE_CHARS, one_line=True)
    if after.reverted_to is not None:
        head.append(f"(to v{after.reverted_to}) ")
    if before is not None and before.content != after.content:
        return Text.assemble(head, (cut(before.content, LINE_CHARS // 2, one_line=True), DIM), " → ", text)
    return Text.assemble(head, text)


def recalls(reply: RecallsReply) -> Text:
    """``ListRecalls``: one line a recall, newest first."""
    if not reply.recalls:
        return Text("no recalls recorded in that time (they are recorded for the users ENGRAM_RECALL_AUDIT names)")
    lines: list[Text | None] = []
    for r in reply.recalls:
        where = ", ".join(x for x in (r.channel, f"session {r.session_id}" if r.session_id else None) if x)
        asked = f"{r.query!r}" if r.query is not None else "(no query)"
        if r.query is None and r.asked:
            asked = (
                "(query gone with a note it names, or not kept)" if r.notes else "(query not kept: it showed nothing)"
            )
        shown = " ".join(f"{n}@v{v}" for n, v in zip(r.notes, r.versions, strict=False)) or "nothing"
        lines.append(
            Text.assemble(f"{when(r.at)}  {r.kind:<8} ", (f"[{where}] " if where else "", DIM), asked, f" → {shown}")
        )
    return _lines(*lines)


def superseded(reply: NoteWritten) -> Text:
    return Text.assemble(
        _id(reply.note_id),
        " is superseded by ",
        _id(reply.superseded_by or "?"),
        f" (version {reply.version})",
        _written(reply),
    )


def forget(reply: ForgetReply, user: str = "USER", erasing: bool = False) -> Text:
    """A forget reply in a person's words (its ``message`` is the tools' text, for a model): the
    candidates a query found and how to forget one, what is asked and until when to confirm it by
    running the same command again, what was forgotten or erased. ``erasing``: the command erases
    a whole user or conversation."""
    if reply.status == "candidates":
        return _candidates(reply, user)
    parts: list[Text | None] = []
    if reply.status == "forgotten" and erasing:
        erased = f"Erased {len(reply.forgotten):,} notes and messages"
        parts.append(Text(f"{erased} on {when(reply.erased_at)}. This cannot be undone."))
    elif reply.forgotten:
        parts.append(Text.assemble("Forgotten: ", _ids(reply.forgotten), ". The content cannot be recovered."))
    for p in reply.pending:
        asked = cut(p.preview, LINE_CHARS, one_line=True)
        if erasing:
            parts.append(Text(f"Erase {asked}? Nothing is erased yet."))
        else:
            parts.append(Text.assemble(f"Forget {asked!r} (", _id(p.note_id), ")? Nothing is deleted yet."))
    if reply.pending:
        deadline = when(min(p.expires_at for p in reply.pending))
        what = "erase it all" if erasing else "forget it" if len(reply.pending) == 1 else "forget them"
        parts.append(Text(f"Run the same command again before {deadline} to {what}.", style=HEADING))
    if reply.withdrawn:
        parts.append(Text.assemble("The earlier request to forget ", _ids(reply.withdrawn), " is withdrawn."))
    if reply.token:
        parts.append(Text.assemble("token ", (reply.token, DIM), " (replayed)" if reply.replayed else ""))
    return _lines(*parts)


def _candidates(reply: ForgetReply, user: str) -> Text:
    if not reply.candidates:
        return Text("No memory matched; nothing was deleted.")
    found = f"{len(reply.candidates)} {'memory' if len(reply.candidates) == 1 else 'memories'}"
    parts = [Text(f"Found {found}; nothing was deleted.")]
    parts += [
        Text.assemble("  ", _id(c.note_id), f"  {c.similarity:.2f}  ", cut(c.preview, LINE_CHARS, one_line=True))
        for c in reply.candidates
    ]
    parts.append(Text(f"Forget which one? Run: engram forget --user {shlex.quote(user)} ID", style=HEADING))
    return _lines(*parts)


def _ids(note_ids: list[str]) -> Text:
    return Text(", ").join(map(_id, note_ids))


# reads ------------------------------------------------------------------------------------------


def _forgotten(note_id: str, at: datetime | None) -> Text:
    return Text.assemble(_id(note_id), (f" forgotten on {when(at)}; its content is gone", GONE))


def _status(note: NoteView) -> Text | None:
    if note.status is NoteStatus.SUPERSEDED:
        return Text.assemble(("superseded by ", SUPERSEDED), _id(note.superseded_by or "?"))
    return None


def note(view: NoteView) -> Text:
    """``GetNote``: the note in full (long text cut), its place in the lifecycle, its times."""
    if view.status is NoteStatus.FORGOTTEN:
        return _forgotten(view.id, view.updated_at)
    facts = [view.kind.value, view.category, f"version {view.version}"]
    if view.subject:
        facts.append(f"subject {view.subject}")
    parts: list[Text | None] = [
        Text.assemble("[id:", _id(view.id), "] ", (" · ".join(cut(f, LINE_CHARS, one_line=True) for f in facts), DIM)),
        Text(cut(view.content, NOTE_CHARS)),
    ]
    for label, value in (
        ("summary", view.summary),
        ("narrative", view.narrative),
        ("when", view.trigger),
        ("do", view.action),
    ):
        if value:
            parts.append(Text.assemble((f"{label}: ", HEADING), cut(value, NOTE_CHARS)))
    parts.append(_status(view))
    if view.supersedes:
        parts.append(Text.assemble("supersedes ", Text(", ").join(map(_id, view.supersedes))))
    if view.links:
        parts.append(Text.assemble("links ", Text(", ").join(map(_id, view.links))))
    if view.valid_from is not None or view.valid_until is not None:
        held = [
            f"from {when(view.valid_from)}" if view.valid_from else "",
            f"until {when(view.valid_until)}" if view.valid_until else "",
        ]
        parts.append(Text("held in the world " + " ".join(h for h in held if h)))
    times = [f"saved {when(view.created_at)}"]
    if view.occurred_at is not None:
        times.insert(0, f"happened {when(view.occurred_at)}")
    if view.updated_at != view.created_at:
        times.append(f"updated {when(view.updated_at)}")
    if view.access_count:
        reads = "once" if view.access_count == 1 else f"{view.access_count:,} times"
        times.append(f"read {reads}, last {when(view.last_accessed_at)}")
    parts.append(Text(" · ".join(times), style=DIM))
    return _lines(*parts)


def history(reply: HistoryReply, view: NoteView | None = None) -> Text:
    """``GetHistory``, one line a version. A forgotten note's versions are gone with its content;
    ``view`` (its tombstone) says when it was forgotten."""
    parts: list[Text | None] = [_version(v) for v in reply.versions]
    if reply.status == NoteStatus.FORGOTTEN.value:
        parts.append(_forgotten(reply.note_id, view.updated_at if view is not None else None))
    elif not parts:
        parts.append(Text(f"{reply.note_id}: no versions ({reply.status})"))
    return _lines(*parts)


def _version(v: VersionView) -> Text:
    head = Text(f"v{v.version}  {when(v.created_at)}  {v.change:<10}  ")
    if v.superseded_by:
        return Text.assemble(head, ("by ", SUPERSEDED), _id(v.superseded_by))
    if v.reverted_to is not None:
        head.append(f"(to v{v.reverted_to}) ")
    if v.status is NoteStatus.FORGOTTEN:
        return Text.assemble(head, ("its content is gone", GONE))
    subject = f"[{cut(v.subject, LINE_CHARS, one_line=True)}] " if v.subject else ""
    return Text.assemble(head, subject, cut(v.content, LINE_CHARS, one_line=True))


def _note_line(view: NoteView, *, extra: Iterable[str] = ()) -> Text:
    # When it happened, if that is not when it was saved: a search naming a time goes by it.
    happened = [f"happened {when(view.occurred_at)}"] if view.occurred_at is not None else []
    held = []
    if view.valid_from is not None:
        held.append(f"held from {when(view.valid_from)}")
    if view.valid_until is not None:
        held.append(f"held until {when(view.valid_until)}")
    facts = [*extra, view.category, f"v{view.version}", *happened, *held]
    line = Text.assemble("[id:", _id(view.id), "] ", (f"({', '.join(facts)})", DIM), " ")
    if view.status is NoteStatus.FORGOTTEN:
        # A listing of the past shows a note forgotten since as its tombstone.
        return Text.assemble(line, ("forgotten since: its content is gone", GONE))
    status = _status(view)
    if status is not None:
        line.append_text(Text.assemble("(", status, ") "))
    if view.subject:
        line.append(f"[{cut(view.subject, LINE_CHARS, one_line=True)}] ")
    line.append(cut(view.content, LINE_CHARS, one_line=True))
    return line


def notes(views: list[NoteView], total: int | None = None, offset: int | None = None) -> Text:
    """``ListNotes`` and ``ListRecent``: one line a note. ``offset``: where a page of a listing
    starts; the line after it says how to ask for the next one."""
    start = offset or 0
    if not views:
        if total and start:
            return Text(f"(no memories from offset {start}: there are {total})")
        return Text("(no memories)")
    parts = [_note_line(v) for v in views]
    more = (total or 0) - start - len(views)
    if more > 0:
        hint = f" (--offset {start + len(views)})" if offset is not None else ""
        parts.append(Text(f"… {more} more{hint}", style=DIM))
    return _lines(*parts)


def search(reply: SearchReply, query: str) -> Text:
    """``SearchNotes``, best first: each hit's relevance, where it was found, and for a note that
    was replaced, by what; in words when nothing matched."""
    if not reply.results:
        return Text(no_match(query))
    return _lines(*(_hit(hit) for hit in reply.results))


def no_match(query: str) -> str:
    return f"No memory matched {cut(query, LINE_CHARS, one_line=True)!r}."


def _hit(hit: SearchHit) -> Text:
    line = Text(f"{hit.relevance:.2f} ")
    if hit.message is not None:
        m = hit.message
        said = cut(m.speaker or m.role, LINE_CHARS, one_line=True)
        where = (
            f"conversation {cut(m.session_id, LINE_CHARS, one_line=True)}, {said}, {when(m.sent_at or m.created_at)}"
        )
        line.append_text(Text.assemble("[id:", _id(hit.note_id), "] ", (f"({where})", DIM), " "))
        line.append(cut(hit.content, LINE_CHARS, one_line=True))
        return line
    if hit.note is not None:
        line.append_text(_note_line(hit.note, extra=[hit.found_in]))
        return line
    line.append_text(Text.assemble("[id:", _id(hit.note_id), "] ", (f"({hit.found_in})", DIM), " "))
    line.append(cut(hit.content, LINE_CHARS, one_line=True))
    return line


# operations -------------------------------------------------------------------------------------


def health(report: Mapping[str, Any]) -> Text:
    """``engram health``: its status first, then every other part of the report, whatever keys
    it has: a section a line where its values fit on one, nested parts indented."""
    status = str(report.get("status", "unknown"))
    style = "green" if status == "ok" else "yellow" if status == "degraded" else GONE
    parts = [Text.assemble("status: ", (status, style))]
    for key, value in report.items():
        if key != "status":
            parts += _section(_label(key), value, 0)
    return _lines(*parts)


def _label(key: object) -> str:
    return str(key).replace("_", " ")


def _scalar(value: object) -> str:
    if value is True:
        return "yes"
    if value is False:
        return "no"
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    return cut(str(value), LINE_CHARS, one_line=True)


def _inline(value: object) -> str | None:
    """The value on one line, or None when it holds sections of its own."""
    if isinstance(value, Mapping):
        inner = [(_label(k), _inline(v)) for k, v in value.items()]
        if any(v is None or isinstance(value[k], Mapping) for k, (_, v) in zip(value, inner, strict=True)):
            return None
        return "(" + ", ".join(f"{k} {v}" for k, v in inner) + ")" if inner else "none"
    if isinstance(value, list):
        if any(isinstance(v, Mapping | list) for v in value):
            return None
        return ", ".join(_scalar(v) for v in value) or "none"
    return _scalar(value)


def _section(title: str, value: object, depth: int) -> list[Text]:
    pad = "  " * depth
    if isinstance(value, Mapping):
        # The parts of a top-level section get a line each; deeper down they fit on their parent's.
        inline = {k: None if depth == 0 and isinstance(v, Mapping) else _inline(v) for k, v in value.items()}
        summary = ", ".join(f"{_label(k)} {v}" for k, v in inline.items() if v is not None)
        lines = [Text(f"{pad}{title}" + (f": {summary}" if summary else ""))]
        for k, v in value.items():
            if inline[k] is None:
                lines += _section(_label(k), v, depth + 1)
        return lines
    if isinstance(value, list) and _inline(value) is None:
        lines = []
        for i, item in enumerate(value):
            # A list of records (partitions...) titles each by its first field when that is a plain value.
            if isinstance(item, Mapping) and item:
                first, first_value = next(iter(item.items()))
                if _inline(first_value) is not None and not isinstance(first_value, Mapping):
                    rest = {k: v for k, v in item.items() if k != first}
                    lines += _section(f"{_label(first)} {_scalar(first_value)}", rest, depth)
                    continue
            lines += _section(f"{title} {i}", item, depth)
        return lines
    return [Text(f"{pad}{title}: {_inline(value)}")]


# requirements §3's /memory ------------------------------------------------------------------------


def memory_list(views: list[NoteView], total: int | None = None, user: str = "USER") -> str:
    """Requirements §3's ``/memory list``, as its document shows it (plain text), with the
    command line's own way to delete. ``total``: how many there are, when the listing is one
    page of them."""
    if not views:
        return "📝 No memories yet.\n"
    lines = ["📝 Your memories:", ""]
    category = None
    for view in views:  # already in (category, created_at, id) order
        if view.category != category:
            if category is not None:
                lines.append("")
            category = view.category
            lines.append(f"**{category.title()}**")
        # Its exact text, on its line, with nothing that could drive the terminal.
        shown = "".join(_visible(c) for c in view.content.replace("\n", " "))
        lines.append(f"• [{view.id}] {shown}")
    if total is not None and total > len(views):
        lines += ["", f"… and {total - len(views):,} more (engram list --user {user} --offset {len(views)})"]
    lines += ["", f"Use `engram memory delete --user {user} <id>` to remove a memory."]
    return "\n".join(lines) + "\n"


# the event log (engram tail) ----------------------------------------------------------------------


def event_line(delivery: Delivery) -> Text:
    """One event as ``engram tail`` shows it: when, its token, its type, whose note and which
    version, what changed; content only when the subscription could open it. An erasure says
    what a downstream copy must erase."""
    event = delivery.event
    line = Text.assemble(
        (when(event.at), DIM),
        "  ",
        (delivery.token, DIM),
        "  ",
        (str(event.__struct_config__.tag), HEADING),
        f"  {event.user_id}/",
        _id(event.note_id),
        f" v{event.version}",
    )
    for part in _event_details(event):
        line.append("  ")
        line.append(part)
    text = getattr(event, "content", None)
    if delivery.content == "open" and text:
        line.append("  ")
        line.append(f'"{cut(text, LINE_CHARS, one_line=True)}"')
    elif delivery.content == "withheld":
        line.append("  (content sealed: --content or --key-file to read it)", style=DIM)
    elif delivery.content == "erased":
        line.append("  (content erased: the note was forgotten)", style=GONE)
    erasure = delivery.erasure
    if erasure is not None:
        line.append(f"  → {erasure}", style=GONE)
    return line


def _event_details(event: events.AnyEvent) -> list[str]:
    """What the event did, in words; one the table does not name (an erasure's receipt) says no more."""
    detail = _DETAILS.get(type(event))
    return [detail(event)] if detail is not None else []


def _saved_details(event: events.NoteSaved) -> str:
    subject = f", about {cut(event.subject, 80, one_line=True)}" if event.subject else ""
    return f"{event.kind} in {event.category}{subject}"


def _updated_details(event: events.NoteUpdated) -> str:
    changed = [f for f in ("content", "category", "subject", "confidence", "importance", "value", "expires_at")
               if getattr(event, f) is not None]  # fmt: skip
    return f"changed {', '.join(changed + (['expiry cleared'] if event.expiry_cleared else [])) or 'nothing'}"


def _recorded_details(event: events.MessageRecorded) -> str:
    speaker = f" ({cut(event.speaker, 80, one_line=True)})" if event.speaker else ""
    return f"{event.role}{speaker} in conversation {cut(event.session_id, 80, one_line=True)}"


# One line per event type: what ``engram tail`` says the event did.
_DETAILS: dict[type[events.AnyEvent], Callable[[Any], str]] = {
    events.NoteSaved: _saved_details,
    events.NoteUpdated: _updated_details,
    events.NoteSuperseded: lambda e: f"superseded by {e.superseded_by}",
    events.MemoryRecalled: lambda e: f"{e.kind} showed {len(e.notes)} memor{'y' if len(e.notes) == 1 else 'ies'}",
    events.NoteReverted: lambda e: f"reverted to version {e.to_version}" + (", active again" if e.reactivated else ""),
    events.NoteRenewed: lambda e: f"renewed: expires {when(e.expires_at)}",
    events.MessageRecorded: _recorded_details,
    events.MessageRetracted: lambda e: f"retracted from conversation {cut(e.session_id, 80, one_line=True)}",
    events.ForgetRequested: lambda e: f"deletion requested ({e.request_count}), to confirm by {when(e.expires_at)}",
    events.ForgetExpired: lambda e: f"deletion lapsed: {e.reason}",
    events.NoteForgotten: lambda e: f"forgotten ({e.reason or 'requested'})",
}
