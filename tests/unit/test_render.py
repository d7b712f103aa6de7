"""What `engram` prints for a person (services/cli/render.py): the facts of each reply, in words."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console

from engram_ledger.contracts.model import MessageView, NoteKind, NoteSource, NoteStatus, NoteView, VersionView
from engram_ledger.contracts.queries import (
    ForgetCandidate,
    ForgetReply,
    HistoryReply,
    NoteWritten,
    PendingForget,
    SearchHit,
    SearchReply,
    SimilarNote,
)
from engram_ledger.services.cli import render

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
T1 = datetime(2026, 5, 2, 8, 30, tzinfo=UTC)


def view(note_id: str = "AAAAAAAA", content: str = "Alec is my boss", **kw: Any) -> NoteView:
    values: dict[str, Any] = {
        "id": note_id,
        "user_id": "alice",
        "kind": NoteKind.FACT,
        "content": content,
        "category": "person",
        "subject": "Alec",
        "confidence": 1.0,
        "source": NoteSource.EXPLICIT,
        "importance": 0.5,
        "created_at": T0,
        "updated_at": T0,
        "last_accessed_at": None,
        "version": 1,
        "status": NoteStatus.ACTIVE,
        "supersedes": [],
        "superseded_by": None,
    }
    return NoteView(**(values | kw))


def test_a_save_says_what_was_written_and_the_advice() -> None:
    reply = NoteWritten(
        note_id="BBBBBBBB",
        version=1,
        token="0:5-0",
        similar=[
            SimilarNote(
                note_id="AAAAAAAA",
                content="Alec is my boss",
                similarity=0.8312,
                category="person",
                subject="Alec",
                confidence=1.0,
                source="explicit",
                created_at=T0,
            )
        ],
        same_subject=["AAAAAAAA", "CCCCCCCC"],
        action_required="Memory BBBBBBBB is close to AAAAAAAA. If it makes any of them outdated, call supersede.",
    )
    # The advice a person reads is the command to type, never the model's tool call.
    assert render.saved(reply, "ann").plain.splitlines() == [
        "saved BBBBBBBB (version 1) token 0:5-0",
        "similar notes (the new one may make them outdated):",
        "  AAAAAAAA  0.83  [Alec] Alec is my boss",
        "same subject: AAAAAAAA, CCCCCCCC",
        "if it makes one outdated: engram supersede --user ann <outdated id> BBBBBBBB",
        "to change the existing note instead: engram update --user ann AAAAAAAA TEXT, then engram forget "
        "--user ann --yes BBBBBBBB",
    ]


def test_a_duplicate_save_says_nothing_new_was_written() -> None:
    reply = NoteWritten(note_id="AAAAAAAA", version=3, token="0:5-0", duplicate=True)
    assert render.saved(reply).plain == "already saved as AAAAAAAA (version 3): nothing new written"
    replayed = NoteWritten(note_id="AAAAAAAA", version=1, token="0:5-0", replayed=True)
    assert "replayed" in render.saved(replayed).plain and "nothing new written" in render.saved(replayed).plain


def test_update_and_supersede_print_their_token() -> None:
    reply = NoteWritten(note_id="AAAAAAAA", version=2, token="0:9-0", superseded_by="BBBBBBBB")
    assert render.superseded(reply).plain == "AAAAAAAA is superseded by BBBBBBBB (version 2) token 0:9-0"
    assert render.updated(reply).plain == "updated AAAAAAAA to version 2 token 0:9-0"


def test_a_note_in_full_says_what_replaced_it() -> None:
    shown = render.note(view(status=NoteStatus.SUPERSEDED, superseded_by="BBBBBBBB", version=2, updated_at=T1))
    assert shown.plain.splitlines() == [
        "[id:AAAAAAAA] fact · person · version 2 · subject Alec",
        "Alec is my boss",
        "superseded by BBBBBBBB",
        "saved 2026-05-01 12:00:00 UTC · updated 2026-05-02 08:30:00 UTC",
    ]


def test_a_forgotten_note_says_when_and_that_its_content_is_gone() -> None:
    tombstone = view(content="", subject=None, status=NoteStatus.FORGOTTEN, updated_at=T1, version=3)
    expected = "AAAAAAAA forgotten on 2026-05-02 08:30:00 UTC; its content is gone"
    assert render.note(tombstone).plain == expected
    assert (
        render.history(HistoryReply(note_id="AAAAAAAA", status="forgotten", versions=[]), tombstone).plain == expected
    )


def test_history_one_line_a_version_and_the_replacement() -> None:
    versions = [
        VersionView(
            version=1,
            change="saved",
            content="Alec is my boss",
            category="person",
            subject="Alec",
            status=NoteStatus.ACTIVE,
            created_at=T0,
            command_id="c1",
        ),
        VersionView(
            version=2,
            change="superseded",
            content="Alec is my boss",
            category="person",
            subject="Alec",
            status=NoteStatus.SUPERSEDED,
            created_at=T1,
            command_id="c2",
            superseded_by="BBBBBBBB",
        ),
    ]
    shown = render.history(HistoryReply(note_id="AAAAAAAA", status="superseded", versions=versions))
    assert shown.plain.splitlines() == [
        "v1  2026-05-01 12:00:00 UTC  saved       [Alec] Alec is my boss",
        "v2  2026-05-02 08:30:00 UTC  superseded  by BBBBBBBB",
    ]


def test_long_text_is_cut_with_a_marker_and_a_listing_keeps_one_line_a_note() -> None:
    long = "line one\n" + "x" * 16_375
    assert len(long) == 16_384
    full = render.note(view(content=long)).plain
    assert "… (16,384 characters; --json for all)" in full and len(full) < render.NOTE_CHARS + 200
    listed = render.notes([view(content=long), view("BBBBBBBB", "short")], 2).plain.splitlines()
    assert len(listed) == 2 and listed[0].startswith("[id:AAAAAAAA] (person, v1) [Alec] line one xxx")
    assert listed[0].endswith("… (16,384 characters; --json for all)") and len(listed[0]) < 250
    assert render.notes([], 0).plain == "(no memories)"
    assert render.notes([view()], 7).plain.splitlines()[-1] == "… 6 more"


def test_a_note_that_happened_before_it_was_saved_says_when() -> None:
    hike = view(content="Hiked in the Alps", subject=None, occurred_at=datetime(2023, 5, 14, tzinfo=UTC))
    assert (
        render.notes([hike]).plain == "[id:AAAAAAAA] (person, v1, happened 2023-05-14 00:00:00 UTC) Hiked in the Alps"
    )


def test_control_characters_are_shown_not_sent_to_the_terminal() -> None:
    assert render.cut("a\x1b[31mred\x07", 100) == "a\\x1b[31mred\\x07"
    assert render.cut("tab\tand\nnewline", 100) == "tab\tand\nnewline"
    assert render.cut("tab\tand\nnewline", 100, one_line=True) == "tab and newline"
    assert render.cut("[bold]not markup[/bold] :smile:", 100) == "[bold]not markup[/bold] :smile:"


def test_search_marks_superseded_hits_and_where_each_was_found() -> None:
    old = view(status=NoteStatus.SUPERSEDED, superseded_by="BBBBBBBB")
    turn = MessageView(
        id="MMMMMMMM",
        user_id="alice",
        session_id="s-42",
        role="user",
        speaker="Caroline",
        content="I went to the support group yesterday",
        created_at=T1,
        sent_at=T0,
    )
    reply = SearchReply(
        results=[
            SearchHit(
                note_id=old.id,
                content=old.content,
                score=0.5,
                similarity=0.7,
                relevance=0.91,
                found_in="memory",
                note=old,
            ),
            SearchHit(
                note_id=turn.id,
                content=turn.content,
                score=0.1,
                similarity=0.4,
                relevance=0.52,
                found_in="conversation",
                message=turn,
            ),
        ]
    )
    assert render.search(reply, "my boss").plain.splitlines() == [
        "0.91 [id:AAAAAAAA] (memory, person, v1) (superseded by BBBBBBBB) [Alec] Alec is my boss",
        "0.52 [id:MMMMMMMM] (conversation s-42, Caroline, 2026-05-01 12:00:00 UTC) I went to the support group "
        "yesterday",
    ]
    assert render.search(SearchReply(results=[]), "who is my manager?").plain == (
        "No memory matched 'who is my manager?'."
    )


def test_a_forget_reply_says_until_when_to_confirm_and_the_receipt() -> None:
    asked = ForgetReply(
        status="confirmation_required",
        message="Please confirm: Delete 'Alec is my boss' (AAAAAAAA)? Call forget again with the same memory_id.",
        pending=[PendingForget(note_id="AAAAAAAA", preview="Alec is my boss", request_count=1, expires_at=T1)],
        withdrawn=["BBBBBBBB"],
        token="0:7-0",
    )
    assert render.forget(asked, "alice").plain.splitlines() == [
        "Forget 'Alec is my boss' (AAAAAAAA)? Nothing is deleted yet.",
        "Run the same command again before 2026-05-02 08:30:00 UTC to forget it.",
        "The earlier request to forget BBBBBBBB is withdrawn.",
        "token 0:7-0",
    ]
    done = ForgetReply(status="forgotten", message="Deleted successfully: AAAAAAAA.", forgotten=["AAAAAAAA"])
    assert render.forget(done).plain == "Forgotten: AAAAAAAA. The content cannot be recovered."
    erased = ForgetReply(status="forgotten", message="Erased 2 memories.", forgotten=["A", "B"], erased_at=T1)
    assert render.forget(erased, erasing=True).plain.splitlines() == [
        "Erased 2 notes and messages on 2026-05-02 08:30:00 UTC. This cannot be undone."
    ]


# What the forget tools say to a model: a person never reads it from the command line.
TOOL_WORDS = ("memory_id", "call forget", "ask the user", "the first call")


def test_a_forget_by_query_says_how_to_forget_one_in_a_persons_words() -> None:
    found = ForgetReply(
        status="candidates",
        message="Found 2 memories; nothing was deleted. Ask the user which to delete, then call forget with its "
        "memory_id (twice: the first call asks for confirmation).",
        candidates=[
            ForgetCandidate(note_id="AAAAAAAA", preview="Alec is my boss", similarity=0.83),
            ForgetCandidate(note_id="BBBBBBBB", preview="Alec likes tea", similarity=0.41),
        ],
    )
    shown = render.forget(found, "alice smith").plain
    assert shown.splitlines() == [
        "Found 2 memories; nothing was deleted.",
        "  AAAAAAAA  0.83  Alec is my boss",
        "  BBBBBBBB  0.41  Alec likes tea",
        "Forget which one? Run: engram forget --user 'alice smith' ID",
    ]
    none = ForgetReply(status="candidates", message="No memory matched 'Alec'; nothing was deleted.")
    assert render.forget(none).plain == "No memory matched; nothing was deleted."
    erasing = ForgetReply(
        status="confirmation_required",
        message="Please confirm: erase ALL 3 memories of alice? Send the same request again to erase them for good.",
        pending=[PendingForget(note_id="~account", preview="ALL 3 memories of alice", request_count=1, expires_at=T1)],
    )
    asked = render.forget(erasing, "alice", erasing=True).plain
    assert asked.splitlines() == [
        "Erase ALL 3 memories of alice? Nothing is erased yet.",
        "Run the same command again before 2026-05-02 08:30:00 UTC to erase it all.",
    ]
    assert not any(word in text.lower() for text in (shown, asked) for word in TOOL_WORDS)


def test_health_is_a_readable_summary_of_whatever_the_report_holds() -> None:
    report = {
        "status": "degraded",
        "model": {"ready": True, "load_seconds": 6.5},
        "partitions": [
            {
                "partition": 0,
                "log_length": 4,
                "history": {"checkpoint": "5-0", "lag_entries": 0, "lag_ms": 0},
                "index": {"generation": 1, "model": {"name": "all-MiniLM-L6-v2", "dimension": 384}, "lag_entries": 2},
                "commands": {"group": True, "pending": 0, "dead_letters": 0},
            }
        ],
    }
    assert render.health(report).plain.splitlines() == [
        "status: degraded",
        "model: ready yes, load seconds 6.5",
        "partition 0: log length 4",
        "  history: checkpoint 5-0, lag entries 0, lag ms 0",
        "  index: generation 1, model (name all-MiniLM-L6-v2, dimension 384), lag entries 2",
        "  commands: group yes, pending 0, dead letters 0",
    ]
    assert render.health({"status": "down", "error": "connection refused"}).plain == (
        "status: down\nerror: connection refused"
    )


def test_colour_only_on_a_terminal() -> None:
    reply = NoteWritten(note_id="AAAAAAAA", version=1, token="0:5-0")
    for terminal, coloured in ((False, False), (True, True)):
        out = io.StringIO()
        Console(file=out, force_terminal=terminal, highlight=False, soft_wrap=True).print(render.saved(reply))
        assert ("\x1b[" in out.getvalue()) is coloured
        assert re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()) == "saved AAAAAAAA (version 1) token 0:5-0\n"


def test_a_bad_setting_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from engram_ledger.services.cli import main

    monkeypatch.setenv("ENGRAM_PARTITIONS", "x")
    assert main(["health", "--json"]) == 1
    out = capsys.readouterr().out
    assert json.loads(out)["error"] == {
        "code": "INVALID_PARAMETER",
        "message": "bad configuration: ENGRAM_PARTITIONS='x' is not a whole number",
    }


def test_a_memory_list_that_is_one_page_says_how_many_more() -> None:
    shown = render.memory_list([view("AAAAAAAA", "one")], total=1_001, user="ann")
    assert "… and 1,000 more (engram list --user ann --offset 1)" in shown
    assert "more" not in render.memory_list([view("AAAAAAAA", "one")], total=1)
