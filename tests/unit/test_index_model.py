"""The index projection's pure model: given events, what each note's meta becomes, what text is
embedded, and which points the embedded pieces make. No Redis, no index, no model."""

from __future__ import annotations

from engram_ledger.contracts.events import MessageRecorded, MessageRetracted, NoteForgotten, NoteUpdated
from engram_ledger.projections.index_model import NoteMeta, build_points, fold_batch
from engram_ledger.services.application.ports import LogEntry
from tests.builders import NOW, USER, saved


class Window:
    """The turns before each new one, as the projection's ``_Turns`` keeps them (in memory)."""

    def __init__(self) -> None:
        self.turns: list[str] = []
        self.retracted: list[str] = []

    def before(self, event: MessageRecorded) -> list[str]:
        earlier, self.turns = list(self.turns), [*self.turns, f"{event.speaker}: {event.content}"]
        return earlier

    def retract(self, event: MessageRetracted) -> None:
        self.retracted.append(event.note_id)

    def forget(self, user_id: str, session_id: str) -> None:
        self.turns = []


def key(user_id: str, note_id: str) -> str:
    return f"{user_id}/{note_id}"


def subject_key(user_id: str, subject: str | None) -> str | None:
    return None if subject is None else f"hash({user_id},{subject.casefold()})"


def entries(*events: object) -> list[LogEntry]:
    return [LogEntry(position=f"1-{i}", event=e) for i, e in enumerate(events)]  # type: ignore[arg-type]


def header(note_id: str, version: int) -> dict[str, object]:
    return {"event_id": f"e{version}", "note_id": note_id, "user_id": USER, "version": version, "command_id": "c"}


def test_a_save_then_an_update_of_its_subject_alone_is_embedded_once_with_the_new_name() -> None:
    metas: dict[str, NoteMeta | None] = {}
    changes = fold_batch(
        entries(
            saved("N1", "runs the Lisbon office", subject="Sarah"),
            NoteUpdated(**header("N1", 2), at=NOW, subject="Sarah Smith"),
        ),  # type: ignore[arg-type]
        metas,
        key,
        subject_key,
        Window(),
    )
    meta = metas["alice/N1"]
    assert meta is not None and meta.version == 2 and meta.subject_key == "hash(alice,sarah smith)"
    assert changes.texts == {"alice/N1": ("alice", "N1", "runs the Lisbon office")}
    assert changes.names == {"alice/N1": "Sarah Smith"}  # its text is in the batch: no read of the store
    points, counts = build_points(
        changes, metas, {"runs the Lisbon office": ["runs the Lisbon office"]}, {"runs the Lisbon office": [1.0, 0.0]}
    )
    assert counts == {"alice/N1": 1} and [p.payload["subject_key"] for p in points] == ["hash(alice,sarah smith)"]


def test_a_rename_of_a_note_indexed_before_is_read_again_from_the_store() -> None:
    metas: dict[str, NoteMeta | None] = {
        "alice/N1": NoteMeta(version=1, status="active", category="person", kind="fact", created_at=0.0, chunks=1)
    }
    changes = fold_batch(
        entries(NoteUpdated(**header("N1", 2), at=NOW, subject="Bo")), metas, key, subject_key, Window()
    )  # type: ignore[arg-type]
    assert changes.retext == {"alice/N1": ("alice", "N1")} and not changes.texts
    assert changes.old_chunks == {"alice/N1": 1} and changes.touched == {"alice/N1": ("alice", "N1")}


def test_events_at_or_below_the_indexed_version_change_nothing() -> None:
    metas: dict[str, NoteMeta | None] = {
        "alice/N1": NoteMeta(version=3, status="active", category="person", kind="fact", created_at=0.0)
    }
    changes = fold_batch(
        entries(saved("N1"), NoteUpdated(**header("N1", 3), at=NOW, content="x")), metas, key, subject_key, Window()
    )  # type: ignore[arg-type]
    assert not changes.touched and not changes.texts and metas["alice/N1"].version == 3  # type: ignore[union-attr]


def test_a_forgotten_note_leaves_nothing_to_embed_and_is_marked_for_deletion() -> None:
    metas: dict[str, NoteMeta | None] = {}
    forget = NoteForgotten(**header("N1", 2), at=NOW, request_count=0)  # type: ignore[arg-type]
    changes = fold_batch(entries(saved("N1"), forget), metas, key, subject_key, Window())
    assert changes.forgotten == {"alice/N1"} and not changes.texts and not changes.names
    meta = metas["alice/N1"]
    assert meta is not None and meta.status == "forgotten" and meta.subject_key is None
    points, _ = build_points(changes, metas, {}, {})
    assert points == []


def test_a_turn_after_others_gets_a_context_point_whose_vector_is_the_mean_of_the_window() -> None:
    def turn(note_id: str, version: int, content: str) -> MessageRecorded:
        fields = header(note_id, version) | {"session_id": "s1", "speaker": "Ann", "role": "user"}
        return MessageRecorded(**fields, at=NOW, content=content)  # type: ignore[arg-type]

    metas: dict[str, NoteMeta | None] = {}
    changes = fold_batch(
        entries(turn("T1", 1, "I got a puppy"), turn("T2", 1, "she is called Max")), metas, key, subject_key, Window()
    )
    assert changes.contexts == {"alice/T2": ["Ann: I got a puppy"]}
    first, second = "Ann: I got a puppy", "Ann: she is called Max"
    chunked = {first: [first], second: [second]}
    points, counts = build_points(changes, metas, chunked, {first: [1.0, 0.0], second: [0.0, 1.0]})
    assert counts == {"alice/T1": 1, "alice/T2": 2}
    (context,) = [p for p in points if p.payload.get("context")]
    assert context.payload["note_id"] == "T2" and context.payload["chunk"] == 1
    assert abs(context.dense[0] - context.dense[1]) < 1e-9  # the mean of the two turns, normalised
